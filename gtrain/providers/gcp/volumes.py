"""Compute Engine persistent disks for the spec's ``volumes:`` (docs/volumes.md): made once, found by the label
``gtrain-volume=NAME`` (never ``gtrain-cluster``, so neither ``down``'s teardown nor ``gtrain gc`` takes one), in
the zone of the nodes, attached and mounted, left by ``down``, deleted only by ``gtrain volume delete``. A part of
:class:`gtrain.providers.gcp.provider.GCPProvider`.

- ``up`` (:meth:`GCPVolumes.prepare`, before anything is made): each volume is looked up in the whole project
  (``disks.aggregatedList``); one in another region, in a zone outside ``resources.zones``, two in two zones, one
  smaller than ``size_gb`` says, or one attached to a node of another live cluster is refused (exit 2). An existing
  disk pins the cluster's zone.
- :meth:`GCPVolumes.attach`: made if missing (``disks.insert`` with a ``requestId`` from the cluster and the name:
  a resumed ``up`` gets the same disk), grown when ``size_gb`` is larger (``disks.resize``; the filesystem is grown
  by the mount), attached (``instances.attachDisk``, ``autoDelete: false``, device name ``gtrain-NAME``: on the node
  ``/dev/disk/by-id/google-gtrain-NAME``) to node 0, READ_WRITE; a ``read_only`` volume is attached READ_ONLY to
  every node (a persistent disk may be attached read-only to many instances at once, and then to none read-write).
  Recorded in the cluster's ``extra["volumes"]`` with its $/GB-month (the cost report's standing charge).
- ``down``: deleting an instance detaches its ``autoDelete: false`` disks and keeps them; :meth:`GCPVolumes.release`
  detaches what is still attached (an instance that outlived the teardown) and returns each disk with its charge.

REST reference: https://cloud.google.com/compute/docs/reference/rest/v1/disks (insert, get, aggregatedList, resize,
delete), https://cloud.google.com/compute/docs/reference/rest/v1/instances/attachDisk and .../detachDisk; sharing a
disk read-only: https://cloud.google.com/compute/docs/disks/sharing-disks-between-vms; device names:
https://cloud.google.com/compute/docs/disks/format-mount-disk-linux. Prices (:data:`PD_USD_PER_GB_MONTH`):
https://cloud.google.com/compute/disks-image-pricing (us-central1 list prices, 2025: pd-standard $0.04,
pd-balanced $0.10, pd-ssd $0.17 per GB-month; other regions are priced the same here).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, ProviderError
from gtrain.providers.cloud.keys import owner
from gtrain.providers.gcp import api
from gtrain.providers.gcp.api import LABEL_CLUSTER, LABEL_CLUSTER_NAME, LABEL_OWNER, gce
from gtrain.spec.volumes import VolumeInfo, type_of

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import Volume
    from gtrain.state import Cluster

LABEL_VOLUME = "gtrain-volume"
LABEL_VOLUME_CREATED = "gtrain-volume-created"

#: persistent disk, USD per GB-month (us-central1 list prices, 2025: https://cloud.google.com/compute/disks-image-pricing)
PD_USD_PER_GB_MONTH = {"pd-balanced": 0.10, "pd-ssd": 0.17, "pd-standard": 0.04}
#: the sizes a zonal persistent disk takes, GB (https://cloud.google.com/compute/docs/disks#pdspecs)
SIZES = (10, 65536)
GONE = ("DELETING", "FAILED")


def disk_name(volume: str) -> str:
    return f"gtrain-{volume}"


def device_name(volume: str) -> str:
    return f"gtrain-{volume}"


def rate(vtype: str) -> float:
    return PD_USD_PER_GB_MONTH.get(vtype, PD_USD_PER_GB_MONTH["pd-balanced"])


def check_volumes(spec: ClusterSpec) -> None:
    """Every volume of a gcp spec has a size a persistent disk takes, and the nodes are VMs (plan: before anything
    is made)."""
    if not spec.volumes:
        return
    if spec.resources.tpu:
        raise ConfigError("volumes: a TPU slice does not take gtrain's volumes yet (persistent disks attach to GPU "
                          "VMs here)", hint="drop volumes, or use the object store", field="volumes")
    lo, hi = SIZES
    for i, vol in enumerate(spec.volumes or []):
        if vol.size_gb is None:
            raise ConfigError(f"volumes[{i}].size_gb: required for a persistent disk ({vol.name})",
                              hint="add size_gb: 100 (GB)", field=f"volumes[{i}].size_gb")
        if not lo <= vol.size_gb <= hi:
            raise ConfigError(f"volumes[{i}].size_gb: {vol.size_gb} — a persistent disk is {lo}..{hi} GB",
                              hint=f"give {lo}..{hi}", field=f"volumes[{i}].size_gb")


def plan_notes(spec: ClusterSpec, region: str) -> list[str]:
    vols = spec.volumes or []
    if not vols:
        return []
    what = ", ".join(f"{v.name} ({v.size_gb} GB {type_of(spec, v)} at {v.mount}, ${rate(type_of(spec, v)):g}/GB-month)"
                     for v in vols)
    zone = spec.resources.zones[0] if spec.resources.zones else None
    notes = [f"volumes: persistent disks {what}; made once, found by label {LABEL_VOLUME}=NAME, kept by `down` "
             "(a standing charge) until `gtrain volume delete NAME`",
             f"volumes pin the cluster to {region} (no failover to other regions) and to one zone: an existing "
             "disk's zone, else " + (zone or "the first zone with capacity (the disk is made there)")]
    if spec.num_nodes > 1 and any(not v.read_only for v in vols):
        notes.append("read-write volumes attach to node 0 only (a persistent disk is one instance's, read-write); "
                     "read_only ones attach to every node, READ_ONLY")
    return notes


def _zone_of(d: Any) -> str:
    return api.zone_of(str(d.zone))


def _type_of(d: Any) -> str:
    return str(d.type_).rstrip("/").rsplit("/", 1)[-1] or "pd-standard"


def _within(d: Any, regions: list[str] | None) -> bool:
    """The disk is in one of ``regions`` (regions or zones: ``gtrain gc --provider gcp`` scopes by zone)."""
    return regions is None or _zone_of(d) in regions or api.region_of_zone(_zone_of(d)) in regions


def _path(link: str) -> str:
    """``projects/P/zones/Z/...`` of a self link (endpoints differ; the path does not)."""
    i = link.find("projects/")
    return link[i:] if i >= 0 else link


class GCPVolumes:
    """Finding, making, attaching and detaching the spec's persistent disks; ``gtrain volume`` for gcp."""

    def __init__(self, compute: api.Compute, ledger: Ledger, report: Reporter) -> None:
        self.compute = compute
        self.ledger = ledger
        self.store = ledger.store
        self.report = report

    # ---- finding ----

    def _list(self, project: str, flt: str) -> list[Any]:
        from google.cloud import compute_v1

        out: list[Any] = []
        with gce("disks.aggregatedList"):
            for _, scoped in self.compute.disks.aggregated_list(
                    request=compute_v1.AggregatedListDisksRequest(project=project, filter=flt)):
                out.extend(d for d in scoped.disks if LABEL_VOLUME in d.labels and d.status not in GONE)
        return out

    def find(self, project: str, name: str) -> list[Any]:
        """Every disk of the project labelled ``gtrain-volume=name`` (all zones)."""
        return [d for d in self._list(project, f'labels.{LABEL_VOLUME} = "{name}"') if d.labels[LABEL_VOLUME] == name]

    def find_one(self, project: str, name: str) -> Any | None:
        found = self.find(project, name)
        if len(found) > 1:
            raise ProviderError(f"{len(found)} disks are labelled {LABEL_VOLUME}={name} ("
                                + ", ".join(f"{_zone_of(d)}/{d.name}" for d in found) + ")",
                                hint="delete or relabel all but one (gcloud compute disks list)")
        return found[0] if found else None

    def get(self, project: str, zone: str, name: str) -> Any:
        with gce(f"disks.get {name}"):
            return self.compute.disks.get(project=project, zone=zone, disk=name)

    def holders(self, project: str, d: Any) -> list[tuple[str, str, str, str]]:
        """(instance, cluster id, cluster name, mode) of every live instance the disk is attached to."""
        out = []
        for link in d.users:
            parts = _path(str(link)).split("/")  # projects/P/zones/Z/instances/NAME
            zone, name = parts[3], parts[5]
            inst = self.compute.instance(project, zone, name)
            if inst is None:
                continue
            mode = next((str(a.mode) for a in inst.disks if _path(str(a.source)) == _path(str(d.self_link))),
                        "READ_WRITE")
            out.append((name, inst.labels.get(LABEL_CLUSTER, ""), inst.labels.get(LABEL_CLUSTER_NAME, "") or name,
                        mode))
        return out

    def info(self, project: str, d: Any) -> VolumeInfo:
        held = self.holders(project, d)
        vtype = _type_of(d)
        created = d.labels.get(LABEL_VOLUME_CREATED)
        return VolumeInfo(
            name=d.labels.get(LABEL_VOLUME, "?"), provider="gcp", type=vtype, size_gb=int(d.size_gb),
            region=api.region_of_zone(_zone_of(d)), zone=_zone_of(d), id=str(d.name),
            state="in-use" if held else str(d.status).lower() if d.status != "READY" else "available",
            attached_to=", ".join(dict.fromkeys(h[2] for h in held)) or None, usd_per_gb_month=rate(vtype),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(created))) if created and created.isdigit()
            else None, extra={"owner": d.labels.get(LABEL_OWNER), "project": project})

    def list_all(self, project: str, regions: list[str] | None) -> list[VolumeInfo]:
        out = [self.info(project, d) for d in self._list(project, f"labels.{LABEL_VOLUME}:*") if _within(d, regions)]
        return sorted(out, key=lambda i: (i.name, i.zone or ""))

    # ---- up ----

    def prepare(self, spec: ClusterSpec, cluster: Cluster, project: str, region: str) -> list[str] | None:
        """Before anything is made: refuse what cannot be attached here; the zone existing disks pin ([zone])."""
        pinned: tuple[str, str] | None = None  # (zone, the volume that pins it)
        zones = spec.resources.zones
        for i, vol in enumerate(spec.volumes or []):
            fld = f"volumes[{i}].name"
            d = self.find_one(project, vol.name)
            if d is None:
                continue
            zone = _zone_of(d)
            if api.region_of_zone(zone) != region:
                raise ConfigError(f"{fld}: volume {vol.name} (disk {d.name}) is in {zone}, the cluster goes to "
                                  f"{region}: a persistent disk attaches only in its own zone",
                                  hint=f"set resources.region: {api.region_of_zone(zone)} (and resources.zones: "
                                       f"[{zone}]), or `gtrain volume delete {vol.name} --provider gcp` to start "
                                       "afresh", field=fld)
            if zones and zone not in zones:
                raise ConfigError(f"{fld}: volume {vol.name} (disk {d.name}) is in {zone}, not in resources.zones "
                                  f"({', '.join(zones)})", hint=f"add {zone} to resources.zones (a persistent disk "
                                                                 "attaches in its own zone only)", field=fld)
            if pinned is not None and pinned[0] != zone:
                raise ConfigError(f"{fld}: volume {vol.name} is in {zone} and volume {pinned[1]} in {pinned[0]}: "
                                  "one node cannot attach both", hint="keep the volumes of one cluster in one zone",
                                  field=fld)
            pinned = (zone, vol.name)
            size = int(d.size_gb)
            if vol.size_gb is not None and vol.size_gb < size:
                raise ConfigError(f"volumes[{i}].size_gb: {vol.size_gb} is below volume {vol.name}'s {size} GB "
                                  "(a persistent disk does not shrink)", hint=f"set size_gb: {size}",
                                  field=f"volumes[{i}].size_gb")
            if (want := type_of(spec, vol)) != _type_of(d):
                self.report.warn(f"volume {vol.name} is {_type_of(d)}, the spec says {want}: attached as it is")
            for inst, cid, cname, mode in self.holders(project, d):
                if cid == cluster.id:
                    continue
                if vol.read_only and mode == "READ_ONLY":
                    continue  # shared read-only: GCE attaches it read-only to more instances
                how = "read-only" if mode == "READ_ONLY" else "read-write"
                raise ConfigError(
                    f"{fld}: volume {vol.name} (disk {d.name}) is attached {how} to cluster {cname} ({inst})"
                    + ("; a read-write volume is one node's disk" if not vol.read_only else
                       "; it is shared read-only only while nobody writes it"),
                    hint=f"`gtrain down {cname}` first (the volume stays), "
                         + ("or set read_only: true on both clusters" if mode == "READ_ONLY" else
                            "or use another volume name"), field=fld)
        if pinned is None:
            return None
        self.report.info(f"volumes: the nodes go to {pinned[0]}, where the volumes are")
        return [pinned[0]]

    def attach(self, spec: ClusterSpec, cluster: Cluster, project: str, zone: str,
               instances: dict[int, str]) -> list[dict[str, Any]]:
        """Make what is missing (in ``zone``), grow what is smaller than ``size_gb``, attach each volume to node
        0 (a read-only one to every node); the records kept with the cluster."""
        records: list[dict[str, Any]] = []
        for i, vol in enumerate(spec.volumes or []):
            d = self.find_one(project, vol.name) or self._create(spec, vol, cluster.id, project, zone)
            grown = False
            if vol.size_gb is not None and vol.size_gb > int(d.size_gb):
                self._resize(project, zone, d, vol.size_gb)
                d, grown = self.get(project, zone, str(d.name)), True
            ranks = sorted(instances) if vol.read_only else [min(instances)]
            mode = "READ_ONLY" if vol.read_only else "READ_WRITE"
            for rank in ranks:
                self._attach_one(i, vol, project, zone, d, instances[rank], mode)
            vtype = _type_of(d)
            records.append({"name": vol.name, "id": str(d.name), "region": api.region_of_zone(zone), "zone": zone,
                            "size_gb": int(d.size_gb), "type": vtype, "mount": vol.mount, "read_only": vol.read_only,
                            "device": f"/dev/disk/by-id/google-{device_name(vol.name)}", "nodes": ranks,
                            "instances": [instances[r] for r in ranks], "grow": grown, "project": project,
                            "usd_per_gb_month": rate(vtype)})
        with self.ledger.lock:
            fresh = self.store.get_cluster_by_id(cluster.id)
            self.store.update_cluster(cluster.id, extra={**fresh.extra, "volumes": records})
        return records

    def _attach_one(self, i: int, vol: Volume, project: str, zone: str, d: Any, instance: str, mode: str) -> None:
        from google.cloud import compute_v1

        inst = self.compute.instance(project, zone, instance)
        if inst is not None and any(_path(str(a.source)) == _path(str(d.self_link)) for a in inst.disks):
            return  # a resumed `up`: attached already
        self.report.info(f"attaching volume {vol.name} ({d.name}) to {instance}" + (" read-only" if
                                                                                 mode == "READ_ONLY" else ""))
        what = f"instances.attachDisk {d.name} to {instance}"
        try:
            with gce(what):
                op = self.compute.clients.instances.attach_disk(
                    project=project, zone=zone, instance=instance,
                    attached_disk_resource=compute_v1.AttachedDisk(
                        source=str(d.self_link), device_name=device_name(vol.name), mode=mode, auto_delete=False,
                        type_="PERSISTENT"))
            api.wait_zone_op(self.compute.clients, project, zone, op.name, what)
        except ProviderError as e:
            if api.code(e) in ("RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "resourceInUseByAnotherResource"):
                raise ConfigError(f"volumes[{i}].name: volume {vol.name} was attached elsewhere meanwhile "
                                  f"({e.message})", hint="`gtrain volume ls --provider gcp` shows who holds it",
                                  field=f"volumes[{i}].name") from None
            raise

    def _create(self, spec: ClusterSpec | None, vol: Volume, seed: str, project: str, zone: str) -> Any:
        from google.cloud import compute_v1

        vtype = type_of(spec, vol) if spec is not None else (vol.type or "pd-balanced")
        name = disk_name(vol.name)
        labels = {LABEL_VOLUME: vol.name, LABEL_OWNER: api.label_value(owner()),
                  LABEL_VOLUME_CREATED: str(int(time.time()))}
        body = compute_v1.Disk(name=name, size_gb=int(vol.size_gb or 0), type_=f"zones/{zone}/diskTypes/{vtype}",
                               labels=labels, description=f"gtrain volume {vol.name}")
        what = f"disks.insert {name} ({vol.size_gb} GB {vtype}, {zone})"
        self.report.info(f"{zone}: creating volume {vol.name} ({vol.size_gb} GB {vtype})")
        try:
            with gce(what):
                op = self.compute.disks.insert(request=compute_v1.InsertDiskRequest(
                    project=project, zone=zone, disk_resource=body,
                    request_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"gtrain/{seed}/{vol.name}"))))
            api.wait_zone_op(self.compute.clients, project, zone, op.name, what)
        except ProviderError as e:
            if api.code(e) != "alreadyExists":
                raise
        d = self.get(project, zone, name)
        if d.labels.get(LABEL_VOLUME) != vol.name:  # a disk of that name that is not this volume: never taken over
            raise ConfigError(f"volumes: a disk named {name} exists in {zone} and is not labelled "
                              f"{LABEL_VOLUME}={vol.name}", hint=f"rename or delete that disk, or label it "
                              f"{LABEL_VOLUME}={vol.name} to make it the volume", field="volumes")
        return d

    def _resize(self, project: str, zone: str, d: Any, size_gb: int) -> None:
        from google.cloud import compute_v1

        what = f"disks.resize {d.name} {d.size_gb} -> {size_gb} GB"
        self.report.info(f"growing volume {d.labels.get(LABEL_VOLUME)} from {d.size_gb} to {size_gb} GB")
        with gce(what):
            op = self.compute.disks.resize(project=project, zone=zone, disk=str(d.name),
                                           disks_resize_request_resource=compute_v1.DisksResizeRequest(size_gb=size_gb))
        api.wait_zone_op(self.compute.clients, project, zone, op.name, what)

    def mount(self, runners: Callable[[], list[Runner]], vols: list[dict[str, Any]], reachable: bool) -> None:
        """Mount each attached disk on its nodes, once they answer over SSH (``/dev/disk/by-id/google-<device
        name>``, else the by-id link older images' udev rules make)."""
        from gtrain.providers.cloud.volumes import mount_script

        if vols and not reachable:
            self.report.warn("volumes attached but not mounted: gcp.wait_ssh is false (`gtrain exec` can run the "
                             "mount later; docs/volumes.md)")
            return
        nodes = runners() if vols else []
        for rank in sorted({r for v in vols for r in v["nodes"]}):
            mine = [{**v, "candidates": [v["device"], "/dev/disk/by-id/scsi-0Google_PersistentDisk_"
                                         + device_name(str(v["name"]))]} for v in vols if rank in v["nodes"]]
            nodes[rank].run(mount_script(mine), timeout=300)

    # ---- down ----

    def release(self, cluster: Cluster, project: str) -> list[VolumeInfo]:
        """Detach the cluster's volumes from what is left of its nodes (deleting an instance detaches them); each
        is kept, said with its standing charge, and returned."""
        out: list[VolumeInfo] = []
        fresh = self.store.get_cluster_by_id(cluster.id)  # a rollback's record may predate the attach
        for r in (fresh or cluster).extra.get("volumes") or []:
            zone, name = str(r["zone"]), str(r["id"])
            try:
                d = self.get(project, zone, name)
            except ProviderError as e:
                if api.is_not_found(e):
                    continue
                raise
            mine = set(r.get("instances") or [])
            for link in list(d.users):
                inst = _path(str(link)).rsplit("/", 1)[-1]
                if inst in mine and self.compute.instance(project, zone, inst) is not None:
                    self.report.info(f"detaching volume {r['name']} ({name}) from {inst}; it stays")
                    what = f"instances.detachDisk {name} from {inst}"
                    with gce(what):
                        op = self.compute.clients.instances.detach_disk(
                            project=project, zone=zone, instance=inst, device_name=device_name(str(r["name"])))
                    api.wait_zone_op(self.compute.clients, project, zone, op.name, what)
                    d = self.get(project, zone, name)
            v = self.info(project, d)
            self.report.info(f"volume {v.name} ({v.id}) is kept: {v.size_gb} GB at ${v.usd_per_gb_month:g}/GB-month "
                             f"(${v.usd_per_month:g}/month) until `gtrain volume delete {v.name}`")
            out.append(v)
        return out

    # ---- gtrain volume ----

    def create(self, spec: ClusterSpec, vol: Volume, project: str, region: str, zone: str | None) -> VolumeInfo:
        check_volumes(spec)
        d = self.find_one(project, vol.name)
        if d is not None:
            self.report.info(f"volume {vol.name} is there already ({d.name}, {_zone_of(d)})")
            return self.info(project, d)
        zone = zone or f"{region}-a"
        return self.info(project, self._create(spec, vol, f"create/{time.time_ns()}", project, zone))

    def delete(self, name: str, project: str, regions: list[str] | None) -> VolumeInfo | None:
        found = [d for d in self.find(project, name) if _within(d, regions)]
        if not found:
            return None
        d = found[0]
        info = self.info(project, d)
        if info.attached_to:
            raise ConfigError(f"volume {name} ({d.name}) is attached to cluster {info.attached_to}",
                              hint=f"`gtrain down {info.attached_to}` first (it detaches the volume)", field="NAME")
        what = f"disks.delete {d.name}"
        with gce(what):
            op = self.compute.disks.delete(project=project, zone=_zone_of(d), disk=str(d.name))
        api.wait_zone_op(self.compute.clients, project, _zone_of(d), op.name, what)
        info.state = "deleted"
        return info
