"""EBS volumes of the spec's ``volumes:`` (docs/volumes.md): made once, found by the tag ``gtrain-volume=NAME``
(never by ``gtrain:cluster``, so neither ``down``'s teardown nor ``gtrain gc`` deletes one), in the zone of the
nodes, attached to node 0 and mounted there (a filesystem made only on a blank volume), detached and left by
``down``, deleted only by ``gtrain volume delete``. A part of :class:`gtrain.providers.aws.AWSProvider`.

- ``up`` (:meth:`AWSVolumes.prepare`, before anything is made): each volume is looked up in every region; one in
  another region, in a zone outside ``resources.zones``, in two zones, smaller than ``size_gb`` says, or attached
  to a node of another cluster is refused (exit 2). An existing volume pins the cluster's zone; else the nodes go
  where the failover puts them and the volume is made in their zone.
- :meth:`AWSVolumes.attach`: made if missing (a ``ClientToken`` from the cluster and the name: a resumed ``up``
  gets the same volume), attached to node 0 (``/dev/sdf``, ``/dev/sdg``, ...), recorded in the cluster's
  ``extra["volumes"]`` with its $/GB-month (the cost report's standing charge);
  :func:`mount_script` mounts it once node 0 answers over SSH.
- Multi-node clusters: the volume is attached to node 0 only (EBS Multi-Attach, io1/io2 read-only on every node,
  is not built); the plan says so.

Prices (:data:`EBS_USD_PER_GB_MONTH`): https://aws.amazon.com/ebs/pricing/ (us-east-1 list prices, 2025: gp3
$0.08, gp2 $0.10, io1/io2 $0.125, st1 $0.045, sc1 $0.015 per GB-month; io1/io2's provisioned IOPS are billed
on top and not counted here). Other regions scale by their gp3 price (:func:`~.pricing.ebs_rate`).
"""

from __future__ import annotations

import hashlib
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, GtrainError, ProviderError
from gtrain.providers.aws import api
from gtrain.providers.aws.api import TAG_CLUSTER, TAG_CLUSTER_NAME, TAG_OWNER
from gtrain.providers.aws.pricing import EBS_GP3_USD_PER_GB_MONTH, ebs_rate
from gtrain.providers.cloud.keys import owner
from gtrain.spec.volumes import VolumeInfo, type_of

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import Volume
    from gtrain.state import Cluster

TAG_VOLUME = "gtrain-volume"
TAG_VOLUME_CREATED = "gtrain-volume-created"

#: USD per GB-month, us-east-1 (https://aws.amazon.com/ebs/pricing/)
EBS_USD_PER_GB_MONTH = {"gp3": EBS_GP3_USD_PER_GB_MONTH, "gp2": 0.10, "io1": 0.125, "io2": 0.125, "st1": 0.045,
                        "sc1": 0.015}
#: the sizes EBS takes per type, GB
SIZES = {"gp3": (1, 16384), "gp2": (1, 16384), "io1": (4, 16384), "io2": (4, 65536), "st1": (125, 16384),
         "sc1": (125, 16384)}
IOPS = 3000  # io1/io2 need a number; gp3's baseline
DEVICES = "fghijklmnop"  # /dev/sdf .. /dev/sdp
GONE = ("deleting", "deleted", "error")


def rate(vtype: str, region: str | None) -> float:
    """$/GB-month of ``vtype`` in ``region`` (the region's gp3 price scales the us-east-1 table)."""
    return round(EBS_USD_PER_GB_MONTH.get(vtype, EBS_GP3_USD_PER_GB_MONTH) * ebs_rate(region)
                 / EBS_GP3_USD_PER_GB_MONTH, 6)


def device(index: int) -> str:
    return f"/dev/sd{DEVICES[index]}"


def check_sizes(spec: ClusterSpec) -> None:
    """Every volume of an aws spec has a size EBS takes for its type (plan: before anything is made)."""
    for i, vol in enumerate(spec.volumes or []):
        vtype = type_of(spec, vol)
        lo, hi = SIZES.get(vtype, (1, 16384))
        if vol.size_gb is None:
            raise ConfigError(f"volumes[{i}].size_gb: required for an EBS volume ({vol.name})",
                              hint=f"add size_gb: {max(lo, 100)} (GB)", field=f"volumes[{i}].size_gb")
        if not lo <= vol.size_gb <= hi:
            raise ConfigError(f"volumes[{i}].size_gb: {vol.size_gb} — an EBS {vtype} volume is {lo}..{hi} GB",
                              hint=f"give {lo}..{hi}, or another type", field=f"volumes[{i}].size_gb")
    if len(spec.volumes or []) > len(DEVICES):
        raise ConfigError(f"volumes: {len(spec.volumes or [])} volumes; a node takes at most {len(DEVICES)} here",
                          hint="merge some of them", field="volumes")


