"""The gcp provider: :class:`GCPProvider` plans from the catalog, provisions with failover, describes (GCE's own
record of a preemption), terminates, gives SSH runners and prices each node's running interval. The steps live
in :mod:`.zones` (where to try), :mod:`.instances` (launching and waiting) and :mod:`.teardown`; the clients,
the error translation and the request bodies in :mod:`.api`.

Provisioning makes the cluster's firewall rules, then tries zone after zone: ZONE_RESOURCE_POOL_EXHAUSTED (and a
type the zone does not offer) moves on to the next zone, QUOTA_EXCEEDED to the next region; a failed zone is
cleaned before moving on, and a failed ``up`` leaves nothing it made. An elastic cluster starts in the first zone
that holds ``num_nodes.min`` of its nodes; the others are made later, as capacity comes. A resumed ``up`` (or the
growth of an elastic cluster) finds the nodes already there by label, and they pin the zone (node 0's); an elastic
cluster's missing nodes go to the region's other zones when that one has no capacity (same network).

Cost: GCE bills per second, one-minute minimum; the $/h stored at start is the Cloud Billing Catalog's for the
machine and GPUs in the region, on-demand or Spot (gcp/pricing.py), else the catalog's estimate, marked so; the
boot persistent disk is added by GB-hour at :data:`PD_USD_PER_GB_MONTH`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.catalog import snapshot_date
from gtrain.errors import CapacityError, ConfigError, GtrainError, ProviderError, QuotaError
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan
from gtrain.providers.cloud.billing import cloud_interval_cost, freeze_price
from gtrain.providers.cloud.failover import Attempts
from gtrain.providers.cloud.idle import idle_watch
from gtrain.providers.cloud.keys import drop_key, ensure_key, owner
from gtrain.providers.cloud.lifetime import lifetime_note, lifetime_s, node_lifetime_s
from gtrain.providers.cloud.provider import CloudProvider
from gtrain.providers.cloud.ssh_access import finish_down, resolve_ssh_cidr, ssh_notes
from gtrain.providers.gcp import api
from gtrain.providers.gcp.api import LABEL_CLUSTER, LABEL_RANK, gce
from gtrain.providers.gcp.instances import GCPInstances
from gtrain.providers.gcp.options import GCPOptions, gcp_options
from gtrain.providers.gcp.teardown import GCPTeardown
from gtrain.providers.gcp.volumes import PD_USD_PER_GB_MONTH, GCPVolumes, check_volumes, plan_notes
from gtrain.providers.gcp.zones import REGION_ZONES, GCPZones, _attached

if TYPE_CHECKING:
    from gtrain.catalog import Offer
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import VolumeInfo
    from gtrain.state import Cluster, CostInterval, StateStore
    from gtrain.state.nodes import NodeRecord

__all__ = ["PD_USD_PER_GB_MONTH", "REGION_ZONES", "GCPOptions", "GCPProvider", "gcp_options"]


class GCPProvider(CloudProvider):
    """Composed of :class:`.zones.GCPZones`, :class:`.instances.GCPInstances` and :class:`.teardown.GCPTeardown`,
    each given the shared :class:`.api.Compute` clients, ledger and reporter."""

    name = "gcp"
    gc_scope: ClassVar[str | None] = "zone"

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, clients: api.GCEClients | None = None,
                 credentials: Any = None, max_workers: int = 32, tpu_api: Any = None) -> None:
        super().__init__(store, report, max_workers=max_workers)
        self.compute = api.Compute(clients, credentials)
        self.zones = GCPZones(self.compute, report)
        self.instances = GCPInstances(self.compute, self.ledger, report, max_workers)
        self.teardown = GCPTeardown(self.compute, self.ledger, report, max_workers)
        self.volumes = GCPVolumes(self.compute, self.ledger, report)
        from gtrain.providers.gcp.tpu.slices import TPUSlices

        self.tpu = TPUSlices(store, self.ledger, report, tpu_api)  # resources.accelerators: tpu-... (its folder)

    @staticmethod
    def _is_tpu(cluster: Cluster) -> bool:
        return str((cluster.spec.get("resources") or {}).get("accelerators") or "").startswith("tpu-")

    @staticmethod
    def project(opts: GCPOptions) -> str:
        return api.project_of(opts.project)

    def _opts(self, cluster: Cluster) -> GCPOptions:
        return gcp_options(cluster.spec.get("gcp"))

    # ---- plan ----

    def plan(self, spec: ClusterSpec) -> Plan:
        check_volumes(spec)  # persistent disks (gtrain/providers/gcp/volumes.py): their sizes, no TPU slice
        if spec.resources.tpu:
            return self.tpu.plan(spec)
        opts = gcp_options(spec.gcp)
        res = spec.resources
        if res.regions and res.region and res.region not in res.regions:
            raise ConfigError(f"resources.region: {res.region!r} is not in resources.regions",
                              hint="give one or the other", field="resources.region")
        given = res.region_list()
        try:
            offer = self.zones.offer(spec, given[0] if given else None)
        except ConfigError as e:
            if e.field == "resources.region" and res.regions:
                e.field = "resources.regions[0]"
                e.message = e.message.replace("resources.region:", "resources.regions[0]:", 1)
            raise
        regions = self.zones.regions(spec, offer)
        for i, r in enumerate(regions):
            if self.zones.regional_offer(offer, r) is None:
                raise ConfigError(f"resources.regions[{i}]: {offer.instance_type} ({offer.accelerators}) is not "
                                  f"offered in {r}", hint="drop that region or pick another GPU",
                                  field=f"resources.regions[{i}]")
        for i, z in enumerate(res.zones or []):
            if api.region_of_zone(z) not in regions:
                raise ConfigError(f"resources.zones[{i}]: {z!r} is not a zone of {', '.join(regions)}",
                                  hint="zones are the region name plus -a, -b, ..., e.g. us-central1-a",
                                  field=f"resources.zones[{i}]")
        first = self.zones.regional_offer(offer, regions[0]) or offer
        notes = [f"{first.instance_type}: {first.vcpus} vCPUs, {first.memory_gib:g} GiB, {first.gpu_count}x "
                 f"{first.gpu_name} {first.gpu_memory_gib:g} GB" + (f" ({first.accelerator_type} attached)"
                                                                     if _attached(first) else "")]
        if res.use_spot:
            notes.append(f"Spot $/h here is the catalog's estimate (on-demand {first.price_ondemand:g} $/h); `up` "
                         "freezes the Cloud Billing Catalog's where it can read it; GCE may delete Spot VMs at any "
                         "time")
        notes.append(f"prices from the gtrain catalog, snapshot {snapshot_date('gcp')} "
                     "(`gtrain catalog --refresh` updates them)")
        notes.append(f"plus {opts.disk_type} {res.disk_gb} GB per node at ${PD_USD_PER_GB_MONTH[opts.disk_type]:g}"
                     "/GB-month; billed per second, 1 minute minimum")
        if len(regions) > 1:
            notes.append(f"on no capacity: next zone, then {', '.join(regions[1:])}")
        notes += ssh_notes(opts.ssh_cidr, opts.ssh_proxy_command, "gcp")
        notes += plan_notes(spec, regions[0])  # volumes: one zone of the first region
        notes += lifetime_note(lifetime_s(spec.policies, spec.num_nodes, first.price(res.use_spot)),
                               "GCE's maxRunDuration, action DELETE")
        zones = self.zones.zones(spec, regions[0])
        return Plan(provider="gcp", num_nodes=spec.num_nodes, instance_type=first.instance_type,
                    market="spot" if res.use_spot else "on-demand", region=regions[0],
                    zone=zones[0] if zones else None, gpu_name=first.gpu_name, gpus_per_node=first.gpu_count,
                    price_per_hour=first.price(res.use_spot), max_hours=spec.policies.max_hours, notes=notes)

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        if spec.resources.tpu:  # the same firewall rules, aimed at the slice's network tag
            opts = gcp_options(spec.gcp)
            project = self.project(opts)
            made_rules = self._ensure_firewalls(cluster, project, opts, resolve_ssh_cidr(
                opts.ssh_cidr, opts.ssh_proxy_command, "gcp", " (IAP)"))
            try:
                return self.tpu.provision(spec, cluster, plan)
            except BaseException:
                self._undo(project, cluster, None, [], made_rules)
                raise
        opts = gcp_options(spec.gcp)
        project = self.project(opts)
        offer = self.zones.offer(spec, None if not spec.resources.region_list() else spec.resources.region_list()[0])
        regions = self.zones.regions(spec, offer)
        ssh_cidr = resolve_ssh_cidr(opts.ssh_cidr, opts.ssh_proxy_command, "gcp", " (IAP)")
        pub = ensure_key(cluster.id)
        # a resumed `up`: the nodes already there pin the zone (node 0's). An elastic cluster's missing nodes
        # (growth, replacement) may go to the region's other zones when that one has no capacity (same network)
        existing: dict[int, Any] = {}
        found = self.teardown.find_instances(project, cluster.id)
        home: str | None = None
        if found:
            zone = home = next((api.zone_of(i.zone) for i in found if i.labels.get(LABEL_RANK) == "0"),
                               api.zone_of(found[0].zone))
            regions = [api.region_of_zone(zone)]
            zones_pin: list[str] | None = [zone]
            for inst in found:
                rank = int(inst.labels.get(LABEL_RANK, "-1"))
                at = api.zone_of(inst.zone)
                if 0 <= rank < spec.num_nodes and (at == zone or (spec.elastic and
                                                                   api.region_of_zone(at) == regions[0])):
                    existing[rank] = inst
            self.report.info(f"found {len(existing)} of {spec.num_nodes} node(s) of {cluster.name} in {zone}")
        else:
            zones_pin = None
        if spec.volumes:  # before anything is made: refused (exit 2), or the zone an existing disk pins
            regions = regions[:1]
            zones_pin = zones_pin or self.volumes.prepare(spec, cluster, project, regions[0])
        made_fw = self._ensure_firewalls(cluster, project, opts, ssh_cidr)
        attempts = Attempts()
        for region in regions:
            regional = self.zones.regional_offer(offer, region)
            if regional is None:
                attempts.add(region, f"{offer.instance_type} ({offer.accelerators}) not in the catalog here")
                continue
            # the $/h up freezes (before maxRunDuration is set from it): the Cloud Billing Catalog's, else the
            # catalog's estimate (gtrain/providers/gcp/pricing.py)
            from gtrain.providers.gcp.pricing import at_launch

            frozen = at_launch(regional, region, spec.resources.use_spot, snapshot_date("gcp"))
            freeze_price(self.store, cluster, plan, frozen, self.report)
            regional = regional.with_price(spec.resources.use_spot, frozen.usd_per_hour)
            body = self._body(spec, cluster, opts, regional, pub)
            zones = zones_pin or self.zones.offered_zones(spec, project, region, regional)
            if home is not None and spec.elastic:  # the nodes' zone first, then the region's others
                zones = [home, *(z for z in self.zones.offered_zones(spec, project, region, regional) if z != home)]
            if not zones:
                attempts.add(region, f"no zone offers {regional.instance_type}"
                             + (f" with {regional.accelerator_type}" if _attached(regional) else ""))
                continue
            for zone in zones:
                made: list[str] = []
                dropped: list[str] = []  # an elastic start's nodes made past a refused rank (ranks stay 0..n-1)
                try:
                    nodes = self.instances.launch_zone(spec, cluster, project, zone, body, existing, made, dropped)
                except (CapacityError, QuotaError) as e:
                    attempts.add(f"{region}/{zone}", e)
                    self.report.warn(f"{zone}: {e.message}; "
                                     + ("trying the next region" if isinstance(e, QuotaError) else "trying elsewhere"))
                    self.teardown.delete_instances(project, [(zone, n) for n in made], cluster)
                    if isinstance(e, QuotaError):
                        break
                    continue
                except BaseException:  # a bad request, an outage: leave nothing this call made, then say why
                    self._undo(project, cluster, zone, made, made_fw if not existing else [])
                    raise
                if dropped:
                    self.teardown.delete_instances(project, [(zone, n) for n in dropped], cluster)
                self.instances.record_nodes(spec, cluster, plan, opts, project, zone, nodes, regional, home=home)
                vols = self.volumes.attach(spec, cluster, project, zone, {
                    r: str(i.name) for r, i in nodes.items() if api.zone_of(i.zone or zone) == zone}) \
                    if spec.volumes else []
                if opts.wait_ssh:
                    self.instances.wait_ssh(cluster, opts, project)
                self.volumes.mount(lambda: self.runners(cluster), vols, opts.wait_ssh)
                idle_watch(spec, opts, self.runners(cluster), self.report, self.max_workers, cluster=cluster,
                           limits=self.nodes_enforce_limits)
                return
        what = f"{spec.num_nodes}x {offer.instance_type} ({plan.market})"
        if not existing:  # nothing of this cluster runs anywhere: its firewall rules and local key go too
            self._undo(project, cluster, None, [], made_fw)
        attempts.fail(what, quota_hint="request a GPU quota increase, or add resources.regions",
                      capacity_hint="add zones or regions (resources.zones / resources.regions), try on-demand, "
                                    "or fewer nodes; nothing was left running")

    def _undo(self, project: str, cluster: Cluster, zone: str | None, made: list[str], firewalls: list[str]) -> None:
        """Delete what a failed ``up`` made (best effort: the first error is the one to report)."""
        try:
            if zone and made:
                self.teardown.delete_instances(project, [(zone, n) for n in made], cluster)
            if firewalls:
                self.teardown.delete_firewalls(project, cluster.id, cluster, only=firewalls)
                drop_key(cluster.id)
        except GtrainError as e:
            self.report.warn(f"could not clean up after the failed attempt: {e.message}")

    def _body(self, spec: ClusterSpec, cluster: Cluster, opts: GCPOptions, offer: Offer, pub: str) -> api.NodeBody:
        image = spec.resources.image_id or f"projects/{opts.image_project}/global/images/family/{opts.image_family}"
        created = str(int(cluster.created_at))
        labels = {**opts.labels, LABEL_CLUSTER: cluster.id, api.LABEL_CLUSTER_NAME: cluster.name,
                  api.LABEL_OWNER: api.label_value(owner()), api.LABEL_CREATED: created}
        return api.NodeBody(
            machine_type=offer.instance_type, accelerator_type=offer.accelerator_type if _attached(offer) else None,
            gpu_count=offer.gpu_count, spot=spec.resources.use_spot, disk_gb=spec.resources.disk_gb,
            disk_type=opts.disk_type, image=image, network=opts.network, subnetwork=opts.subnetwork,
            external_ip=opts.external_ip if opts.external_ip is not None else not opts.ssh_proxy_command,
            ssh_user=opts.ssh_user, public_key=pub, service_account=opts.service_account, labels=labels,
            tag=api.network_tag(cluster.id),
            max_run_s=node_lifetime_s(spec.policies, spec.num_nodes, offer.price(spec.resources.use_spot), cluster))

    def _ensure_firewalls(self, cluster: Cluster, project: str, opts: GCPOptions, ssh_cidr: str | None) -> list[str]:
        """Make the cluster's firewall rules that do not exist yet; returns the names made by this call."""
        made: list[str] = []
        for fw in api.firewall_bodies(cluster.id, opts.network, ssh_cidr):
            try:
                with gce(f"firewalls.get {fw.name}"):
                    self.compute.clients.firewalls.get(project=project, firewall=fw.name)
                continue
            except ProviderError as e:
                if not api.is_not_found(e):
                    raise
            rid = self.ledger.record(cluster, "firewall", fw.name, "global")
            try:
                with gce(f"firewalls.insert {fw.name}"):
                    op = self.compute.clients.firewalls.insert(project=project, firewall_resource=fw)
                api.wait_global_op(self.compute.clients, project, op.name, f"firewalls.insert {fw.name}")
            except GtrainError as e:
                if api.code(e) != "alreadyExists":
                    self.ledger.mark(rid, "not-created")
                    raise
            self.ledger.mark(rid, "created")
            made.append(fw.name)
        return made

    # ---- quota (resources.any_of) ----

    def quota_check(self, spec: ClusterSpec, plan: Plan) -> str | None:
        """The project's regional GPU quota (regions.get) cannot hold ``plan`` in any region it may use."""
        from gtrain import catalog
        from gtrain.providers.gcp.quota import gpu_metric, shortfall

        if spec.resources.tpu:
            return None
        regions_client = self.compute.clients.regions
        if regions_client is None or not plan.gpus_per_node or not plan.instance_type:
            return None
        acc = next((o.accelerator_type for o in catalog.offers(provider="gcp", region=plan.region)
                    if o.instance_type == plan.instance_type and o.accelerator_type), None)
        if acc is None:
            return None
        metric = gpu_metric(acc, plan.market == "spot")
        project = self.project(gcp_options(spec.gcp))
        why: list[str] = []
        for region in spec.resources.region_list() or ([plan.region] if plan.region else []):
            with gce(f"regions.get {region}"):
                got = regions_client.get(project=project, region=region)
            short = shortfall(got, metric, plan.gpus_per_node * plan.num_nodes)
            if short is None:
                return None
            why.append(short)
        return "; ".join(why) or None

    # ---- describe ----

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        if self._is_tpu(cluster):
            return self.tpu.describe(cluster)
        project = self.project(self._opts(cluster))
        by_gtrain = cluster.status in ("terminating", "terminated")
        out: list[NodeStatus] = []
        for node in self.store.node_records(cluster.id):
            zone, name = node.zone or node.extra.get("zone") or "", node.instance_id or ""
            spot = bool(node.extra.get("spot"))
            inst = self.compute.instance(project, zone, name)
            if inst is None:
                why = self._preempted_op(project, zone, name)
                if why or (spot and not by_gtrain and node.status not in ("terminated", "deleted")):
                    out.append(NodeStatus(node.rank, "preempted", node.address,
                                          f"{name}: {why or 'Spot VM deleted by Compute Engine'}"))
                else:
                    out.append(NodeStatus(node.rank, "missing", node.address, f"{name}: no such instance in {zone}"))
                continue
            st = inst.status
            if st in ("STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED"):
                if inst.scheduling.provisioning_model == "SPOT" and not by_gtrain:
                    out.append(NodeStatus(node.rank, "preempted", node.address, f"{name}: {st} (Spot VM stopped by "
                                          "Compute Engine)"))
                else:
                    out.append(NodeStatus(node.rank, "stopped", node.address, f"{name}: {st}"))
                continue
            mapped = {"PROVISIONING": "pending", "STAGING": "pending", "RUNNING": "running", "REPAIRING": "pending"}
            out.append(NodeStatus(node.rank, mapped.get(st, st.lower()), node.address, name))
        return out

    def _preempted_op(self, project: str, zone: str, name: str) -> str | None:
        """GCE's own record of a preemption: a zone operation of type compute.instances.preempted."""
        from google.cloud import compute_v1

        try:
            with gce("zoneOperations.list"):
                ops = list(self.compute.clients.zone_operations.list(request=compute_v1.ListZoneOperationsRequest(
                    project=project, zone=zone, filter='operationType = "compute.instances.preempted"')))
        except ProviderError:
            return None
        for op in ops:
            if op.target_link.rstrip("/").endswith(f"/instances/{name}"):
                return f"preempted by Compute Engine at {op.insert_time or op.end_time or '?'}"
        return None

    # ---- terminate ----

    def terminate(self, cluster: Cluster) -> None:
        if self._is_tpu(cluster):
            self.tpu.terminate(cluster)
            self.teardown.delete_firewalls(self.project(self._opts(cluster)), cluster.id, cluster)
            return finish_down(self.ledger, self.report, cluster, [], f"of cluster {cluster.id}",
                               "gtrain gc --provider gcp --yes")
        project = self.project(self._opts(cluster))
        known = [(n.zone or n.extra.get("zone") or "", n.instance_id or "")
                 for n in self.store.node_records(cluster.id) if n.instance_id]
        left = self.teardown.teardown(project, cluster.id, cluster=cluster, known=known)
        if cluster.spec.get("volumes"):  # detached by the instances' delete, kept: each said with its charge
            self.volumes.release(cluster, project)
        finish_down(self.ledger, self.report, cluster, left, f"of cluster {cluster.id}",
                    "gtrain gc --provider gcp --yes")

    def replace_nodes(self, cluster: Cluster, ranks: list[int]) -> None:
        if not self._is_tpu(cluster):
            return super().replace_nodes(cluster, ranks)
        import time as _time

        from gtrain.spec import parse_spec

        spec = parse_spec(cluster.spec, base_dir=cluster.extra.get("base_dir"))  # a slice is remade whole
        self.report.info(f"recreating TPU slice {cluster.id} ({spec.resources.accelerators})")
        with self.ledger.lock:
            for n in self.store.node_records(cluster.id):
                self.store.close_node_interval(cluster.id, n.rank, at=_time.time())
        self.tpu.recreate(spec, cluster)
        with self.ledger.lock:
            for n in self.store.node_records(cluster.id):
                self.store.open_interval(cluster.id, n.rank, instance_type=cluster.instance_type,
                                         market=cluster.market, price_per_hour=cluster.price_per_hour,
                                         started_at=n.launched_at or _time.time())

    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        zone = node.zone or node.extra.get("zone") or ""
        if node.instance_id and zone:
            self.teardown.delete_instances(self.project(self._opts(cluster)), [(zone, node.instance_id)], cluster)

    # ---- stop / start ----

    def power_off(self, cluster: Cluster, nodes: list[NodeRecord]) -> None:
        if self._is_tpu(cluster):
            raise ConfigError(f"gtrain stop: cluster {cluster.name} is a TPU slice, which gtrain does not stop",
                              field="resources.accelerators", hint=f"`gtrain down {cluster.name}` ends it")
        self.instances.power(self.project(self._opts(cluster)), nodes, "stop")

    def power_on(self, cluster: Cluster, nodes: list[NodeRecord]) -> dict[int, dict[str, str | None]]:
        return self.instances.power(self.project(self._opts(cluster)), nodes, "start")

    def disk_price(self, cluster: Cluster, node: NodeRecord) -> tuple[float, str]:
        disk = str(node.extra.get("disk_type") or "pd-balanced")
        return PD_USD_PER_GB_MONTH.get(disk, PD_USD_PER_GB_MONTH["pd-balanced"]), disk

    def stopped_since(self, cluster: Cluster, node: NodeRecord) -> float | None:
        import datetime as dt

        inst = self.compute.instance(self.project(self._opts(cluster)), node.zone or node.extra.get("zone") or "",
                                     node.instance_id or "")
        try:  # Instance.lastStopTimestamp (RFC 3339), set by GCE at every stop
            return dt.datetime.fromisoformat(str(inst.last_stop_timestamp)).timestamp() if inst else None
        except ValueError:
            return None

    def reach(self, cluster: Cluster, node: NodeRecord) -> NodeRecord:
        from gtrain.providers.gcp.instances import ssh_target

        node.ssh = ssh_target(node.extra, node.instance_id or "")
        return node

    def remount_volumes(self, cluster: Cluster, reachable: bool) -> None:
        self.volumes.mount(lambda: self.runners(cluster), list(cluster.extra.get("volumes") or []), reachable)

    def cloud_options(self, spec: ClusterSpec) -> GCPOptions:
        return gcp_options(spec.gcp)

    def wait_reachable(self, cluster: Cluster) -> None:
        opts = self._opts(cluster)
        self.instances.wait_ssh(cluster, opts, self.project(opts))

    # ---- price ----

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        from gtrain.providers.gcp.adopt import find_by_name

        return find_by_name(self, spec, regions)

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        from gtrain.providers.gcp.adopt import adopt

        adopt(self, spec, cluster, plan, region)

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        if self._is_tpu(cluster):
            return self.tpu.price(cluster, interval)
        node = next((n for n in self.store.node_records(cluster.id) if n.rank == interval.node_rank), None)
        meta: dict[str, Any] = node.extra if node is not None else {}
        rate = float(meta.get("price_spot_catalog") or interval.price_per_hour)
        live = bool(cluster.extra.get("price_live"))  # the Cloud Billing Catalog's Spot SKUs at up (gcp/pricing.py)
        spot = ((rate, False, f"Spot: ${rate:g}/h {cluster.extra.get('price_source')} (GCE changes Spot prices at "
                              "most once a month)") if live else
                (rate, True, f"Spot: the catalog's estimate ${rate:g}/h (GCE publishes no Spot price history)"))
        disk_type = str(meta.get("disk_type") or "pd-balanced")
        return cloud_interval_cost(interval, minimum_s=self.billing_minimum_s, spot=spot,
                                   disk_gb=float(meta.get("disk_gb") or 0),
                                   disk_usd_per_gb_month=PD_USD_PER_GB_MONTH.get(
                                       disk_type, PD_USD_PER_GB_MONTH["pd-balanced"]),
                                   disk_label=disk_type, frozen=cluster.extra)

    # ---- volumes (gtrain volume: gtrain/runs/volumes.py) ----

    def volume_list(self, regions: list[str] | None, **options: str | None) -> list[VolumeInfo]:
        return self.volumes.list_all(self.project(gcp_options({"project": options.get("project")})), regions)

    def volume_create(self, spec: ClusterSpec, name: str) -> VolumeInfo:
        plan = self.plan(spec)
        return self.volumes.create(spec, next(v for v in spec.volumes or [] if v.name == name),
                                   self.project(gcp_options(spec.gcp)), plan.region or "us-central1", plan.zone)

    def volume_delete(self, name: str, regions: list[str] | None, **options: str | None) -> VolumeInfo | None:
        return self.volumes.delete(name, self.project(gcp_options({"project": options.get("project")})), regions)

    # ---- gc ----

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Labelled instances (in zones of ``regions``, default all) and firewall rules of one project (option
        ``project``, default the environment's) that no live cluster owns."""
        from gtrain.providers.gcp.gc import sweep

        project = options.get("project")
        proj = self.project(gcp_options({"project": project} if project else {}))
        try:  # TPU slices too; a project without the TPU API (or access to it) still has its VMs swept
            tpus = self.tpu.gc(proj, live_cluster_ids, delete, list(regions) if regions else None)
        except GtrainError as e:
            tpus = GCResult([proj], warnings=[f"Cloud TPU slices not looked at: {e.message}"])
        res = sweep(self.teardown, self.project(gcp_options({"project": project} if project else {})),
                     live_cluster_ids, delete,
                     list(regions) if regions else None, self.report)
        res.orphans += tpus.orphans
        res.warnings += tpus.warnings
        res.deleted = res.deleted or tpus.deleted
        return res
