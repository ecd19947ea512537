"""Azure managed disks for the spec's ``volumes:`` (docs/volumes.md): made once, found by the tag
``gtrain-volume=NAME``, kept in a resource group of their own per region (``gtrain-volumes-<region>``, never a
cluster's: ``down`` deletes the cluster's group whole, and ``gtrain gc`` takes groups tagged ``gtrain-cluster``),
attached to node 0 and mounted there, detached and left by ``down``, deleted only by ``gtrain volume delete``. A part
of :class:`gtrain.providers.azure.provider.AzureProvider`.

- ``up`` (:meth:`AzureVolumes.prepare`, before anything is made): each volume is looked up in the subscription
  (Disks - List); one in another region, a zonal one (gtrain's Azure VMs are regional), one smaller than
  ``size_gb`` says, or one attached to a VM of another live cluster is refused (exit 2).
- :meth:`AzureVolumes.attach`: made if missing (Disks - Create Or Update, ``createOption: Empty``), grown when
  ``size_gb`` is larger (Disks - Update, while it is unattached: Azure resizes no disk attached to a running VM),
  attached to node 0 through the VM's ``storageProfile.dataDisks`` (Virtual Machines - Update: ``createOption:
  Attach``, ``deleteOption: Detach``, the first free LUN; on the node ``/dev/disk/azure/scsi1/lun<N>``), recorded
  in the cluster's ``extra["volumes"]`` with its $/GB-month (the cost report's standing charge).
- ``down``: deleting the cluster's resource group deletes its VMs, which detaches their ``deleteOption: Detach``
  data disks and keeps them; :meth:`AzureVolumes.release` detaches what is still attached and returns each disk
  with its charge.

REST reference: https://learn.microsoft.com/rest/api/compute/disks (Create Or Update, Get, List, Update, Delete;
api-version 2024-03-02, the disk resource provider's, not the VMs' 2024-07-01),
https://learn.microsoft.com/rest/api/compute/virtual-machines/update (``dataDisks``); LUN paths on the node:
https://learn.microsoft.com/azure/virtual-machines/linux/attach-disk-portal. Not built: Premium SSD v2
(``PremiumV2_LRS``, zonal only) and shared disks (``maxShares``).

Prices (:data:`DISK_USD_PER_GB_MONTH`): https://azure.microsoft.com/pricing/details/managed-disks/ (East US,
pay-as-you-go, 2025): the 128 GiB tier's monthly price per GiB (P10 $19.71, E10 $9.60, S10 $5.89 -> $0.15,
$0.075, $0.045 per GB-month). Azure bills a disk by its tier (its size rounded up to the next tier), so the
standing charge gtrain shows is an estimate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, GtrainError, ProviderError
from gtrain.providers.azure import api
from gtrain.providers.azure.api import TAG_CLUSTER, TAG_CLUSTER_NAME, TAG_OWNER, V_COMPUTE
from gtrain.providers.cloud.errors import code_of
from gtrain.providers.cloud.keys import owner
from gtrain.spec.volumes import VolumeInfo, type_of

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import Volume
    from gtrain.state import Cluster

#: the disk resource provider's api-version (Microsoft.Compute/disks is versioned apart from virtualMachines)
V_DISKS = "2024-03-02"
TAG_VOLUME = "gtrain-volume"
TAG_VOLUME_CREATED = "gtrain-volume-created"
TAG_VOLUMES_GROUP = "gtrain-volumes"

#: managed disks, USD per GB-month (https://azure.microsoft.com/pricing/details/managed-disks/: the 128 GiB tier)
DISK_USD_PER_GB_MONTH = {"Premium_LRS": 0.15, "StandardSSD_LRS": 0.075, "Standard_LRS": 0.045}
#: the sizes a managed disk of these types takes, GiB
SIZES = (4, 32767)
MAX_LUNS = 64


def rate(sku: str) -> float:
    return DISK_USD_PER_GB_MONTH.get(sku, DISK_USD_PER_GB_MONTH["Premium_LRS"])


def group_of(region: str) -> str:
    return f"gtrain-volumes-{region}"


def disk_name(volume: str) -> str:
    return f"gtrain-{volume}"


def check_sizes(spec: ClusterSpec) -> None:
    """Every volume of an azure spec has a size a managed disk takes (plan: before anything is made)."""
    lo, hi = SIZES
    for i, vol in enumerate(spec.volumes or []):
        if vol.size_gb is None:
            raise ConfigError(f"volumes[{i}].size_gb: required for a managed disk ({vol.name})",
                              hint="add size_gb: 128 (GiB; Azure bills by tier: 128 GiB is P10/E10/S10)",
                              field=f"volumes[{i}].size_gb")
        if not lo <= vol.size_gb <= hi:
            raise ConfigError(f"volumes[{i}].size_gb: {vol.size_gb} — a managed disk is {lo}..{hi} GiB",
                              hint=f"give {lo}..{hi}", field=f"volumes[{i}].size_gb")


def plan_notes(spec: ClusterSpec, region: str) -> list[str]:
    vols = spec.volumes or []
    if not vols:
        return []
    what = ", ".join(f"{v.name} ({v.size_gb} GiB {type_of(spec, v)} at {v.mount}, "
                     f"~${rate(type_of(spec, v)):g}/GB-month)" for v in vols)
    notes = [f"volumes: managed disks {what} in resource group {group_of(region)}; made once, found by tag "
             f"{TAG_VOLUME}=NAME, kept by `down` (a standing charge) until `gtrain volume delete NAME`",
             f"volumes pin the cluster to {region} (no failover to other regions)"]
    if spec.num_nodes > 1:
        notes.append("volumes attach to node 0 only (a managed disk is one VM's; shared disks are not built)")
    return notes


def _parse(rid: str) -> tuple[str, str]:
    """(resource group, name) of an ARM resource id."""
    parts = rid.strip("/").split("/")
    low = [p.lower() for p in parts]
    return parts[low.index("resourcegroups") + 1], parts[-1]


def _props(d: dict[str, Any]) -> dict[str, Any]:
    return d.get("properties") or {}


class AzureVolumes:
    """Finding, making, attaching and detaching the spec's managed disks; ``gtrain volume`` for azure."""

    def __init__(self, arm: api.ARM_Client, ledger: Ledger, report: Reporter) -> None:
        self.arm = arm
        self.ledger = ledger
        self.store = ledger.store
        self.report = report

    def _disk_path(self, group: str, name: str) -> str:
        return self.arm.sub(f"/resourceGroups/{group}/providers/Microsoft.Compute/disks/{name}")

    def _vm_path(self, group: str, name: str) -> str:
        return self.arm.sub(f"/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{name}")

    # ---- finding ----

    def _all(self) -> list[dict[str, Any]]:
        disks = self.arm.list(self.arm.sub("/providers/Microsoft.Compute/disks"), V_DISKS, "disks.list")
        return [d for d in disks if (d.get("tags") or {}).get(TAG_VOLUME)]

    def find(self, name: str) -> list[dict[str, Any]]:
        return [d for d in self._all() if d["tags"][TAG_VOLUME] == name]

    def find_one(self, name: str) -> dict[str, Any] | None:
        found = self.find(name)
        if len(found) > 1:
            raise ProviderError(f"{len(found)} managed disks are tagged {TAG_VOLUME}={name} ("
                                + ", ".join(str(d["id"]) for d in found) + ")",
                                hint="delete or re-tag all but one (az disk list)")
        return found[0] if found else None

    def holder(self, d: dict[str, Any]) -> tuple[str, str, str] | None:
        """(VM name, cluster id, cluster name) of the VM the disk is attached to, when it still exists."""
        vm_id = d.get("managedBy")
        if not vm_id:
            return None
        group, name = _parse(str(vm_id))
        vm = self.arm.get(self._vm_path(group, name), V_COMPUTE, f"virtualMachines.get {name}")
        if vm is None:
            return None
        tags = vm.get("tags") or {}
        return name, str(tags.get(TAG_CLUSTER) or ""), str(tags.get(TAG_CLUSTER_NAME) or name)

    def info(self, d: dict[str, Any]) -> VolumeInfo:
        held = self.holder(d)
        sku = str((d.get("sku") or {}).get("name") or "Premium_LRS")
        state = str(_props(d).get("diskState") or _props(d).get("provisioningState") or "")
        return VolumeInfo(
            name=str((d.get("tags") or {}).get(TAG_VOLUME, "?")), provider="azure", type=sku,
            size_gb=int(_props(d).get("diskSizeGB") or 0), region=str(d.get("location")),
            zone=",".join(d.get("zones") or []) or None, id=str(d.get("name")),
            state="in-use" if held else ("available" if state == "Unattached" else state.lower()),
            attached_to=held[2] if held else None, usd_per_gb_month=rate(sku),
            created=(d.get("tags") or {}).get(TAG_VOLUME_CREATED),
            extra={"owner": (d.get("tags") or {}).get(TAG_OWNER), "resource_id": d.get("id")})

    def list_all(self, regions: list[str] | None) -> list[VolumeInfo]:
        out = [self.info(d) for d in self._all() if regions is None or d.get("location") in regions]
        return sorted(out, key=lambda i: (i.name, i.region or ""))

    # ---- up ----

    def prepare(self, spec: ClusterSpec, cluster: Cluster, region: str) -> None:
        """Before anything is made: refuse what cannot be attached in ``region``."""
        for i, vol in enumerate(spec.volumes or []):
            fld = f"volumes[{i}].name"
            d = self.find_one(vol.name)
            if d is None:
                continue
            where = str(d.get("location"))
            if where != region:
                raise ConfigError(f"{fld}: volume {vol.name} ({d['name']}) is in {where}, the cluster goes to "
                                  f"{region}: a managed disk attaches only to VMs of its own region",
                                  hint=f"set resources.region: {where}, or `gtrain volume delete {vol.name} "
                                       "--provider azure` to start afresh", field=fld)
            if d.get("zones"):
                raise ConfigError(f"{fld}: volume {vol.name} ({d['name']}) is a zonal disk (zone "
                                  f"{', '.join(d['zones'])}); gtrain's Azure VMs are regional and cannot attach it",
                                  hint="use a regional disk (gtrain makes them), or another volume name", field=fld)
            size = int(_props(d).get("diskSizeGB") or 0)
            if vol.size_gb is not None and vol.size_gb < size:
                raise ConfigError(f"volumes[{i}].size_gb: {vol.size_gb} is below volume {vol.name}'s {size} GiB "
                                  "(Azure does not shrink a managed disk)", hint=f"set size_gb: {size}",
                                  field=f"volumes[{i}].size_gb")
            sku = str((d.get("sku") or {}).get("name"))
            if (want := type_of(spec, vol)) != sku:
                self.report.warn(f"volume {vol.name} is {sku}, the spec says {want}: attached as it is")
            held = self.holder(d)
            if held is not None and held[1] != cluster.id:
                raise ConfigError(f"{fld}: volume {vol.name} ({d['name']}) is attached to cluster {held[2]} "
                                  f"({held[0]}); a managed disk is one VM's", hint=f"`gtrain down {held[2]}` first "
                                  "(the volume stays), or use another volume name", field=fld)

    def attach(self, spec: ClusterSpec, cluster: Cluster, region: str, vm_group: str, vm: str) -> list[dict[str, Any]]:
        """Make what is missing, grow what is smaller than ``size_gb``, attach each volume to ``vm`` (node 0); the
        records kept with the cluster."""
        records: list[dict[str, Any]] = []
        for i, vol in enumerate(spec.volumes or []):
            d = self.find_one(vol.name) or self._create(spec, vol, region)
            grown = False
            if vol.size_gb is not None and vol.size_gb > int(_props(d).get("diskSizeGB") or 0):
                if d.get("managedBy"):
                    self.report.warn(f"volume {vol.name} is attached already: not grown (Azure resizes a disk only "
                                     "when it is unattached or its VM deallocated)")
                else:
                    d, grown = self._grow(d, vol.size_gb), True
            lun = self._attach_one(i, vol, d, vm_group, vm)
            sku = str((d.get("sku") or {}).get("name") or type_of(spec, vol))
            records.append({"name": vol.name, "id": str(d["name"]), "resource_id": str(d["id"]), "region": region,
                            "size_gb": int(_props(d).get("diskSizeGB") or 0), "type": sku, "mount": vol.mount,
                            "read_only": vol.read_only, "lun": lun, "device": f"/dev/disk/azure/scsi1/lun{lun}",
                            "nodes": [0], "vm": vm, "vm_group": vm_group, "grow": grown,
                            "usd_per_gb_month": rate(sku)})
        with self.ledger.lock:
            fresh = self.store.get_cluster_by_id(cluster.id)
            self.store.update_cluster(cluster.id, extra={**fresh.extra, "volumes": records})
        return records

    def _data_disks(self, vm_group: str, vm: str) -> list[dict[str, Any]]:
        got = self.arm.get(self._vm_path(vm_group, vm), V_COMPUTE, f"virtualMachines.get {vm}")
        if got is None:
            raise ProviderError(f"virtualMachines.get {vm}: the VM is gone")
        keep = ("lun", "name", "createOption", "caching", "deleteOption", "writeAcceleratorEnabled")
        return [{**{k: x[k] for k in keep if k in x}, "createOption": "Attach",
                 "managedDisk": {"id": (x.get("managedDisk") or {}).get("id")}}
                for x in (_props(got).get("storageProfile") or {}).get("dataDisks") or []]

    def _update_disks(self, vm_group: str, vm: str, data_disks: list[dict[str, Any]], what: str) -> None:
        """Virtual Machines - Update with the whole ``dataDisks`` list (it replaces the VM's), waited for."""
        r = self.arm.request("PATCH", self.arm.url(self._vm_path(vm_group, vm), V_COMPUTE),
                             {"properties": {"storageProfile": {"dataDisks": data_disks}}}, what)
        if r.headers.get("azure-asyncoperation") or r.headers.get("location"):  # 200 or 202, polled to the end
            self.arm.wait(api.Response(202, r.headers, r.body), what, 600)

    def _attach_one(self, i: int, vol: Volume, d: dict[str, Any], vm_group: str, vm: str) -> int:
        disks = self._data_disks(vm_group, vm)
        mine = next((x for x in disks if str((x.get("managedDisk") or {}).get("id") or "").lower()
                     == str(d["id"]).lower()), None)
        if mine is not None:  # a resumed `up`: attached already
            return int(mine["lun"])
        used = {int(x["lun"]) for x in disks}
        lun = next(n for n in range(MAX_LUNS) if n not in used)
        self.report.info(f"attaching volume {vol.name} ({d['name']}) to node 0 as LUN {lun}")
        new = {"lun": lun, "name": str(d["name"]), "createOption": "Attach", "caching": "None",
               "deleteOption": "Detach", "managedDisk": {"id": str(d["id"])}}
        try:
            self._update_disks(vm_group, vm, [*disks, new], f"virtualMachines.update {vm} (attach {d['name']})")
        except GtrainError as e:
            if code_of(e) == "OperationNotAllowed" and "attached" in e.message:
                raise ConfigError(f"volumes[{i}].name: volume {vol.name} was attached elsewhere meanwhile "
                                  f"({e.message})", hint="`gtrain volume ls --provider azure` shows who holds it",
                                  field=f"volumes[{i}].name") from None
            raise
        return lun

    def _create(self, spec: ClusterSpec | None, vol: Volume, region: str) -> dict[str, Any]:
        sku = type_of(spec, vol) if spec is not None else (vol.type or "Premium_LRS")
        group = group_of(region)
        if self.arm.get(self.arm.sub(f"/resourcegroups/{group}"), api.V_RESOURCES, f"resourceGroups.get {group}") \
                is None:
            self.arm.put(self.arm.sub(f"/resourcegroups/{group}"), api.V_RESOURCES,
                         {"location": region, "tags": {TAG_VOLUMES_GROUP: "true", TAG_OWNER: owner()}},
                         f"resourceGroups.createOrUpdate {group}")
        name = disk_name(vol.name)
        tags = {TAG_VOLUME: vol.name, TAG_OWNER: owner(),
                TAG_VOLUME_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.report.info(f"{region}: creating volume {vol.name} ({vol.size_gb} GiB {sku}) in {group}")
        got: dict[str, Any] = self.arm.put(self._disk_path(group, name), V_DISKS, {
            "location": region, "tags": tags, "sku": {"name": sku},
            "properties": {"creationData": {"createOption": "Empty"}, "diskSizeGB": int(vol.size_gb or 0)}},
            f"disks.createOrUpdate {name} ({vol.size_gb} GiB {sku}, {region})")
        return got

    def _grow(self, d: dict[str, Any], size_gb: int) -> dict[str, Any]:
        group, name = _parse(str(d["id"]))
        what = f"disks.update {name} {_props(d).get('diskSizeGB')} -> {size_gb} GiB"
        self.report.info(f"growing volume {d['tags'].get(TAG_VOLUME)} from {_props(d).get('diskSizeGB')} to "
                         f"{size_gb} GiB")
        r = self.arm.request("PATCH", self.arm.url(self._disk_path(group, name), V_DISKS),
                             {"properties": {"diskSizeGB": size_gb}}, what)
        self.arm.wait(r, what, 600)
        got: dict[str, Any] = self.arm.get(self._disk_path(group, name), V_DISKS, what) or d
        return got

    def mount(self, runners: Callable[[], list[Runner]], vols: list[dict[str, Any]], reachable: bool) -> None:
        """Mount each attached disk on node 0 once it answers over SSH (``/dev/disk/azure/scsi1/lun<N>``, the Azure
        udev rules' link; else ``/dev/disk/azure/data/by-lun/<N>``)."""
        from gtrain.providers.cloud.volumes import mount_script

        if vols and not reachable:
            self.report.warn("volumes attached to node 0 but not mounted: azure.wait_ssh is false (`gtrain exec` "
                             "can run the mount later; docs/volumes.md)")
        elif vols:
            recs = [{**v, "candidates": [v["device"], f"/dev/disk/azure/data/by-lun/{v['lun']}"]} for v in vols]
            runners()[0].run(mount_script(recs), timeout=300)

    # ---- down ----

    def release(self, cluster: Cluster) -> list[VolumeInfo]:
        """Detach the cluster's volumes from what is left of its VMs (deleting a VM detaches them); each is kept,
        said with its standing charge, and returned."""
        out: list[VolumeInfo] = []
        fresh = self.store.get_cluster_by_id(cluster.id)  # a rollback's record may predate the attach
        for r in (fresh or cluster).extra.get("volumes") or []:
            group, name = _parse(str(r["resource_id"]))
            d = self.arm.get(self._disk_path(group, name), V_DISKS, f"disks.get {name}")
            if d is None:
                continue
            if d.get("managedBy") and _parse(str(d["managedBy"])) == (str(r["vm_group"]), str(r["vm"])) \
                    and self.holder(d) is not None:
                self.report.info(f"detaching volume {r['name']} ({name}); it stays")
                disks = [x for x in self._data_disks(str(r["vm_group"]), str(r["vm"]))
                         if str((x.get("managedDisk") or {}).get("id") or "").lower() != str(d["id"]).lower()]
                self._update_disks(str(r["vm_group"]), str(r["vm"]), disks, f"virtualMachines.update {r['vm']} "
                                   f"(detach {name})")
                d = self.arm.get(self._disk_path(group, name), V_DISKS, f"disks.get {name}") or d
            v = self.info(d)
            self.report.info(f"volume {v.name} ({v.id}) is kept: {v.size_gb} GiB at ~${v.usd_per_gb_month:g}/GB-month "
                             f"(${v.usd_per_month:g}/month) until `gtrain volume delete {v.name}`")
            out.append(v)
        return out

    # ---- gtrain volume ----

    def create(self, spec: ClusterSpec, vol: Volume, region: str) -> VolumeInfo:
        check_sizes(spec)
        d = self.find_one(vol.name)
        if d is not None:
            self.report.info(f"volume {vol.name} is there already ({d['name']}, {d.get('location')})")
            return self.info(d)
        return self.info(self._create(spec, vol, region))

    def delete(self, name: str, regions: list[str] | None) -> VolumeInfo | None:
        found = [d for d in self.find(name) if regions is None or d.get("location") in regions]
        if not found:
            return None
        d = found[0]
        info = self.info(d)
        if info.attached_to:
            raise ConfigError(f"volume {name} ({d['name']}) is attached to cluster {info.attached_to}",
                              hint=f"`gtrain down {info.attached_to}` first (it detaches the volume)", field="NAME")
        group, dname = _parse(str(d["id"]))
        self.arm.delete(self._disk_path(group, dname), V_DISKS, f"disks.delete {dname}")
        info.state = "deleted"
        return info