def plan_notes(spec: ClusterSpec, region: str) -> list[str]:
    vols = spec.volumes or []
    if not vols:
        return []
    what = ", ".join(f"{v.name} ({v.size_gb} GB {type_of(spec, v)} at {v.mount}, "
                     f"${rate(type_of(spec, v), region):g}/GB-month)" for v in vols)
    zone = spec.resources.zones[0] if spec.resources.zones else None
    notes = [f"volumes: EBS {what}; made once, found by tag {TAG_VOLUME}=NAME, kept by `down` (a standing charge) "
             "until `gtrain volume delete NAME`",
             f"volumes pin the cluster to {region} (no failover to other regions) and to one zone: an existing "
             "volume's zone, else " + (zone or "the first zone with capacity (the volume is made there)")]
    if spec.num_nodes > 1:
        notes.append("volumes attach to node 0 only (EBS is one instance's disk; Multi-Attach is not built)")
    return notes


def mount_script(records: list[dict[str, Any]], wait_s: int = 120) -> str:
    """bash for node 0: find each attached volume's device (NVMe by-id name from the volume id, else the
    requested name), make an ext4 filesystem only when ``blkid -p`` finds no signature on it (exit 2: blank),
    mount it (``-o ro`` when read-only) and give a fresh one to the login user. Idempotent."""
    lines = ["set -eo pipefail", 'SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo']
    for r in records:
        vid = str(r["id"])
        name, mnt, dev = str(r["name"]), str(r["mount"]), str(r["device"])
        cands = [f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{vid.replace('-', '')}", dev,
                 dev.replace("/dev/sd", "/dev/xvd")]
        q = shlex.quote
        lines += [
            f"# volume {name} ({vid}) at {mnt}",
            'dev=""',
            f"for _ in $(seq 1 {wait_s}); do",
            f"  for c in {' '.join(q(c) for c in cands)}; do",
            '    if [ -e "$c" ]; then dev=$(readlink -f "$c"); break 2; fi',
            "  done; sleep 1",
            "done",
            f'[ -n "$dev" ] || {{ echo "gtrain: volume {name} ({vid}) did not appear on this node" >&2; exit 1; }}',
            f"if mountpoint -q {q(mnt)}; then echo \"gtrain: {name} already mounted at {mnt}\"; else",
            '  rc=0; $SUDO blkid -p "$dev" >/dev/null 2>&1 || rc=$?',
            '  fresh=0',
            '  if [ "$rc" = 2 ]; then',
        ]
        if r.get("read_only"):
            lines.append(f'    echo "gtrain: volume {name} is blank and read_only: nothing to mount" >&2; exit 1')
        else:
            lines += [f'    echo "gtrain: {name} is blank: making an ext4 filesystem"',
                      f'    $SUDO mkfs.ext4 -q -L {q(("gtrain-" + name)[:16])} "$dev"; fresh=1']
        lines += [
            '  elif [ "$rc" != 0 ]; then echo "gtrain: blkid failed on $dev (exit $rc)" >&2; exit 1; fi',
            f"  $SUDO mkdir -p {q(mnt)}",
            f'  $SUDO mount {"-o ro " if r.get("read_only") else ""}"$dev" {q(mnt)}',
            f'  if [ "$fresh" = 1 ]; then $SUDO chown "$(id -u):$(id -g)" {q(mnt)}; fi',
            f'  echo "gtrain: mounted {name} at {mnt}"',
            "fi",
        ]
    return "\n".join(lines) + "\n"


