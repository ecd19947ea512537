"""The azure provider: :class:`AzureProvider` plans from the catalog (the Retail Prices API's list prices),
provisions one resource group per cluster with region failover, describes (a Spot VM gone = evicted), terminates
(one resource group delete, polled to the end), gives SSH runners, prices each node interval, and sweeps
orphaned groups by tag (:mod:`.gc`).

A capacity answer (SkuNotAvailable, AllocationFailed, ZonalAllocationFailed, OverconstrainedAllocationRequest)
or a quota answer (QuotaExceeded, OperationNotAllowed about quota) in one region deletes that attempt's
resource group, then tries the next region; after the last, one CapacityError / QuotaError lists them all
(``resources.any_of`` moves on to its next candidate on exactly those). An elastic cluster (``num_nodes: {min,
max}``) keeps the VMs that came when the others got such an answer, at least ``min`` of them; the refused VMs are
deleted and made later, as capacity comes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.catalog import snapshot_date
from gtrain.errors import CapacityError, ConfigError, GtrainError, QuotaError
from gtrain.events import SILENT, Reporter
from gtrain.providers.azure import api
from gtrain.providers.azure.options import AzureOptions, azure_options
from gtrain.providers.azure.resources import AzureResources, NodeBody, power_state
from gtrain.providers.azure.volumes import DISK_USD_PER_GB_MONTH, AzureVolumes
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan, partial_start
from gtrain.providers.cloud.billing import cloud_interval_cost, freeze_price
from gtrain.providers.cloud.failover import Attempts
from gtrain.providers.cloud.idle import idle_watch
from gtrain.providers.cloud.keys import check_team_key, drop_key, ensure_key, key_path, owner
from gtrain.providers.cloud.provider import CloudProvider
from gtrain.providers.cloud.ssh_access import finish_down, resolve_ssh_cidr, ssh_notes, wait_ssh, write_ssh_config

if TYPE_CHECKING:
    from gtrain.catalog import Offer
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import VolumeInfo
    from gtrain.state import Cluster, CostInterval, StateStore
    from gtrain.state.nodes import NodeRecord
    from gtrain.state.sshtarget import SSHTarget

__all__ = ["DISK_USD_PER_GB_MONTH", "AzureProvider"]  # managed disks' $/GB-month: .volumes (the OS disk's too)


class AzureProvider(CloudProvider):
    name = "azure"
    gc_scope: ClassVar[str | None] = "region"
    #: Azure's in-guest shutdown leaves a stopped VM that is still billed: the nodes do not end themselves
    nodes_enforce_limits: ClassVar[bool] = False
    #: no power-off here yet: a stopped Azure VM bills on until it is deallocated through ARM
    can_stop: ClassVar[bool] = False
    cannot_stop_why: ClassVar[str | None] = ("an Azure VM bills until it is deallocated, and gtrain does not "
                                             "deallocate and reallocate VMs yet")

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, credential: Any = None,
                 endpoint: str | None = None, max_workers: int = 32) -> None:
        super().__init__(store, report, max_workers=max_workers)
        self.credential, self.endpoint = credential, endpoint
        self._arms: dict[str, api.ARM_Client] = {}
        self._lock = threading.Lock()

    def arm(self, subscription: str | None) -> api.ARM_Client:
        sub = api.subscription_of(subscription)
        with self._lock:
            if sub not in self._arms:
                self._arms[sub] = api.ARM_Client(sub, endpoint=self.endpoint, credential=self.credential)
            return self._arms[sub]

    def parts(self, opts: AzureOptions) -> AzureResources:
        return AzureResources(self.arm(opts.subscription))

    def _opts(self, cluster: Cluster) -> AzureOptions:
        return azure_options(cluster.spec.get("azure"))

    def volumes(self, opts: AzureOptions) -> AzureVolumes:
        """The spec's managed disks (gtrain/providers/azure/volumes.py), in the subscription of ``opts``."""
        return AzureVolumes(self.arm(opts.subscription), self.ledger, self.report)

    # ---- plan ----

    def _offer(self, spec: ClusterSpec, region: str | None) -> Offer:
        from gtrain.catalog import resolve

        res = spec.resources
        return resolve("azure", res.accelerators, res.instance_type, region, res.use_spot)

    def _regions(self, spec: ClusterSpec, offer: Offer) -> list[str]:
        from gtrain.catalog import lookup

        given = spec.resources.region_list()
        if given:
            return given
        return [o.region for o in sorted(lookup("azure", offer.instance_type),
                                         key=lambda o: (o.price(spec.resources.use_spot), o.region))]

    def plan(self, spec: ClusterSpec) -> Plan:
        from gtrain.catalog import lookup

        opts = azure_options(spec.section("azure"))
        res = spec.resources
        if res.zones:
            raise ConfigError("resources.zones: azure places VMs by region only", hint="remove resources.zones",
                              field="resources.zones")
        given = res.region_list()
        offer = self._offer(spec, given[0] if given else None)
        regions = self._regions(spec, offer)
        for i, r in enumerate(regions):
            if not lookup("azure", offer.instance_type, r):
                field = f"resources.regions[{i}]" if res.regions else "resources.region"
                raise ConfigError(f"{field}: {offer.instance_type} ({offer.accelerators}) is not offered in {r!r}",
                                  hint="drop that region or pick another GPU (`gtrain catalog --provider azure`)",
                                  field=field)
        check_team_key("rsa")  # Azure takes RSA keys of 2048 bits or more only: a team key of another kind is exit 2
        first = lookup("azure", offer.instance_type, regions[0])[0]
        notes = [f"{first.instance_type}: {first.vcpus} vCPUs, {first.memory_gib:g} GiB, {first.gpu_count}x "
                 f"{first.gpu_name} {first.gpu_memory_gib:g} GB",
                 "one resource group per cluster (gtrain-<cluster id>); `down` deletes it whole"]
        if res.use_spot:
            notes.append(f"Spot (evictionPolicy Delete, maxPrice -1: never above on-demand "
                         f"{first.price_ondemand:g} $/h); Azure may evict Spot VMs at any time")
        notes.append(f"prices from the gtrain catalog (Azure Retail Prices API), snapshot {snapshot_date('azure')}")
        notes.append(f"plus {opts.os_disk_type} {res.disk_gb} GB per node at "
                     f"${DISK_USD_PER_GB_MONTH[opts.os_disk_type]:g}/GB-month")
        if len(regions) > 1:
            notes.append("regions tried in order on capacity/quota errors: " + ", ".join(regions))
        if spec.policies.max_hours or spec.policies.max_cost_usd or spec.policies.idle_minutes:
            notes.append("policies.max_hours / max_cost_usd are not enforced by azure nodes (a VM shut down from "
                         "inside stays allocated and billed): `gtrain down` ends the cluster")
        notes += ssh_notes(opts.ssh_cidr, opts.ssh_proxy_command, "azure")
        if spec.volumes:  # managed disks: the first region (gtrain/providers/azure/volumes.py)
            from gtrain.providers.azure.volumes import check_sizes, plan_notes

            check_sizes(spec)
            notes += plan_notes(spec, regions[0])
        return Plan("azure", spec.num_nodes, first.instance_type, "spot" if res.use_spot else "on-demand",
                    region=regions[0], gpu_name=first.gpu_name, gpus_per_node=first.gpu_count,
                    price_per_hour=first.price(res.use_spot), max_hours=spec.policies.max_hours, notes=notes)

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        from gtrain.catalog import lookup

        opts = azure_options(spec.section("azure"))
        parts = self.parts(opts)
        group = api.group_name(cluster.id)
        given = spec.resources.region_list()
        offer = self._offer(spec, given[0] if given else None)
        regions = self._regions(spec, offer)
        ssh_cidr = resolve_ssh_cidr(opts.ssh_cidr, opts.ssh_proxy_command, "azure", " (Azure Bastion)")
        pub = ensure_key(cluster.id, "rsa")  # RSA: what Azure takes in every region (docs/providers/azure.md)
        there = parts.group(group)
        resumed = there is not None
        if there is not None:  # a resumed `up`: the group pins the region
            regions = [str(there["location"])]
            self.report.info(f"found resource group {group} in {regions[0]}")
        if spec.volumes:  # before anything is made: refused (exit 2) where the disks cannot be attached
            regions = regions[:1]
            self.volumes(opts).prepare(spec, cluster, regions[0])
        attempts = Attempts()
        for region in regions:
            regional = lookup("azure", offer.instance_type, region)
            if not regional:
                attempts.add(region, f"{offer.instance_type} not in the catalog here")
                continue
            made: list[str] = []
            # the $/h up freezes: the Retail Prices API's for this size here now, else the catalog's (an estimate)
            from gtrain.providers.azure.pricing import at_launch

            use_spot = spec.resources.use_spot
            frozen = at_launch(offer.instance_type, region, use_spot, regional[0].price(use_spot),
                               snapshot_date("azure"))
            freeze_price(self.store, cluster, plan, frozen, self.report)
            regional = [regional[0].with_price(use_spot, frozen.usd_per_hour)]
            try:
                nodes = self._make(spec, cluster, opts, parts, group, region, pub, ssh_cidr, made)
            except (CapacityError, QuotaError) as e:
                if resumed:  # the nodes already there stay (a replacement found no capacity): undo only this call's
                    self._undo_nodes(parts, cluster, group, made)
                    raise
                attempts.add(region, e)
                self.report.warn(f"{region}: {e.message}; deleting resource group {group}, trying the next region")
                self._undo(parts, cluster, group)
                continue
            except BaseException:
                if resumed:
                    self._undo_nodes(parts, cluster, group, made)
                else:
                    self._undo(parts, cluster, group)
                    drop_key(cluster.id)
                raise
            self._record(spec, cluster, plan, opts, group, region, nodes, regional[0])
            vols = self.volumes(opts).attach(spec, cluster, region, group, api.vm_name(cluster.id, min(nodes))) \
                if spec.volumes else []
            if opts.wait_ssh:
                wait_ssh(cluster, self.ledger, self.report, host_keys=lambda node: [], host_key_wait_s=0,
                         ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=self.max_workers,
                         key_source="Azure", hint="check azure.ssh_cidr / azure.ssh_proxy_command; "
                                                  "`gtrain down` removes them")
            self.volumes(opts).mount(lambda: self.runners(cluster), vols, opts.wait_ssh)
            idle_watch(spec, opts, self.runners(cluster), self.report, self.max_workers, cluster=cluster,
                           limits=self.nodes_enforce_limits)
            return
        drop_key(cluster.id)
        attempts.fail(f"{spec.num_nodes}x {offer.instance_type} ({plan.market})",
                      quota_hint="request a quota increase for this VM family (Subscriptions > Usage + quotas), "
                                 "or add resources.regions",
                      capacity_hint="add regions (resources.regions), try on-demand, or fewer nodes; each "
                                    "failed region's resource group was deleted")

    def _make(self, spec: ClusterSpec, cluster: Cluster, opts: AzureOptions, parts: AzureResources, group: str,
              region: str, pub: str, ssh_cidr: str | None, made: list[str]) -> dict[int, dict[str, Any]]:
        tags = {**opts.tags, api.TAG_CLUSTER: cluster.id, api.TAG_CLUSTER_NAME: cluster.name,
                api.TAG_OWNER: owner(), api.TAG_CREATED: str(int(cluster.created_at))}
        if parts.group(group) is None:
            rid = self.ledger.record(cluster, "resource-group", group, region)
            parts.make_group(group, region, tags)
            self.ledger.mark(rid, "created")
        subnet = parts.make_network(group, region, tags, opts, ssh_cidr)
        offer = self._offer(spec, region)
        body = NodeBody(location=region, size=offer.instance_type, spot=spec.resources.use_spot,
                        disk_gb=spec.resources.disk_gb, image=spec.resources.image_id or opts.image,
                        public_key=pub, tags=tags)
        public = opts.public_ip if opts.public_ip is not None else not opts.ssh_proxy_command
        existing = {str(v.get("name")) for v in parts.vms(group)
                    if (v.get("properties") or {}).get("provisioningState") == "Succeeded"}
        self.report.info(f"{region}: creating {spec.num_nodes} {offer.instance_type} node(s) in {group}")

        def one(rank: int) -> dict[str, Any]:
            name = api.vm_name(cluster.id, rank)
            if name in existing:  # a resumed `up`: the node is there, as it was
                self.report.node(rank, f"{name} found in {region}")
                return parts.addresses(group, name)
            vid = self.ledger.record(cluster, "vm", f"{group}/{name}", region, {"rank": rank})
            made.append(name)
            try:
                out = parts.make_node(group, name, rank, body, subnet, opts, public)
            except GtrainError:
                self.ledger.mark(vid, "not-created")
                raise
            self.ledger.mark(vid, "created")
            self.report.node(rank, f"{name} created in {region}")
            return out

        with ThreadPoolExecutor(min(self.max_workers, spec.num_nodes)) as pool:
            futs = {rank: pool.submit(one, rank) for rank in range(spec.num_nodes)}
            errors: dict[int, BaseException] = {}
            got: dict[int, dict[str, Any]] = {}
            for rank, f in futs.items():
                try:
                    got[rank] = f.result()
                except BaseException as e:  # noqa: BLE001 - the first (capacity first) error is raised below
                    errors[rank] = e
        if errors:
            # an elastic start keeps what came up when the rest found no capacity (at least num_nodes.min)
            there = sorted(r for r in range(spec.num_nodes) if api.vm_name(cluster.id, r) in existing)
            recorded = {n.rank for n in self.store.node_records(cluster.id)}  # a replacement: never left pending
            start = partial_start(spec, there, sorted(r for r in got if r not in there), errors,
                                  recorded - set(there))
            if start is None:
                caps = [e for e in errors.values() if isinstance(e, CapacityError | QuotaError)]
                raise caps[0] if caps else next(iter(errors.values()))
            # the refused VMs (ARM keeps a Failed one) and any made past them go: growth makes them afresh
            gone = [api.vm_name(cluster.id, r) for r in sorted([*errors, *start.drop])]
            self._undo_nodes(parts, cluster, group, gone)
            got = {r: a for r, a in got.items() if r in there or r in start.keep}
            self.report.warn(start.note(region, len(got), spec))
        return got

    def _undo(self, parts: AzureResources, cluster: Cluster, group: str) -> None:
        """A failed attempt leaves nothing: its whole resource group goes (best effort, said if it fails)."""
        try:
            parts.delete_group(group)
            self.ledger.mark_live(cluster.id, "deleted")
        except GtrainError as e:
            self.report.warn(f"could not delete resource group {group} after the failed attempt: {e.message}; "
                             "`gtrain gc --provider azure --yes` finds it by tag")

    def _undo_nodes(self, parts: AzureResources, cluster: Cluster, group: str, names: list[str]) -> None:
        """Delete the nodes one call tried to make in a group that holds other nodes (best effort)."""
        for name in names:
            try:
                parts.delete_node(group, name)
                self.ledger.mark_live(cluster.id, "deleted", kind="vm", refs={f"{group}/{name}"})
            except GtrainError as e:
                self.report.warn(f"could not delete {name} after the failed attempt: {e.message}")

    def _record(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: AzureOptions, group: str,
                region: str, nodes: dict[int, dict[str, Any]], offer: Offer) -> None:
        from gtrain.state.nodes import NodeRecord

        spot = spec.resources.use_spot
        price = offer.price(spot)
        for rank, addrs in sorted(nodes.items()):
            name = api.vm_name(cluster.id, rank)
            meta: dict[str, Any] = {
                "subscription": opts.subscription, "group": group, "region": region,
                "market": "spot" if spot else "on-demand", "instance_type": offer.instance_type,
                "price_ondemand": offer.price_ondemand, "price_spot_catalog": offer.price_spot,
                "disk_gb": spec.resources.disk_gb, "disk_type": opts.os_disk_type, "spot": spot,
                "private_ip": addrs["private_ip"], "public_ip": addrs["public_ip"], "ssh_user": opts.ssh_user,
                "key_file": str(key_path(cluster.id, "rsa")), "proxy_command": opts.ssh_proxy_command,
            }
            self.ledger.put_node(cluster.id, NodeRecord(
                rank=rank, status="up", address=addrs["private_ip"], instance_id=name, zone=region,
                ssh=ssh_target(meta, name), launched_at=time.time(), extra=meta))
        plan.region, plan.price_per_hour = region, price
        with self.ledger.lock:
            self.store.update_cluster(cluster.id, region=region, price_per_hour=price)
        write_ssh_config(self.ledger, self.report)

    # ---- describe ----

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        parts = self.parts(self._opts(cluster))
        by_gtrain = cluster.status in ("terminating", "terminated")
        out: list[NodeStatus] = []
        for node in self.store.node_records(cluster.id):
            group, name = str(node.extra.get("group") or api.group_name(cluster.id)), node.instance_id or ""
            spot = bool(node.extra.get("spot"))
            vm = parts.vm(group, name, view=True)
            if vm is None:
                if spot and not by_gtrain and node.status not in ("terminated", "deleted"):
                    out.append(NodeStatus(node.rank, "preempted", node.address,
                                          f"{name}: Spot VM evicted and deleted by Azure"))
                else:
                    out.append(NodeStatus(node.rank, "missing", node.address, f"{name}: no such VM in {group}"))
                continue
            ps = power_state(vm)
            if ps in ("deallocated", "deallocating", "stopped", "stopping"):
                st = "preempted" if spot and ps.startswith("dealloc") and not by_gtrain else "stopped"
                out.append(NodeStatus(node.rank, st, node.address, f"{name}: {ps}"))
                continue
            mapped = {"running": "running", "starting": "pending", "": "pending"}
            out.append(NodeStatus(node.rank, mapped.get(ps, ps), node.address, name))
        return out

    # ---- terminate ----

    def terminate(self, cluster: Cluster) -> None:
        opts = self._opts(cluster)
        parts = self.parts(opts)
        groups = {api.group_name(cluster.id)} | {str(g["name"]) for g in parts.tagged_groups(cluster.id)}
        for group in sorted(groups):
            self.report.info(f"deleting resource group {group} (and everything in it)")
            parts.delete_group(group)
        self.ledger.mark_live(cluster.id, "deleted")
        left = [f"resource group {g['name']}" for g in parts.tagged_groups(cluster.id)]
        left += [f"resource group {g}" for g in groups if parts.group(g) is not None and f"resource group {g}"
                 not in left]
        if cluster.spec.get("volumes"):  # detached by the VMs' delete, kept: each said with its charge
            self.volumes(opts).release(cluster)
        finish_down(self.ledger, self.report, cluster, left, f"tagged {api.TAG_CLUSTER}={cluster.id}",
                    "gtrain gc --provider azure --yes")

    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        if node.instance_id:
            group = str(node.extra.get("group") or api.group_name(cluster.id))
            self.parts(self._opts(cluster)).delete_node(group, node.instance_id)
            self.ledger.mark_live(cluster.id, "deleted", kind="vm", refs={f"{group}/{node.instance_id}"})

    # ---- price ----

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        node = next((n for n in self.store.node_records(cluster.id) if n.rank == interval.node_rank), None)
        meta: dict[str, Any] = node.extra if node is not None else {}
        rate = float(meta.get("price_spot_catalog") or interval.price_per_hour)
        live = bool(cluster.extra.get("price_live"))  # frozen at up from the Retail Prices API (azure/pricing.py)
        spot = (rate, not live, f"Spot: the Retail Prices API's Spot list price ${rate:g}/h "
                                f"{cluster.extra.get('price_source') or ''} (Azure bills the current Spot price, at "
                                "most on-demand)")
        disk_type = str(meta.get("disk_type") or "Premium_LRS")
        return cloud_interval_cost(interval, minimum_s=self.billing_minimum_s, spot=spot,
                                   disk_gb=float(meta.get("disk_gb") or 0),
                                   disk_usd_per_gb_month=DISK_USD_PER_GB_MONTH.get(disk_type, 0.15),
                                   disk_label=f"OS disk {disk_type}", frozen=cluster.extra)

    # ---- volumes (gtrain volume: gtrain/runs/volumes.py) ----

    def volume_list(self, regions: list[str] | None, **options: str | None) -> list[VolumeInfo]:
        sub = options.get("subscription")
        return self.volumes(azure_options({"subscription": sub} if sub else {})).list_all(regions)

    def volume_create(self, spec: ClusterSpec, name: str) -> VolumeInfo:
        vol = next(v for v in spec.volumes or [] if v.name == name)
        plan = self.plan(spec)
        return self.volumes(azure_options(spec.section("azure"))).create(spec, vol, plan.region or "eastus")

    def volume_delete(self, name: str, regions: list[str] | None, **options: str | None) -> VolumeInfo | None:
        sub = options.get("subscription")
        return self.volumes(azure_options({"subscription": sub} if sub else {})).delete(name, regions)

    # ---- gc ----

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Resource groups tagged gtrain-cluster (in ``regions``, default all) of one subscription (option
        ``subscription``, default the environment's) that no live cluster owns."""
        from gtrain.providers.azure.gc import sweep

        sub = options.get("subscription")
        return sweep(self.parts(azure_options({"subscription": sub} if sub else {})), live_cluster_ids, delete,
                     list(regions) if regions else None, self.report)


def ssh_target(meta: dict[str, Any], name: str) -> SSHTarget:
    """How gtrain reaches a VM: its public address (private without one), or its name through the proxy."""
    from gtrain.state.sshtarget import SSHTarget

    proxy = meta.get("proxy_command")
    host = name if proxy else (meta.get("public_ip") or meta.get("private_ip") or "")
    return SSHTarget(host=host, port=22, user=meta.get("ssh_user") or "gtrain",
                     identity_file=meta.get("key_file"), proxy_command=proxy)
