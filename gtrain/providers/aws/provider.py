"""The aws provider: :class:`AWSProvider` plans from the catalog, provisions with failover (zone by zone, then
region by region; a failed attempt leaves nothing behind), describes, terminates, gives SSH runners, prices each
node's running interval and sweeps orphans (``gtrain gc``). It is composed of parts, each given the shared EC2
clients, :class:`~gtrain.providers.cloud.ledger.Ledger` and reporter explicitly: :class:`.network.AWSNetwork`,
:class:`.instances.AWSInstances`, :class:`.teardown.AWSTeardown` and :class:`.pricing.AWSPricing`; the EC2
clients and the error translation live in :mod:`.api`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.catalog import snapshot_date
from gtrain.errors import CapacityError, ConfigError, GtrainError, QuotaError
from gtrain.events import SILENT, Reporter
from gtrain.providers.aws import api
from gtrain.providers.aws.api import LIVE_STATES, TAG_CLUSTER, TAG_RANK
from gtrain.providers.aws.instances import AWSInstances
from gtrain.providers.aws.network import AWSNetwork, Region
from gtrain.providers.aws.options import AWSOptions, aws_options
from gtrain.providers.aws.power import AWSPower
from gtrain.providers.aws.pricing import EBS_GP3_BY_REGION, EBS_GP3_USD_PER_GB_MONTH, AWSPricing, ebs_rate
from gtrain.providers.aws.teardown import AWSTeardown
from gtrain.providers.aws.volumes import AWSVolumes
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan
from gtrain.providers.cloud.billing import freeze_price
from gtrain.providers.cloud.failover import Attempts
from gtrain.providers.cloud.idle import idle_watch
from gtrain.providers.cloud.keys import drop_key
from gtrain.providers.cloud.lifetime import lifetime_note, lifetime_s
from gtrain.providers.cloud.provider import CloudProvider
from gtrain.providers.cloud.ssh_access import finish_down, resolve_ssh_cidr, ssh_notes
from gtrain.state import Cluster, CostInterval

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import VolumeInfo
    from gtrain.state import StateStore
    from gtrain.state.nodes import NodeRecord

__all__ = ["EBS_GP3_BY_REGION", "EBS_GP3_USD_PER_GB_MONTH", "AWSProvider"]


def _in_region(zone: str, region: str) -> bool:
    """``us-east-1a`` is in ``us-east-1`` (a zone is its region's name and a letter)."""
    return zone.startswith(region) and zone[len(region):].isalpha()


def _home_zone(found: list[dict[str, Any]]) -> str:
    """The zone of a cluster's nodes already there: node 0's (where the placement group is), else the first's."""
    zone_of = {api.tagdict(i).get(TAG_RANK): i["Placement"]["AvailabilityZone"] for i in found}
    return str(zone_of.get("0") or found[0]["Placement"]["AvailabilityZone"])


def _failover_zones(home: str, zones: list[str] | None) -> list[str] | None:
    """Where an elastic cluster's missing nodes may go: ``home`` first, then the spec's other zones (None: every
    zone of the region that offers the type, as for ``up``)."""
    return None if zones is None else [home, *(z for z in zones if z != home)]


@dataclass
class _Target:
    region: str
    zones: list[str] | None  # None: every zone that offers the type


class AWSProvider(CloudProvider):
    name = "aws"
    gc_scope: ClassVar[str | None] = "region"
    rearms_lifetime: ClassVar[bool] = True  # shutdown_user_data runs at first boot only

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, session: Any = None,
                 client_config: Any = None, max_workers: int = 32) -> None:
        super().__init__(store, report, max_workers=max_workers)
        self.clients = api.EC2Clients(session, client_config)
        self.network = AWSNetwork(self.clients, self.ledger, report)
        self.instances = AWSInstances(self.clients, self.ledger, report, max_workers)
        self.teardown = AWSTeardown(self.clients, self.ledger, report)
        self.pricing = AWSPricing(self.clients, self.billing_minimum_s)
        self.power = AWSPower(self.clients, report)
        self.volumes = AWSVolumes(self.clients, self.ledger, report)

    # ---- plan ----

    def plan(self, spec: ClusterSpec) -> Plan:
        from gtrain.catalog import lookup, resolve

        opts = aws_options(spec.aws)
        res = spec.resources
        market = "spot" if res.use_spot else "on-demand"
        regions = res.region_list()
        if res.regions and res.region and res.region not in res.regions:
            raise ConfigError(f"resources.region: {res.region!r} is not in resources.regions",
                              hint="give one or the other", field="resources.region")
        if (opts.vpc_id or opts.subnet_ids) and len(regions) != 1:
            fld = "aws.subnet_ids" if opts.subnet_ids else "aws.vpc_id"
            raise ConfigError(f"{fld}: VPC and subnet ids belong to one region, and the spec names "
                              + (f"{len(regions)} ({', '.join(regions)})" if regions else "none"),
                              hint="set resources.region to the region of the VPC", field=fld)
        first = regions[0] if regions else None
        field_name = "resources.regions[0]" if res.regions else "resources.region"
        try:
            offer = resolve("aws", res.accelerators, res.instance_type, first, res.use_spot)
        except ConfigError as e:
            if e.field == "resources.region" and res.regions:
                e.field = field_name
                e.message = e.message.replace("resources.region:", f"{field_name}:", 1)
            raise
        if not regions:
            # no region asked for: the cheapest first, then every other catalog region with the type
            regions = [o.region for o in sorted(lookup("aws", offer.instance_type),
                                                key=lambda o: (o.price(res.use_spot), o.region))]
            if res.zones:  # zones pinned without a region: their regions, not the cheapest elsewhere
                regions = [r for r in regions if any(_in_region(z, r) for z in res.zones)] or regions
        for i, r in enumerate(regions):
            if not lookup("aws", offer.instance_type, r):
                where = sorted({o.region for o in lookup("aws", offer.instance_type)})
                raise ConfigError(
                    f"resources.regions[{i}]: {offer.instance_type} is not offered in {r}; "
                    f"it is in {', '.join(where)}", hint="drop that region or pick another type",
                    field=f"resources.regions[{i}]",
                )
        zones = list(res.zones or [])
        for i, z in enumerate(zones):
            if not any(z.startswith(r) and len(z) > len(r) for r in regions):
                raise ConfigError(f"resources.zones[{i}]: {z!r} is not a zone of {', '.join(regions)}",
                                  hint="zones are the region name plus a letter, e.g. us-east-1a",
                                  field=f"resources.zones[{i}]")
        price_offer = lookup("aws", offer.instance_type, regions[0])[0]
        notes = [f"{offer.vcpus} vCPUs, {offer.memory_gib:g} GiB, {offer.gpu_count}x {offer.gpu_name} "
                 f"{offer.gpu_memory_gib:g} GB" + (", EFA" if self._efa(opts, price_offer.efa) else "")]
        if res.use_spot:
            notes.append(f"spot $/h here is the catalog's estimate (on-demand {price_offer.price_ondemand:g} $/h); "
                         "`up` freezes the zone's live spot price, and the cost report reads the spot price history "
                         "over each node's running time")
        notes.append(f"prices from the gtrain catalog, snapshot {snapshot_date('aws')} "
                     "(`gtrain catalog --refresh` updates them)")
        notes.append(f"plus EBS gp3 {res.disk_gb} GB per node at ${ebs_rate(regions[0]):g}/GB-month")
        if len(regions) > 1:
            notes.append(f"on no capacity: next zone, then {', '.join(regions[1:])}")
        notes += ssh_notes(opts.ssh_cidr, opts.ssh_proxy_command, "aws")
        if spec.volumes:  # EBS: one zone of the first region (gtrain/providers/aws/volumes.py)
            from gtrain.providers.aws.volumes import check_sizes, plan_notes

            check_sizes(spec)
            notes += plan_notes(spec, regions[0])
        notes += lifetime_note(lifetime_s(spec.policies, spec.num_nodes, price_offer.price(res.use_spot)),
                               "a shutdown the node schedules at boot; shutdown from inside = terminate")
        return Plan(
            provider="aws", num_nodes=spec.num_nodes, instance_type=offer.instance_type, market=market,
            region=regions[0], zone=zones[0] if zones else None, gpu_name=offer.gpu_name,
            gpus_per_node=offer.gpu_count, price_per_hour=price_offer.price(res.use_spot),
            max_hours=spec.policies.max_hours, notes=notes,
        )

    @staticmethod
    def _efa(opts: AWSOptions, catalog_efa: bool) -> bool:
        return catalog_efa if opts.efa is None else opts.efa

    def _targets(self, spec: ClusterSpec, plan: Plan) -> list[_Target]:
        from gtrain.catalog import lookup

        regions = spec.resources.region_list() or [
            o.region for o in sorted(lookup("aws", plan.instance_type or ""),
                                     key=lambda o: (o.price(spec.resources.use_spot), o.region))]
        zones = spec.resources.zones
        out = []
        for r in regions:
            zs = [z for z in zones if z.startswith(r)] if zones else None
            if zs == []:
                continue
            out.append(_Target(r, zs))
        return out

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        from gtrain.catalog import lookup

        opts = aws_options(spec.aws)
        itype = plan.instance_type or ""
        targets = self._targets(spec, plan)
        ssh_cidr = resolve_ssh_cidr(opts.ssh_cidr, opts.ssh_proxy_command, "aws", " (SSM)")
        if spec.volumes:  # before anything is made: refused (exit 2) or the zone an existing volume pins
            from gtrain.providers.aws.gc import default_regions

            pinned = self.volumes.prepare(spec, cluster, targets[0].region, default_regions(self.store), opts.profile)
            targets = [_Target(targets[0].region, [pinned] if pinned else targets[0].zones)]
            if pinned:
                self.report.info(f"volumes: the nodes go to {pinned}, where the volumes are")
        # a resumed `up`: the nodes already there pin the region and zone (a placement group is one zone). An
        # elastic cluster's missing nodes (growth, replacement) may go to the region's other zones when that one
        # has no capacity: same VPC and security group, outside the placement group (_failover_zones)
        existing: dict[int, dict[str, Any]] = {}
        home: str | None = None
        for t in targets:
            found = self.clients.find_instances(t.region, cluster.id, opts.profile)
            if found:
                zone = home = _home_zone(found)
                targets = [_Target(t.region, _failover_zones(zone, t.zones) if spec.elastic else [zone])]
                unranked: list[dict[str, Any]] = []
                for inst in found:
                    if inst["Placement"]["AvailabilityZone"] != zone and not spec.elastic:
                        continue
                    tag = api.tagdict(inst).get(TAG_RANK)
                    if tag is None:  # made by a batch whose `up` died before tagging ranks
                        unranked.append(inst)
                    elif 0 <= int(tag) < spec.num_nodes and int(tag) not in existing:
                        existing[int(tag)] = inst
                extra = self.instances.adopt(spec, unranked, existing)
                self.report.info(f"found {len(existing)} of {spec.num_nodes} node(s) of {cluster.name} in {zone}"
                                 + (f" ({len(unranked) - len(extra)} without a rank, adopted)" if unranked else ""))
                if extra:
                    self.teardown.terminate_ids(cluster, t.region, extra, opts.profile)
                break
        attempts = Attempts()
        for t in targets:
            offer = lookup("aws", itype, t.region)
            if not offer:
                attempts.add(t.region, f"{itype} not in the catalog for this region")
                continue
            od_price, spot_price, efa = offer[0].price_ondemand, offer[0].price_spot, self._efa(opts, offer[0].efa)
            reg = Region(t.region)
            try:
                self.network.setup(spec, cluster, opts, reg, ssh_cidr, itype, t.zones)
            except (CapacityError, QuotaError) as e:
                attempts.add(t.region, e)
                self._undo_region(cluster, reg, opts)
                continue
            except BaseException:
                self._undo_region(cluster, reg, opts)
                raise
            zones = t.zones or list(reg.subnets)
            if home is not None:  # the nodes' zone first (its placement group), then the region's others
                zones = [home, *(z for z in zones if z != home and not efa)]
                if efa and spec.elastic:  # EFA's OS-bypass traffic stays in one subnet: no other zone
                    self.report.info(f"{home}: EFA cluster, its missing nodes are asked for in this zone only")
            if not zones:
                attempts.add(t.region, f"no zone with a default subnet offers {itype}")
                self._undo_region(cluster, reg, opts)
                continue
            for zone in zones:
                made: list[str] = []
                # the $/h up freezes: live for spot (this zone's price now), before the nodes' lifetime is set
                frozen = self.pricing.at_launch(cluster, t.region, zone, itype, spec.resources.use_spot, od_price,
                                                offer[0].price_spot, opts.profile)
                freeze_price(self.store, cluster, plan, frozen, self.report)
                spot_price = frozen.usd_per_hour if spec.resources.use_spot else spot_price
                try:
                    nodes = self.instances.launch_zone(spec, cluster, opts, reg, zone, itype, efa, existing, made,
                                                       in_group=home in (None, zone))
                except (CapacityError, QuotaError) as e:
                    attempts.add(f"{t.region}/{zone}", e)
                    self.report.warn(f"{zone}: {e.message}; "
                                     + ("trying the next region" if isinstance(e, QuotaError) else "trying elsewhere"))
                    self.teardown.terminate_ids(cluster, t.region, made, opts.profile)
                    if isinstance(e, QuotaError):
                        break
                    continue
                self.instances.record_nodes(spec, cluster, plan, opts, reg, zone, nodes, od_price, spot_price,
                                            home=home)
                vols = self.volumes.attach(spec, cluster, reg.name, zone, nodes[min(nodes)]["InstanceId"],
                                           opts.profile, opts.poll_s) if spec.volumes else []
                if opts.wait_ssh:
                    self.instances.wait_ssh(cluster, opts)
                self._mount(cluster, vols, opts.wait_ssh)
                idle_watch(spec, opts, self.runners(cluster), self.report, self.max_workers, cluster=cluster,
                           limits=self.nodes_enforce_limits)
                return
            self._undo_region(cluster, reg, opts)
        what = f"{spec.num_nodes}x {itype} ({plan.market})"
        if not existing:  # nothing of this cluster runs anywhere: its local key goes too
            drop_key(cluster.id)
        attempts.fail(what, quota_hint="request a quota increase, or add resources.regions",
                      capacity_hint="add zones or regions (resources.zones / resources.regions), try on-demand, "
                                    "or fewer nodes; nothing was left running")

    def remount_volumes(self, cluster: Cluster, reachable: bool) -> None:
        self._mount(cluster, list(cluster.extra.get("volumes") or []), reachable)

    def _mount(self, cluster: Cluster, vols: list[dict[str, Any]], reachable: bool) -> None:
        from gtrain.providers.aws.volumes import mount_script

        if vols and not reachable:
            self.report.warn("volumes attached to node 0 but not mounted: aws.wait_ssh is false (`gtrain exec` "
                             "can run the mount later; docs/volumes.md)")
        elif vols:
            self.runners(cluster)[0].run(mount_script(vols), timeout=300)

    def _undo_region(self, cluster: Cluster, reg: Region, opts: AWSOptions) -> None:
        """A region that gave nothing: delete what this cluster has there, unless nodes of it run there."""
        if not reg.created:
            return
        try:
            if self.clients.find_instances(reg.name, cluster.id, opts.profile):
                return
            left = self.teardown.teardown(reg.name, cluster.id, opts.profile, cluster=cluster)
        except GtrainError as e:
            self.report.warn(f"{reg.name}: could not clean up after the failed attempt: {e.message}")
            return
        if left:
            self.report.warn(f"{reg.name}: left after the failed attempt: {', '.join(left)}")

    # ---- describe ----

    def _regions_of(self, cluster: Cluster) -> list[str]:
        regions: list[str] = []

        def add(r: Any) -> None:
            if isinstance(r, str) and r and r not in regions:
                regions.append(r)

        add(cluster.region)
        for n in self.store.node_records(cluster.id):
            add(n.extra.get("region"))
        for res in self.store.resources(cluster.id):
            add(res.region)
        res_spec = cluster.spec.get("resources") or {}
        add(res_spec.get("region"))
        for r in res_spec.get("regions") or []:
            add(r)
        return regions

    def quota_check(self, spec: ClusterSpec, plan: Plan) -> str | None:
        """The account's EC2 vCPU quota for the family (Service Quotas) cannot hold ``plan`` in any region."""
        from gtrain import catalog
        from gtrain.providers.aws.quota import shortfall

        if not plan.instance_type:
            return None
        vcpus = next((o.vcpus for o in catalog.offers(provider="aws") if o.instance_type == plan.instance_type), None)
        if vcpus is None:
            return None
        session = self.clients.session(aws_options(spec.aws).profile)
        why: list[str] = []
        for region in spec.resources.region_list() or ([plan.region] if plan.region else []):
            short = shortfall(session, region, plan.instance_type, vcpus * plan.num_nodes, plan.market == "spot")
            if short is None:
                return None
            why.append(short)
        return "; ".join(why) or None

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        profile = api.profile_of(cluster)
        nodes = {n.rank: n for n in self.store.node_records(cluster.id)}
        found: dict[int, dict[str, Any]] = {}
        for region in self._regions_of(cluster):
            for inst in self.clients.find_instances(region, cluster.id, profile, states=[*LIVE_STATES, "terminated"]):
                rank = int(api.tagdict(inst).get(TAG_RANK, "-1"))
                node = nodes.get(rank)
                if node is not None and node.instance_id and inst["InstanceId"] != node.instance_id:
                    continue  # an older instance of that rank (a failed zone)
                found[rank] = inst
        out = []
        for rank in sorted(set(nodes) | set(found)):
            node = nodes.get(rank)
            got = found.get(rank)
            if got is None:
                out.append(NodeStatus(rank, "missing", node.address if node else None,
                                      "no instance tagged with this cluster and rank"))
                continue
            out.append(self._node_status(rank, got, node.address if node else None,
                                         by_gtrain=cluster.status in ("terminating", "terminated")
                                         or (node is not None and node.status in ("terminated", "deleted"))))
        return out

    @staticmethod
    def _node_status(rank: int, inst: dict[str, Any], address: str | None, by_gtrain: bool) -> NodeStatus:
        state = inst["State"]["Name"]
        reason = inst.get("StateReason") or {}
        code = str(reason.get("Code") or "")
        why = reason.get("Message") or inst.get("StateTransitionReason") or ""
        spot = inst.get("InstanceLifecycle") == "spot"
        addr = address or inst.get("PrivateIpAddress")
        if state in ("shutting-down", "terminated"):
            if code.startswith("Server.SpotInstance") or (spot and not by_gtrain):
                return NodeStatus(rank, "preempted", addr, f"{inst['InstanceId']}: {why or code}".strip())
            return NodeStatus(rank, "terminated", addr, f"{inst['InstanceId']}: {why or code}".strip())
        mapped = {"pending": "pending", "running": "running", "stopping": "stopped", "stopped": "stopped"}
        return NodeStatus(rank, mapped.get(state, state), addr, inst["InstanceId"])

    # ---- terminate ----

    def terminate(self, cluster: Cluster) -> None:
        profile = api.profile_of(cluster)
        ids_by_region: dict[str, set[str]] = {}
        for n in self.store.node_records(cluster.id):
            if n.instance_id and n.extra.get("region"):
                ids_by_region.setdefault(n.extra["region"], set()).add(n.instance_id)
        left: list[str] = []
        for region in self._regions_of(cluster):
            left += self.teardown.teardown(region, cluster.id, profile, known_ids=ids_by_region.get(region, set()),
                                  cluster=cluster)
        kept = self.volumes.release(cluster, profile, aws_options(cluster.spec.get("aws")).poll_s) \
            if cluster.spec.get("volumes") else []
        for v in kept:
            self.report.info(f"volume {v.name} ({v.id}) is kept: {v.size_gb} GB at ${v.usd_per_gb_month:g}/GB-month "
                             f"(${v.usd_per_month:g}/month) until `gtrain volume delete {v.name}`")
        finish_down(self.ledger, self.report, cluster, left, f"tagged {TAG_CLUSTER}={cluster.id}",
                    "gtrain gc --yes")

    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        region = node.extra.get("region") or cluster.region or ""
        if node.instance_id:
            self.teardown.terminate_ids(cluster, region, [node.instance_id], api.profile_of(cluster))

    # ---- stop / start ----

    def _by_region(self, cluster: Cluster, nodes: list[NodeRecord]) -> dict[str, dict[int, str]]:
        out: dict[str, dict[int, str]] = {}
        for n in nodes:
            if n.instance_id:
                out.setdefault(n.extra.get("region") or cluster.region or "", {})[n.rank] = n.instance_id
        return out

    def power_off(self, cluster: Cluster, nodes: list[NodeRecord]) -> None:
        poll = aws_options(cluster.spec.get("aws")).poll_s
        for region, ids in self._by_region(cluster, nodes).items():
            self.power.stop(region, api.profile_of(cluster), ids, poll)

    def power_on(self, cluster: Cluster, nodes: list[NodeRecord]) -> dict[int, dict[str, str | None]]:
        poll = aws_options(cluster.spec.get("aws")).poll_s
        out: dict[int, dict[str, str | None]] = {}
        for region, ids in self._by_region(cluster, nodes).items():
            for rank, inst in self.power.start(region, api.profile_of(cluster), ids, poll).items():
                out[rank] = {"private_ip": inst.get("PrivateIpAddress"), "public_ip": inst.get("PublicIpAddress")}
        return out

    def disk_price(self, cluster: Cluster, node: NodeRecord) -> tuple[float, str]:
        return ebs_rate(node.extra.get("region") or cluster.region), "EBS gp3"

    def reach(self, cluster: Cluster, node: NodeRecord) -> NodeRecord:
        from gtrain.providers.aws.instances import ssh_target

        node.ssh = ssh_target(node.extra, node.instance_id or "")
        return node

    def cloud_options(self, spec: ClusterSpec) -> AWSOptions:
        return aws_options(spec.aws)

    def wait_reachable(self, cluster: Cluster) -> None:
        self.instances.wait_ssh(cluster, aws_options(cluster.spec.get("aws")))

    # ---- attach ----

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        from gtrain.providers.aws.adopt import find_by_name

        return find_by_name(self, spec, regions or [self.plan(spec).region or "us-east-1"])

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        from gtrain.providers.aws.adopt import adopt

        adopt(self, spec, cluster, plan, region or plan.region or "us-east-1")

    # ---- price ----

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        node = next((n for n in self.store.node_records(cluster.id) if n.rank == interval.node_rank), None)
        return self.pricing.price(cluster, interval, node)

    # ---- volumes (gtrain volume: gtrain/runs/volumes.py) ----

    def volume_list(self, regions: list[str] | None, **options: str | None) -> list[VolumeInfo]:
        from gtrain.providers.aws.gc import default_regions

        return self.volumes.list_all(regions or default_regions(self.store), options.get("profile"))

    def volume_create(self, spec: ClusterSpec, name: str) -> VolumeInfo:
        vol = next(v for v in spec.volumes or [] if v.name == name)
        plan = self.plan(spec)
        return self.volumes.create(spec, vol, plan.region or "us-east-1", plan.zone, aws_options(spec.aws).profile)

    def volume_delete(self, name: str, regions: list[str] | None, **options: str | None) -> VolumeInfo | None:
        from gtrain.providers.aws.gc import default_regions

        return self.volumes.delete(name, regions or default_regions(self.store), options.get("profile"))

    # ---- gc ----

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Every resource tagged ``gtrain:cluster`` in ``regions`` (default: the catalog's and state's) that no
        live cluster owns; option ``profile`` (boto3's)."""
        from gtrain.providers.aws.gc import default_regions, sweep

        return sweep(self.teardown, list(regions) if regions else default_regions(self.store), live_cluster_ids,
                     delete, options.get("profile"), self.report)
