"""The nebius provider: :class:`NebiusProvider` plans a Nebius AI Cloud GPU VM per node (platform and preset from
``resources.accelerators`` or the ``nebius:`` section), provisions each with a managed boot disk from an image
family, one network interface on the given subnet and cloud-init that lets the cluster's key in, freezes the
price Nebius's calculator quotes for that very instance (``CalculatorService.Estimate``: live) or, when it cannot
answer, gtrain's dated table (an estimate), describes, terminates by label, gives SSH runners, and prices each
node interval at the frozen $/h (Nebius bills by the second).

More than one node: one GPU cluster (``GpuClusterService.Create`` on the platform's InfiniBand fabric), each
instance joining it (``spec.gpu_cluster.id``). ``resources.use_spot``: preemptible instances
(``preemptible {on_preemption: STOP}``); Nebius stops a preempted instance, which ``describe`` reports as
``preempted``, and gtrain's recovery replaces it (deletes it, makes the rank again in the same GPU cluster).
What is not built (docs/providers/nebius.md): ``gtrain stop``/``start``, volumes, time/cost limits enforced by
the nodes themselves.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.errors import ConfigError, GtrainError, ProviderError
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan, ProviderCheck
from gtrain.providers.cloud.billing import (
    FrozenPrice,
    cloud_interval_cost,
    freeze_price,
    live_or_catalog,
    live_price,
    price_fields,
)
from gtrain.providers.cloud.idle import idle_watch
from gtrain.providers.cloud.keys import drop_key, ensure_key, key_path
from gtrain.providers.cloud.provider import CloudProvider
from gtrain.providers.cloud.ssh_access import finish_down, wait_ssh, write_ssh_config
from gtrain.providers.nebius import gpus as ng
from gtrain.providers.nebius.api import NebiusAPI, instance_request
from gtrain.providers.nebius.options import NebiusOptions, nebius_options
from gtrain.providers.nebius.teardown import (
    LABEL,
    RANK_LABEL,
    NebiusTeardown,
    gpu_cluster_name,
    instance_name,
    owner_of,
)

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval, StateStore
    from gtrain.state.nodes import NodeRecord

__all__ = ["NebiusProvider", "cloud_init"]

STATES = {"CREATING": "pending", "STARTING": "pending", "UPDATING": "running", "RUNNING": "running",
          "STOPPING": "stopped", "STOPPED": "stopped", "DELETING": "terminated", "ERROR": "unhealthy"}
#: states from which an instance does not run by itself: ``up`` waiting on one has lost that node
LOST = ("STOPPING", "STOPPED", "DELETING", "ERROR")


def cloud_init(user: str, public_key: str, cluster_id: str) -> str:
    """The instance's cloud-init user data: ``user`` with the cluster's key and passwordless sudo."""
    return ("#cloud-config\n"
            "users:\n"
            f"  - name: {user}\n"
            "    sudo: ALL=(ALL) NOPASSWD:ALL\n"
            "    shell: /bin/bash\n"
            "    ssh_authorized_keys:\n"
            f"      - {public_key.strip()}\n"
            f"write_files:\n  - path: /etc/gtrain-cluster\n    content: {cluster_id}\n")


class NebiusProvider(CloudProvider):
    name = "nebius"
    gc_scope: ClassVar[str | None] = "region"
    #: "for GPUs on running VMs, the billing unit is 1 second" (docs.nebius.com, pricing)
    billing_minimum_s: ClassVar[float] = 0.0
    nodes_enforce_limits: ClassVar[bool] = False
    can_stop: ClassVar[bool] = False
    cannot_stop_why: ClassVar[str | None] = "gtrain does not stop and start Nebius instances yet"

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, api: NebiusAPI | None = None,
                 max_workers: int = 32) -> None:
        super().__init__(store, report, max_workers=max_workers)
        self.api = api or NebiusAPI()
        self.teardown = NebiusTeardown(self.api, self.ledger, report)

    @staticmethod
    def check(timeout: float) -> ProviderCheck:
        from gtrain.providers.nebius.check import check

        return check(timeout)

    def cloud_options(self, spec: ClusterSpec) -> NebiusOptions:
        return nebius_options(spec.section("nebius"))

    # ---- plan ----

    def _choose(self, spec: ClusterSpec, opts: NebiusOptions) -> tuple[ng.Platform, str]:
        res = spec.resources
        if res.image_id:
            raise ConfigError("resources.image_id: a Nebius boot disk is made from an image family",
                              field="resources.image_id", hint="leave it out; set nebius.image_family")
        if res.zones or res.regions or res.region:
            field = "resources.zones" if res.zones else "resources.regions" if res.regions else "resources.region"
            raise ConfigError(f"{field}: a Nebius instance goes where its project and subnet are",
                              field=field, hint="leave it out; nebius.project_id and nebius.subnet_id place it")
        return ng.choose(res, opts.platform, opts.preset)

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = nebius_options(spec.section("nebius"))
        plat, preset = self._choose(spec, opts)
        gpus = ng.gpu_count(preset)
        spot = spec.resources.use_spot
        price = plat.price(gpus, spot)
        notes = [f"{plat.id} {preset} ({gpus}x {plat.gpu} {plat.memory_gb} GB) in {opts.project_id}, subnet "
                 f"{opts.subnet_id}, image family {opts.image_family}",
                 f"${price:g}/h per node: gtrain's Nebius table (nebius.com/prices, {ng.PRICES_AS_OF}), an "
                 "estimate; `up` freezes the price Nebius's calculator quotes for the instance"]
        if spot:
            notes.append("preemptible: Nebius may stop a node at any time; gtrain's recovery replaces it")
        if spec.num_nodes > 1:
            notes.append(f"one GPU cluster (InfiniBand fabric {opts.infiniband_fabric or plat.fabrics[0]}) the "
                         f"{spec.num_nodes} instances join")
        if spec.policies.max_hours or spec.policies.max_cost_usd:
            notes.append("Nebius instances do not end themselves: policies.max_hours / max_cost_usd bound the "
                         "estimate only; `gtrain down` ends the bill")
        return Plan(provider="nebius", num_nodes=spec.num_nodes, instance_type=f"{plat.id}/{preset}",
                    market="spot" if spot else "on-demand", region=opts.project_id, gpu_name=plat.gpu,
                    gpus_per_node=gpus, price_per_hour=price, max_hours=spec.policies.max_hours, notes=notes)

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        opts = nebius_options(spec.section("nebius"))
        plat, preset = self._choose(spec, opts)
        fresh = not self.ledger.nodes(cluster.id) and not self.teardown.instances(opts.project_id, cluster.id)
        pub = ensure_key(cluster.id)
        try:
            group = self._gpu_cluster(spec, cluster, opts, plat) if spec.num_nodes > 1 else None
            price = self._price(spec, cluster, opts, plat, preset, pub, group)
            freeze_price(self.store, cluster, plan, price, self.report)
            made = self._launch(spec, cluster, opts, plat, preset, pub, group)
            self._record(cluster, plan, opts, made, price)
        except BaseException:
            if fresh:  # a failed first up leaves nothing behind (a resumed one keeps what it found)
                try:
                    self.teardown.teardown(opts.project_id, cluster.id, cluster)
                except GtrainError as e:
                    self.report.warn(f"could not clean up after the failed up: {e.message}")
                drop_key(cluster.id)
            raise
        if opts.wait_ssh:
            wait_ssh(cluster, self.ledger, self.report, host_keys=lambda node: [], host_key_wait_s=0,
                     ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=self.max_workers,
                     key_source="Nebius (it publishes none)",
                     hint="check nebius.image_family (cloud-init must run) and nebius.ssh_user; `gtrain down` "
                          "removes the instances")
        idle_watch(spec, opts, self.runners(cluster), self.report, self.max_workers, cluster=cluster,
                   limits=self.nodes_enforce_limits)

    def _labels(self, cluster_id: str, rank: int | None = None) -> dict[str, str]:
        out = {LABEL: cluster_id}
        if rank is not None:
            out[RANK_LABEL] = str(rank)
        return out

    def _gpu_cluster(self, spec: ClusterSpec, cluster: Cluster, opts: NebiusOptions, plat: ng.Platform) -> str:
        found = self.teardown.groups(opts.project_id, cluster.id)
        if found:
            return str(found[0]["id"])
        fabric = opts.infiniband_fabric or plat.fabrics[0]
        name = gpu_cluster_name(cluster.id)
        rid = self.ledger.record(cluster, "gpu-cluster", name, opts.project_id, meta={"fabric": fabric})
        try:
            gid = self.api.create_gpu_cluster(opts.project_id, name, self._labels(cluster.id), fabric)
        except GtrainError:
            self.ledger.mark(rid, "not-created")
            raise
        self.ledger.mark(rid, "created", ref=gid, meta={"fabric": fabric})
        self.report.info(f"created GPU cluster {gid} (InfiniBand fabric {fabric})")
        return gid

    def _request(self, spec: ClusterSpec, cluster: Cluster, opts: NebiusOptions, plat: ng.Platform, preset: str,
                 pub: str, group: str | None, rank: int) -> Any:
        return instance_request(
            project_id=opts.project_id, name=instance_name(cluster.id, rank), labels=self._labels(cluster.id, rank),
            platform=plat.id, preset=preset, subnet_id=opts.subnet_id, image_family=opts.image_family,
            disk_gb=spec.resources.disk_gb, disk_type=opts.disk_type,
            user_data=cloud_init(opts.ssh_user, pub, cluster.id), public_ip=opts.public_ip, gpu_cluster=group,
            preemptible=spec.resources.use_spot)

    def _price(self, spec: ClusterSpec, cluster: Cluster, opts: NebiusOptions, plat: ng.Platform, preset: str,
               pub: str, group: str | None) -> FrozenPrice:
        """The live price of rank 0's very create request (Nebius's calculator), else gtrain's table."""
        spot = spec.resources.use_spot
        table = FrozenPrice(plat.price(ng.gpu_count(preset), spot), False,
                            f"gtrain's Nebius table, nebius.com/prices {ng.PRICES_AS_OF}")

        def fetch() -> FrozenPrice:
            req = self._request(spec, cluster, opts, plat, preset, pub, group, 0)
            what = "nebius calculator" + (", preemptible" if spot else "")
            return live_price(self.api.hourly_price(req), what, opts.project_id)

        return live_or_catalog(fetch, table)

    def _launch(self, spec: ClusterSpec, cluster: Cluster, opts: NebiusOptions, plat: ng.Platform, preset: str,
                pub: str, group: str | None) -> dict[int, dict[str, Any]]:
        have: dict[int, dict[str, Any]] = {}
        lost: list[str] = []
        for inst in self.teardown.instances(opts.project_id, cluster.id):
            own = owner_of(inst)
            if own and 0 <= own[1] < spec.num_nodes:
                if inst.get("state") in LOST:
                    lost.append(str(inst["id"]))  # preempted or failed: its name is needed for the new one
                else:
                    have[own[1]] = inst
        if lost:
            self.report.info(f"deleting {len(lost)} stopped instance(s) to make them again: {', '.join(lost)}")
            self.teardown.delete(opts.project_id, lost, [], cluster)
        for rank in range(spec.num_nodes):
            if rank in have:
                continue
            req = self._request(spec, cluster, opts, plat, preset, pub, group, rank)
            name = instance_name(cluster.id, rank)
            rid = self.ledger.record(cluster, "instance", name, opts.project_id, meta={"name": name})
            try:
                iid = self.api.create_instance(req, f"create instance {name} ({plat.id} {preset})")
            except GtrainError:
                self.ledger.mark(rid, "not-created")
                raise
            self.ledger.mark(rid, "created", ref=iid, meta={"name": name})
            have[rank] = {"id": iid, "name": name}
            self.report.node(rank, f"created instance {iid} ({plat.id} {preset})")
        deadline = time.monotonic() + opts.boot_timeout_s
        ids = {rank: str(i["id"]) for rank, i in have.items()}
        out: dict[int, dict[str, Any]] = {}
        while True:
            live = {str(i["id"]): i for i in self.api.instances(opts.project_id)}
            for rank, iid in sorted(ids.items()):
                seen = live.get(iid)
                if seen is None or seen.get("state") in LOST:
                    raise ProviderError(f"instance {iid} ({instance_name(cluster.id, rank)}) is "
                                        f"{(seen or {}).get('state') or 'gone'} before it ran")
                if seen.get("state") == "RUNNING" and (seen.get("public_ip") or not opts.public_ip) \
                        and seen.get("private_ip"):
                    out[rank] = seen
            if len(out) == len(ids):
                return out
            if time.monotonic() > deadline:
                raise ProviderError(f"instances not running after {opts.boot_timeout_s:g} s",
                                    hint="raise nebius.boot_timeout_s; nothing was left running")
            time.sleep(opts.poll_s)

    def _record(self, cluster: Cluster, plan: Plan, opts: NebiusOptions, insts: dict[int, dict[str, Any]],
                price: FrozenPrice) -> None:
        from gtrain.state.nodes import NodeRecord
        from gtrain.state.sshtarget import SSHTarget

        known = {n.rank: n for n in self.ledger.nodes(cluster.id)}
        for rank, inst in sorted(insts.items()):
            old = known.get(rank)
            if old is not None and old.instance_id == inst["id"] and old.status != "terminated":
                continue  # a resumed up: recorded already, with its own price and start
            host = str(inst.get("public_ip") or inst.get("private_ip"))
            meta = {"region": opts.project_id, "instance_type": plan.instance_type, **price_fields(price),
                    "name": inst.get("name"), "public_ip": inst.get("public_ip"), "private_ip": inst.get("private_ip"),
                    "gpu_cluster": inst.get("gpu_cluster"), "preemptible": inst.get("preemptible"),
                    "ssh_port": opts.ssh_port, "ssh_user": opts.ssh_user, "key_file": str(key_path(cluster.id)),
                    "proxy_command": opts.ssh_proxy_command, "disk_gb": None}
            self.ledger.put_node(cluster.id, NodeRecord(
                rank=rank, status="up", address=str(inst.get("private_ip") or host), instance_id=str(inst["id"]),
                ssh=SSHTarget(host=host, port=opts.ssh_port, user=opts.ssh_user,
                              identity_file=str(key_path(cluster.id)), proxy_command=opts.ssh_proxy_command),
                launched_at=time.time(), extra=meta))
        write_ssh_config(self.ledger, self.report)

    # ---- attach (gtrain/providers/nebius/adopt.py) ----

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        from gtrain.providers.nebius.adopt import find_by_name

        return find_by_name(self, spec, regions)

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        from gtrain.providers.nebius.adopt import adopt

        adopt(self, spec, cluster, plan, region)

    # ---- describe / terminate / price / gc ----

    def _project(self, cluster: Cluster) -> str:
        from gtrain.spec import parse_spec

        spec = parse_spec(cluster.spec, base_dir=cluster.extra.get("base_dir"))
        return nebius_options(spec.section("nebius")).project_id

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        live = {str(i["id"]): i for i in self.api.instances(self._project(cluster))}
        out: list[NodeStatus] = []
        for node in self.store.node_records(cluster.id):
            found = live.get(node.instance_id or "")
            if found is None:
                out.append(NodeStatus(node.rank, "missing", node.address, f"{node.instance_id}: no such instance"))
                continue
            st = str(found.get("state") or "")
            status = STATES.get(st, st.lower())
            if status == "stopped" and found.get("preemptible"):
                status = "preempted"  # a preemptible instance stops only when Nebius takes it back
            out.append(NodeStatus(node.rank, status, node.address, f"{found.get('name')}: {st}"))
        return out

    def terminate(self, cluster: Cluster) -> None:
        known = [n.instance_id for n in self.store.node_records(cluster.id) if n.instance_id]
        left = self.teardown.teardown(self._project(cluster), cluster.id, cluster, known)
        finish_down(self.ledger, self.report, cluster, left, f"labelled {LABEL}={cluster.id}",
                    "gtrain gc --provider nebius --region <project id> --yes")

    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        if node.instance_id:
            self.teardown.delete(self._project(cluster), [node.instance_id], [], cluster)

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        node = next((n for n in self.store.node_records(cluster.id) if n.rank == interval.node_rank), None)
        frozen = node.extra if node is not None and node.extra.get("price_source") else cluster.extra
        return cloud_interval_cost(interval, minimum_s=self.billing_minimum_s, spot=None, disk_gb=0.0,
                                   disk_usd_per_gb_month=0.0, disk_label="boot disk", frozen=frozen)

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Instances and GPU clusters labelled for a cluster that no live cluster owns, in the projects
        ``regions`` (``--region project-...``; default: the project of each nebius cluster in state)."""
        projects = list(regions or [])
        if not projects:
            for c in self.store.list_clusters():
                if c.provider == "nebius":
                    try:
                        projects.append(self._project(c))
                    except GtrainError:
                        continue
        if not projects:
            raise ConfigError("gtrain gc --provider nebius: which project? Nebius lists by project",
                              field="--region", hint="--region project-e00... (`nebius iam project list`)")
        return self.teardown.sweep(sorted(set(projects)), live_cluster_ids, delete)
