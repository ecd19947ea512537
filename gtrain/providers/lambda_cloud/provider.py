"""The lambda provider: :class:`LambdaProvider` plans from Lambda's live instance-type list (price, regions with
capacity), provisions region by region with the cluster's SSH key, describes, terminates by name, gives SSH
runners and prices each node interval at the price Lambda listed at launch.

Provisioning uploads the cluster's public key as the SSH key ``gtrain-<cluster id>``, then tries region after
region: each rank is launched as ``gtrain-<cluster id>-<rank>``; "insufficient capacity" (or a quota) in a
region terminates what that region got and moves on, and when every region failed, the key goes too and one
CapacityError (or QuotaError) lists the attempts. An elastic cluster (``num_nodes: {min, max}``) stops at the
first refused rank and keeps the ranks before it when they are at least ``min``; the others are launched later, as
capacity comes. A resumed ``up`` finds the nodes already there by name, and they pin the region.

Cost: Lambda bills by the minute at the type's ``price_cents_per_hour``; there is no spot market, and the nodes
do not end themselves (a powered-off Lambda instance is still billed until terminated): ``gtrain down``
ends the bill.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.errors import CapacityError, ConfigError, GtrainError, ProviderError, QuotaError
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan, partial_start
from gtrain.providers.cloud.billing import freeze_price, live_price
from gtrain.providers.cloud.failover import Attempts
from gtrain.providers.cloud.idle import idle_watch
from gtrain.providers.cloud.keys import drop_key, ensure_key, key_path
from gtrain.providers.cloud.provider import CloudProvider
from gtrain.providers.cloud.ssh_access import finish_down, wait_ssh, write_ssh_config
from gtrain.providers.lambda_cloud import types as lt
from gtrain.providers.lambda_cloud.api import LambdaAPI, NoAPIKey, Unreachable
from gtrain.providers.lambda_cloud.options import LambdaOptions, lambda_options
from gtrain.providers.lambda_cloud.teardown import LambdaTeardown, instance_name, key_name, owner_of_instance

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import VolumeInfo
    from gtrain.state import Cluster, CostInterval, StateStore
    from gtrain.state.nodes import NodeRecord

__all__ = ["LambdaProvider"]

STATES = {"booting": "pending", "active": "running", "unhealthy": "unhealthy", "terminating": "terminated",
          "terminated": "terminated", "preempted": "preempted"}
#: statuses from which an instance never becomes active: a launch waiting on one has lost that node
LOST = ("terminating", "terminated", "unhealthy", "preempted")


class LambdaProvider(CloudProvider):
    name = "lambda"
    gc_scope: ClassVar[str | None] = "region"
    nodes_enforce_limits: ClassVar[bool] = False
    #: Lambda Cloud's API launches and terminates instances, nothing between
    can_stop: ClassVar[bool] = False
    cannot_stop_why: ClassVar[str | None] = "Lambda Cloud has no stop: an instance bills until it is terminated"

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, api: LambdaAPI | None = None,
                 max_workers: int = 32) -> None:
        super().__init__(store, report, max_workers=max_workers)
        self.api = api or LambdaAPI()
        self.teardown = LambdaTeardown(self.api, self.ledger, report)
        from gtrain.providers.lambda_cloud.volumes import LambdaVolumes

        self.volumes = LambdaVolumes(self.api, store, report)

    def _opts(self, cluster: Cluster) -> LambdaOptions:
        return lambda_options(cluster.spec.get("lambda"))

    # ---- plan ----

    def _types(self, offline_ok: bool) -> tuple[list[lt.LambdaType], str | None]:
        """The live list, or (offline_ok, no key / no network) the bundled snapshot and its date."""
        try:
            return lt.parse(self.api.instance_types()), None
        except (NoAPIKey, Unreachable):
            if not offline_ok:
                raise
            types, date = lt.snapshot()
            return types, date

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = lambda_options(spec.section("lambda"))
        res = spec.resources
        if res.use_spot:
            raise ConfigError("resources.use_spot: Lambda Cloud has no spot instances (on-demand only)",
                              hint="set use_spot: false, or use a provider with spot capacity (aws, gcp)",
                              field="resources.use_spot")
        if res.image_id:
            raise ConfigError("resources.image_id: Lambda Cloud boots its own Lambda Stack image (Ubuntu, CUDA, "
                              "PyTorch)", hint="leave resources.image_id out; use job.image for a container",
                              field="resources.image_id")
        given = lt.check_regions(res)
        types, snap = self._types(offline_ok=True)
        t = lt.choose(types, res, given)
        notes = [f"{t.name}: {t.description}, {t.vcpus} vCPUs, {t.memory_gib:g} GiB (its local disk comes with "
                 "the type: resources.disk_gb does not apply)"]
        if snap is not None:
            notes.append(f"OFFLINE: no Lambda API key or network; price from gtrain's bundled snapshot of "
                         f"{snap}, capacity unknown (set LAMBDA_API_KEY for the live list)")
            regions = given
        else:
            notes.append(f"${t.price:g}/h from Lambda's live instance-type list; billed by the minute")
            regions = given or t.regions
            cap = [r for r in regions if r in t.regions]
            notes.append(f"capacity now in: {', '.join(t.regions) or 'no region'}" if not given else
                         f"capacity now in {', '.join(cap) or 'none of the regions given'}")
        if len(regions) > 1:
            notes.append(f"on insufficient capacity: next region ({', '.join(regions[1:])})")
        if spec.policies.max_hours or spec.policies.max_cost_usd:
            notes.append("Lambda instances do not end themselves: policies.max_hours / max_cost_usd bound the "
                         "estimate only; `gtrain down` ends the bill")
        if spec.policies.idle_minutes:
            notes.append("policies.idle_minutes runs lambda.idle_command; powering off does not stop Lambda's "
                         "billing (only terminating does)")
        if opts.ssh_proxy_command:
            notes.append("nodes are reached through lambda.ssh_proxy_command")
        if spec.volumes:  # Lambda file systems (gtrain/providers/lambda_cloud/volumes.py)
            from gtrain.providers.lambda_cloud.volumes import check_spec, plan_notes

            check_spec(spec, opts.file_system_names)
            notes += plan_notes(spec, regions[0] if regions else None)
        return Plan(provider="lambda", num_nodes=spec.num_nodes, instance_type=t.name, market="on-demand",
                    region=regions[0] if regions else None, gpu_name=t.gpu_name, gpus_per_node=t.gpus,
                    price_per_hour=t.price, max_hours=spec.policies.max_hours, notes=notes)

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        opts = lambda_options(spec.section("lambda"))
        given = lt.check_regions(spec.resources)
        types, _ = self._types(offline_ok=False)
        t = lt.choose(types, spec.resources, given)
        regions = given or t.regions
        existing: dict[int, dict[str, Any]] = {}
        for inst in self.teardown.instances(cluster.id):
            own = owner_of_instance(inst.get("name"))
            if own and 0 <= own[1] < spec.num_nodes and inst.get("status") not in ("terminating", "preempted"):
                existing[own[1]] = inst
        if existing:
            pinned = str((next(iter(existing.values())).get("region") or {}).get("name") or "")
            regions = [pinned]
            self.report.info(f"found {len(existing)} of {spec.num_nodes} node(s) of {cluster.name} in {pinned}")
        if spec.volumes:  # before anything is made: refused (exit 2), or the region the file system pins
            from gtrain.providers.lambda_cloud.volumes import check_spec

            check_spec(spec, opts.file_system_names)
            fs_region = self.volumes.prepare(spec, cluster, regions)
            regions = [fs_region] if fs_region else regions[:1]
            if regions:
                self.report.info(f"volumes: the nodes go to {regions[0]}, where the file system is (or is made)")
                records = self.volumes.ensure(spec, regions[0])
                fresh = self.store.get_cluster_by_id(cluster.id)
                with self.ledger.lock:
                    self.store.update_cluster(cluster.id, extra={**(fresh or cluster).extra, "volumes": records})
                opts = opts.model_copy(update={"file_system_names": [
                    *opts.file_system_names, *[str(r["file_system"]) for r in records]]})
        key, made_key = self._ensure_key(cluster)
        attempts = Attempts()
        if not regions:
            attempts.add("all regions", CapacityError(f"Lambda lists no region with capacity for {t.name}"))
        for region in regions:
            made: list[str] = []
            # the $/h up freezes: price_cents_per_hour of the live GET /instance-types read just now (live)
            freeze_price(self.store, cluster, plan, live_price(t.price, "lambda instance-types", region), self.report)
            try:
                nodes = self._launch_region(spec, cluster, opts, t, region, key, existing, made)
            except (CapacityError, QuotaError) as e:
                attempts.add(region, e)
                self.report.warn(f"{region}: {e.message}; trying the next region")
                self._undo(cluster, made, None)
                continue
            except BaseException:
                self._undo(cluster, made, key if made_key and not existing else None)
                raise
            self._record(spec, cluster, plan, opts, t, region, nodes)
            if opts.wait_ssh:
                wait_ssh(cluster, self.ledger, self.report, host_keys=lambda node: [], host_key_wait_s=0,
                         ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=self.max_workers,
                         key_source="Lambda (it publishes none)",
                         hint="check lambda.ssh_user / lambda.ssh_proxy_command and the account's firewall "
                              "rules (port 22); `gtrain down` removes the instances")
                self._link_volumes(cluster)
            elif spec.volumes:
                self.report.warn("volumes: the file system is attached but `mount` is not linked to it: "
                                 "lambda.wait_ssh is false (it is at /lambda/nfs/gtrain-NAME on each node)")
            idle_watch(spec, opts, self.runners(cluster), self.report, self.max_workers, cluster=cluster,
                           limits=self.nodes_enforce_limits)
            return
        if not existing:
            self._undo(cluster, [], key if made_key else None)
        attempts.fail(f"{spec.num_nodes}x {t.name}", quota_hint="ask Lambda support for a higher limit",
                      capacity_hint="add regions (resources.regions), pick another GPU, or try again later; "
                                    "nothing was left running")

    def _link_volumes(self, cluster: Cluster) -> None:
        """Each node's ``mount`` made a link to where Lambda mounted the file system (exit 2 when taken)."""
        from gtrain.providers.lambda_cloud.volumes import link_script

        fresh = self.store.get_cluster_by_id(cluster.id)
        records = [r for r in (fresh or cluster).extra.get("volumes") or [] if isinstance(r, dict)]
        if not records:
            return
        script = link_script(records)
        for r in self.runners(cluster):
            res = r.run(script, timeout=180, check=False)
            if res.rc != 0:
                what = (res.stdout.strip().splitlines() or [""])[-1]
                raise ConfigError(f"volumes: could not link the mount on {r.label}: {what or res.stderr.strip()[-200:]}"
                                  " (TAKEN: something else is at the mount; MISSING: Lambda did not mount it)",
                                  hint="pick another mount, or `gtrain down` and look at the instance",
                                  field="volumes")

    def _ensure_key(self, cluster: Cluster) -> tuple[str, bool]:
        """The cluster's SSH key on Lambda (``gtrain-<id>``): uploaded when missing; returns (name, made now)."""
        name = key_name(cluster.id)
        pub = ensure_key(cluster.id)
        if any(k.get("name") == name for k in self.api.ssh_keys()):
            return name, False
        rid = self.ledger.record(cluster, "ssh-key", name, "global")
        try:
            made = self.api.add_ssh_key(name, pub)
        except GtrainError:
            self.ledger.mark(rid, "not-created")
            raise
        self.ledger.mark(rid, "created", meta={"id": made.get("id")})
        return name, True

    def _launch_region(self, spec: ClusterSpec, cluster: Cluster, opts: LambdaOptions, t: lt.LambdaType,
                       region: str, key: str, existing: dict[int, dict[str, Any]],
                       made: list[str]) -> dict[int, dict[str, Any]]:
        """Launch the missing ranks in ``region`` (ids appended to ``made`` as they come) and wait until every
        node is active with an address."""
        ids = {rank: str(i["id"]) for rank, i in existing.items()}
        for rank in range(spec.num_nodes):
            if rank in ids:
                continue
            name = instance_name(cluster.id, rank)
            rid = self.ledger.record(cluster, "instance", name, region, meta={"name": name})
            try:
                got = self.api.launch(region, t.name, key, name, opts.file_system_names)
            except GtrainError as e:
                self.ledger.mark(rid, "not-created")
                # an elastic start keeps what came up when the rest found no capacity (at least num_nodes.min);
                # the launches are one by one, in rank order, so the ranks after this one are not asked for
                recorded = {n.rank for n in self.store.node_records(cluster.id)}  # a replacement: never pending
                start = partial_start(spec, sorted(existing), sorted(set(ids) - set(existing)), {rank: e},
                                      recorded & set(range(rank, spec.num_nodes)))
                if start is None:
                    raise
                self.report.warn(start.note(region, len(ids), spec))
                break
            if not got:
                self.ledger.mark(rid, "not-created")
                raise ProviderError(f"launch {t.name} in {region}: Lambda returned no instance id")
            made.append(got[0])
            self.ledger.mark(rid, "created", ref=got[0], meta={"name": name})
            ids[rank] = got[0]
            self.report.node(rank, f"launched {got[0]} ({t.name}, {region})")
        deadline = time.monotonic() + opts.boot_timeout_s
        out: dict[int, dict[str, Any]] = {}
        while len(out) < len(ids):
            live = {str(i.get("id")): i for i in self.api.instances()}  # one call a round, not one per node
            for rank, iid in sorted(ids.items()):
                if rank in out:
                    continue
                inst = live.get(iid)
                st = (inst or {}).get("status")
                if inst is None or st in LOST:
                    raise ProviderError(f"{iid} ({instance_name(cluster.id, rank)}) in {region} is "
                                        f"{st or 'gone'} before it became active")
                if st == "active" and inst.get("ip"):
                    out[rank] = inst
            if len(out) < len(ids):
                if time.monotonic() > deadline:
                    raise ProviderError(f"{region}: instances not active after {opts.boot_timeout_s:g} s",
                                        hint="raise lambda.boot_timeout_s; nothing was left running")
                time.sleep(opts.poll_s)
        return out

    def _record(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: LambdaOptions, t: lt.LambdaType,
                region: str, nodes: dict[int, dict[str, Any]]) -> None:
        from gtrain.state.nodes import NodeRecord
        from gtrain.state.sshtarget import SSHTarget

        known = {n.rank: n for n in self.ledger.nodes(cluster.id)}
        for rank, inst in sorted(nodes.items()):
            old = known.get(rank)
            if old is not None and old.instance_id == inst["id"]:
                continue  # a resumed up: the node is recorded already, with its own price and start
            meta = {"region": region, "instance_type": t.name, "price_per_hour": t.price, "name": inst.get("name"),
                    "public_ip": inst.get("ip"), "private_ip": inst.get("private_ip"), "ssh_user": opts.ssh_user,
                    "key_file": str(key_path(cluster.id)), "proxy_command": opts.ssh_proxy_command}
            self.ledger.put_node(cluster.id, NodeRecord(
                rank=rank, status="up", address=inst.get("private_ip") or inst.get("ip"), instance_id=inst["id"],
                ssh=SSHTarget(host=str(inst["ip"]), port=22, user=opts.ssh_user,
                              identity_file=str(key_path(cluster.id)), proxy_command=opts.ssh_proxy_command),
                launched_at=time.time(), extra=meta))
        plan.region, plan.price_per_hour = region, t.price
        with self.ledger.lock:
            self.store.update_cluster(cluster.id, region=region, price_per_hour=t.price)
        write_ssh_config(self.ledger, self.report)

    def _undo(self, cluster: Cluster, made: list[str], key: str | None) -> None:
        """Delete what a failed attempt made (best effort: the first error is the one to report)."""
        try:
            self.teardown.terminate(made, cluster)
            if key is not None:
                self.teardown.delete_keys(cluster.id, cluster)
                drop_key(cluster.id)
        except GtrainError as e:
            self.report.warn(f"could not clean up after the failed attempt: {e.message}")

    # ---- describe / terminate / price / gc ----

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        out: list[NodeStatus] = []
        live = {str(i.get("id")): i for i in self.api.instances()}  # one call (Lambda allows 1 request/s)
        for node in self.store.node_records(cluster.id):
            inst = live.get(node.instance_id or "")
            if inst is None:
                out.append(NodeStatus(node.rank, "missing", node.address, f"{node.instance_id}: no such instance"))
                continue
            st = str(inst.get("status") or "")
            out.append(NodeStatus(node.rank, STATES.get(st, st), node.address, f"{inst.get('name')}: {st}"))
        return out

    def ended_at(self, cluster: Cluster) -> dict[int, float]:
        return {}  # Lambda nodes enforce no limit: they bill until terminated

    def terminate(self, cluster: Cluster) -> None:
        known = [n.instance_id for n in self.store.node_records(cluster.id) if n.instance_id]
        left = self.teardown.teardown(cluster.id, cluster, known)
        finish_down(self.ledger, self.report, cluster, left, f"named for cluster {cluster.id}",
                    "gtrain gc --provider lambda --yes")
        if cluster.spec.get("volumes"):  # the file systems stay (a standing charge)
            for v in self.volumes.kept(cluster):
                self.report.info(f"volume {v.name} (file system {v.extra.get('file_system')}, {v.region}) is kept: "
                                 f"{v.size_gb or 0} GiB used at ${v.usd_per_gb_month:g}/GB-month "
                                 f"(${v.usd_per_month:g}/month) until `gtrain volume delete {v.name}`")

    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        if node.instance_id:
            self.teardown.terminate([node.instance_id], cluster)

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        stop = interval.stopped_at or time.time()
        seconds = max(0.0, stop - interval.started_at)
        minutes = math.ceil(seconds / 60.0) if seconds > 0 else 0
        rate = interval.price_per_hour
        return IntervalCost(round(minutes * rate / 60.0, 6), estimate=False,
                            note=f"${rate:g}/h, Lambda's price at launch "
                                 f"{cluster.extra.get('price_source') or ''}; billed by the minute ({minutes} min)")

    # ---- volumes (gtrain volume: gtrain/runs/volumes.py) ----

    def volume_list(self, regions: list[str] | None, **options: str | None) -> list[VolumeInfo]:
        return self.volumes.list_all(list(regions) if regions else None)

    def volume_create(self, spec: ClusterSpec, name: str) -> VolumeInfo:
        from gtrain.providers.lambda_cloud.volumes import check_spec

        check_spec(spec, lambda_options(spec.section("lambda")).file_system_names)
        region = self.plan(spec).region
        if region is None:
            raise ConfigError("resources.region: no region to make the file system in (none has capacity now)",
                              hint="set resources.region", field="resources.region")
        found = self.volumes.find(name)
        [rec] = self.volumes.ensure(spec, str((found or {}).get("region", {}).get("name") or region), only=name)
        fs = next(f for f in self.api.file_systems() if f.get("id") == rec["id"])
        return self.volumes.info(fs, self.api.instances())

    def volume_delete(self, name: str, regions: list[str] | None, **options: str | None) -> VolumeInfo | None:
        return self.volumes.delete(name, list(regions) if regions else None)

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Instances and SSH keys named ``gtrain-<cluster id>...`` that no live cluster owns (instances in
        ``regions`` only, when given)."""
        return self.teardown.sweep(live_cluster_ids, delete, list(regions) if regions else None)