class AWSVolumes:
    """Finding, making, attaching and detaching the spec's EBS volumes; ``gtrain volume`` for aws."""

    def __init__(self, clients: api.EC2Clients, ledger: Ledger, report: Reporter) -> None:
        self.clients = clients
        self.ledger = ledger
        self.store = ledger.store
        self.report = report

    # ---- finding ----

    def _describe(self, region: str, profile: str | None, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ec2 = self.clients.ec2(region, profile)
        with api.call(f"{region}: describe_volumes"):
            return [v for p in ec2.get_paginator("describe_volumes").paginate(Filters=filters)
                    for v in p["Volumes"] if v.get("State") not in GONE]

    def find(self, region: str, name: str, profile: str | None) -> dict[str, Any] | None:
        found = self._describe(region, profile, [{"Name": f"tag:{TAG_VOLUME}", "Values": [name]}])
        if len(found) > 1:
            raise ProviderError(f"{region}: {len(found)} volumes are tagged {TAG_VOLUME}={name} "
                                f"({', '.join(v['VolumeId'] for v in found)})",
                                hint="delete or re-tag all but one in the EC2 console")
        return found[0] if found else None

    def find_anywhere(self, name: str, regions: list[str], profile: str | None) -> list[tuple[str, dict[str, Any]]]:
        """The volume in each of ``regions``; a region other than the first that cannot be read is a warning."""
        def one(r: str) -> tuple[str, dict[str, Any] | None]:
            try:
                return r, self.find(r, name, profile)
            except GtrainError as e:  # an opt-in region, a narrower IAM policy: say so, look on
                if r == regions[0]:
                    raise
                self.report.warn(f"could not look for volume {name} in {r}: {e.message}")
                return r, None

        with ThreadPoolExecutor(max_workers=max(1, min(8, len(regions)))) as pool:
            return [(r, v) for r, v in pool.map(one, regions) if v is not None]

    def list_all(self, regions: list[str], profile: str | None) -> list[VolumeInfo]:
        def one(r: str) -> list[VolumeInfo]:
            vols = self._describe(r, profile, [{"Name": "tag-key", "Values": [TAG_VOLUME]}])
            return [self.info(r, v, profile) for v in vols]

        with ThreadPoolExecutor(max_workers=max(1, min(8, len(regions)))) as pool:
            out = [i for infos in pool.map(one, regions) for i in infos]
        return sorted(out, key=lambda i: (i.name, i.region or ""))

    def holder(self, region: str, vol: dict[str, Any], profile: str | None) -> tuple[str, str, str] | None:
        """(instance id, cluster id, cluster name) of the instance the volume is attached to."""
        att = next((a for a in vol.get("Attachments") or [] if a.get("State") in ("attaching", "attached")), None)
        if att is None:
            return None
        iid = str(att["InstanceId"])
        with api.call(f"{region}: describe_instances"):
            res = self.clients.ec2(region, profile).describe_instances(InstanceIds=[iid])["Reservations"]
        inst: dict[str, Any] = next((i for r in res for i in r["Instances"]), {})
        if (inst.get("State") or {}).get("Name") == "terminated":
            return None
        tags = api.tagdict(inst)
        return iid, tags.get(TAG_CLUSTER, ""), tags.get(TAG_CLUSTER_NAME, "") or iid

    def info(self, region: str, vol: dict[str, Any], profile: str | None) -> VolumeInfo:
        tags = api.tagdict(vol)
        held = self.holder(region, vol, profile)
        vtype = str(vol.get("VolumeType") or "gp3")
        return VolumeInfo(name=tags.get(TAG_VOLUME, "?"), provider="aws", type=vtype, size_gb=int(vol["Size"]),
                          region=region, zone=vol.get("AvailabilityZone"), id=vol["VolumeId"],
                          state=str(vol.get("State")), attached_to=held[2] if held else None,
                          usd_per_gb_month=rate(vtype, region), created=tags.get(TAG_VOLUME_CREATED),
                          extra={"owner": tags.get(TAG_OWNER)})

    # ---- up ----

    def prepare(self, spec: ClusterSpec, cluster: Cluster, region: str, regions: list[str],
                profile: str | None) -> str | None:
        """Before anything is made: refuse what cannot be attached here; the zone existing volumes pin."""
        zone: tuple[str, str] | None = None  # (zone, the volume that pins it)
        zones = spec.resources.zones
        for i, vol in enumerate(spec.volumes or []):
            found = self.find_anywhere(vol.name, [region, *[r for r in regions if r != region]], profile)
            here = [v for r, v in found if r == region]
            if not here and found:
                r, v = found[0]
                raise ConfigError(
                    f"volumes[{i}].name: volume {vol.name} ({v['VolumeId']}) is in {v['AvailabilityZone']}, the "
                    f"cluster goes to {region}: an EBS volume attaches only in its own zone",
                    hint=f"set resources.region: {r} (and resources.zones: [{v['AvailabilityZone']}]), or "
                         f"`gtrain volume delete {vol.name}` to start afresh", field=f"volumes[{i}].name")
            if not here:
                continue
            v = here[0]
            az = str(v["AvailabilityZone"])
            if zones and az not in zones:
                raise ConfigError(f"volumes[{i}].name: volume {vol.name} ({v['VolumeId']}) is in {az}, not in "
                                  f"resources.zones ({', '.join(zones)})",
                                  hint=f"add {az} to resources.zones (EBS attaches in its own zone only)",
                                  field=f"volumes[{i}].name")
            if zone is not None and zone[0] != az:
                raise ConfigError(f"volumes[{i}].name: volume {vol.name} is in {az} and volume {zone[1]} in "
                                  f"{zone[0]}: one node cannot attach both",
                                  hint="keep the volumes of one cluster in one zone", field=f"volumes[{i}].name")
            zone = (az, vol.name)
            size = int(v["Size"])
            if vol.size_gb is not None and vol.size_gb < size:
                raise ConfigError(f"volumes[{i}].size_gb: {vol.size_gb} is below volume {vol.name}'s {size} GB "
                                  "(EBS volumes do not shrink)", hint=f"set size_gb: {size}",
                                  field=f"volumes[{i}].size_gb")
            if vol.size_gb is not None and vol.size_gb > size:
                self.report.warn(f"volume {vol.name} is {size} GB; size_gb {vol.size_gb} is larger: gtrain does not "
                                 "grow volumes (yet), it is attached as it is")
            if (want := type_of(spec, vol)) != v.get("VolumeType"):
                self.report.warn(f"volume {vol.name} is {v.get('VolumeType')}, the spec says {want}: attached as it is")
            held = self.holder(region, v, profile)
            if held is not None and held[1] != cluster.id:
                raise ConfigError(f"volumes[{i}].name: volume {vol.name} ({v['VolumeId']}) is attached to cluster "
                                  f"{held[2]} ({held[0]}); an EBS volume is one node's disk",
                                  hint=f"`gtrain down {held[2]}` first (the volume stays), or use another volume "
                                       "name", field=f"volumes[{i}].name")
        return zone[0] if zone else None

    def attach(self, spec: ClusterSpec, cluster: Cluster, region: str, zone: str, instance_id: str,
               profile: str | None, poll_s: float) -> list[dict[str, Any]]:
        """Make what is missing (in ``zone``), attach each volume to ``instance_id``; the records kept with the
        cluster."""
        ec2 = self.clients.ec2(region, profile)
        records: list[dict[str, Any]] = []
        for i, vol in enumerate(spec.volumes or []):
            v = self.find(region, vol.name, profile) or self._create(spec, vol, cluster.id, region, zone, profile)
            v = self._wait(region, v["VolumeId"], profile, poll_s, lambda x: x.get("State") != "creating")
            if v.get("State") == "error":
                raise ProviderError(f"{region}: volume {vol.name} ({v['VolumeId']}) is in state error")
            attached = [a for a in v.get("Attachments") or [] if a.get("State") in ("attaching", "attached")]
            dev = device(i)
            if any(a["InstanceId"] == instance_id for a in attached):
                dev = next(a.get("Device") or dev for a in attached if a["InstanceId"] == instance_id)
            else:
                self.report.info(f"attaching volume {vol.name} ({v['VolumeId']}) to node 0 as {dev}")
                try:
                    with api.call(f"{region}: attach_volume {v['VolumeId']}"):
                        ec2.attach_volume(Device=dev, InstanceId=instance_id, VolumeId=v["VolumeId"])
                except ProviderError as e:
                    if api.error_code(e) == "VolumeInUse":
                        raise ConfigError(f"volumes[{i}].name: volume {vol.name} was attached elsewhere meanwhile "
                                          f"({e.message})", hint="`gtrain volume ls` shows who holds it",
                                          field=f"volumes[{i}].name") from None
                    raise
                self._wait(region, v["VolumeId"], profile, poll_s, lambda x: any(
                    a.get("State") == "attached" and a.get("InstanceId") == instance_id
                    for a in x.get("Attachments") or []))
            vtype = str(v.get("VolumeType") or type_of(spec, vol))
            records.append({"name": vol.name, "id": v["VolumeId"], "region": region, "zone": v["AvailabilityZone"],
                            "size_gb": int(v["Size"]), "type": vtype, "mount": vol.mount,
                            "read_only": vol.read_only, "device": dev, "node": 0, "instance_id": instance_id,
                            "usd_per_gb_month": rate(vtype, region)})
        with self.ledger.lock:
            fresh = self.store.get_cluster_by_id(cluster.id)
            self.store.update_cluster(cluster.id, extra={**fresh.extra, "volumes": records})
        return records

    def _create(self, spec: ClusterSpec | None, vol: Volume, token_seed: str, region: str, zone: str,
                profile: str | None) -> dict[str, Any]:
        vtype = type_of(spec, vol) if spec is not None else (vol.type or "gp3")
        ec2 = self.clients.ec2(region, profile)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tags = {TAG_VOLUME: vol.name, TAG_OWNER: owner(), TAG_VOLUME_CREATED: created, "Name": f"gtrain-{vol.name}"}
        params: dict[str, Any] = dict(
            AvailabilityZone=zone, Size=int(vol.size_gb or 0), VolumeType=vtype, Encrypted=True,
            ClientToken=hashlib.sha256(f"{token_seed}/{vol.name}".encode()).hexdigest()[:64],
            TagSpecifications=[{"ResourceType": "volume", "Tags": api.tags(tags)}])
        if vtype in ("io1", "io2"):
            params["Iops"] = IOPS
        self.report.info(f"{zone}: creating volume {vol.name} ({vol.size_gb} GB {vtype})")
        with api.call(f"{region}: create_volume {vol.name}"):
            return dict(ec2.create_volume(**params))

    def _wait(self, region: str, vid: str, profile: str | None, poll_s: float, done: Any,
              timeout: float = 300.0) -> dict[str, Any]:
        ec2 = self.clients.ec2(region, profile)
        deadline = time.monotonic() + timeout
        while True:
            with api.call(f"{region}: describe_volumes {vid}"):
                v = dict(ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0])
            if done(v):
                return v
            if time.monotonic() > deadline:
                raise ProviderError(f"{region}: volume {vid} still {v.get('State')} after {timeout:.0f}s")
            time.sleep(min(poll_s, 2.0))

    # ---- down ----

    def release(self, cluster: Cluster, profile: str | None, poll_s: float) -> list[VolumeInfo]:
        """Detach the cluster's volumes from its (terminated) nodes; each is left, and returned with its
        standing charge."""
        out: list[VolumeInfo] = []
        fresh = self.store.get_cluster_by_id(cluster.id)  # a rollback's record may predate the attach
        for r in (fresh or cluster).extra.get("volumes") or []:
            region, vid = str(r["region"]), str(r["id"])
            ec2 = self.clients.ec2(region, profile)
            try:
                with api.call(f"{region}: describe_volumes {vid}"):
                    v = dict(ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0])
            except ProviderError as e:
                if api.is_not_found(e):
                    continue
                raise
            mine = [a for a in v.get("Attachments") or []
                    if a.get("InstanceId") == r.get("instance_id") and a.get("State") in ("attaching", "attached")]
            if mine:
                self.report.info(f"detaching volume {r['name']} ({vid}); it stays")
                with api.call(f"{region}: detach_volume {vid}"):
                    ec2.detach_volume(VolumeId=vid, InstanceId=str(r["instance_id"]))
                iid = r.get("instance_id")
                v = self._wait(region, vid, profile, poll_s, lambda x, iid=iid: not any(
                    a.get("InstanceId") == iid for a in x.get("Attachments") or []))
            out.append(self.info(region, v, profile))
        return out

    # ---- gtrain volume ----

    def create(self, spec: ClusterSpec, vol: Volume, region: str, zone: str | None,
               profile: str | None) -> VolumeInfo:
        check_sizes(spec)
        regions = list(dict.fromkeys([region, *spec.resources.region_list()]))
        found = self.find_anywhere(vol.name, regions, profile)
        if found:
            r, v = found[0]
            self.report.info(f"volume {vol.name} is there already ({v['VolumeId']}, {r})")
            return self.info(r, v, profile)
        if zone is None:
            with api.call(f"{region}: describe_availability_zones"):
                azs = self.clients.ec2(region, profile).describe_availability_zones(
                    Filters=[{"Name": "state", "Values": ["available"]}])["AvailabilityZones"]
            zone = sorted(z["ZoneName"] for z in azs)[0]
        v = self._create(spec, vol, f"create/{time.time_ns()}", region, zone, profile)
        v = self._wait(region, v["VolumeId"], profile, 1.0, lambda x: x.get("State") != "creating")
        return self.info(region, v, profile)

    def delete(self, name: str, regions: list[str], profile: str | None) -> VolumeInfo | None:
        found = self.find_anywhere(name, regions, profile)
        if not found:
            return None
        r, v = found[0]
        info = self.info(r, v, profile)
        if info.attached_to:
            raise ConfigError(f"volume {name} ({info.id}) is attached to cluster {info.attached_to}",
                              hint=f"`gtrain down {info.attached_to}` first (it detaches the volume)", field="NAME")
        with api.call(f"{r}: delete_volume {info.id}"):
            self.clients.ec2(r, profile).delete_volume(VolumeId=info.id)
        info.state = "deleted"
        return info
