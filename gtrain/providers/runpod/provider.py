"""The runpod provider: :class:`RunPodProvider` plans from RunPod's live GPU catalog (list price per GPU and
cloud), provisions one pod per rank with the cluster's SSH key in its ``PUBLIC_KEY``, describes, terminates by
tag, gives SSH runners (the pod's published ``22/tcp``: ``ssh.direct`` host and port), and prices each node
interval at the ``cost`` RunPod reported for the pod once it ran (the rate it bills, frozen at ``up``).

Provisioning tries the data centers of ``resources.regions`` in order (none given: RunPod's scheduler picks one):
each rank is created as ``gtrain-<cluster id>-<rank>``; a 400 on create ("could not be placed": RunPod's
capacity answer carries no code of its own) deletes what that data center got and moves on, a 402 (no balance)
stops at once, and when every candidate failed one CapacityError (or QuotaError) lists the attempts. A resumed
``up`` finds the pods already there by tag, and they pin the data center.

More than one node is one RunPod Instant Cluster (:mod:`.clusters`: ``POST /v2/clusters``, the members on one
private network in one data center, made and deleted together). What is not built (docs/providers/runpod.md):
interruptible (spot) pods (API v2 has none; REST v1's ``interruptible`` was retired on 2026-11-15), network
volumes, ``gtrain stop``/``start``, replacing one member of an Instant Cluster.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.errors import CapacityError, ConfigError, GtrainError, ProviderError, QuotaError
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan, ProviderCheck
from gtrain.providers.cloud.billing import freeze_price, live_price
from gtrain.providers.cloud.failover import Attempts
from gtrain.providers.cloud.idle import idle_watch
from gtrain.providers.cloud.keys import drop_key, ensure_key, key_path
from gtrain.providers.cloud.provider import CloudProvider
from gtrain.providers.cloud.ssh_access import finish_down, wait_ssh, write_ssh_config
from gtrain.providers.runpod import clusters as rc
from gtrain.providers.runpod import gpus as rg
from gtrain.providers.runpod.api import ENV_KEY, NoAPIKey, RunPodAPI, Unreachable
from gtrain.providers.runpod.options import RunPodOptions, runpod_options
from gtrain.providers.runpod.teardown import TAG_ENV, RunPodTeardown, owner_of_pod, pod_name

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval, StateStore
    from gtrain.state.nodes import NodeRecord

__all__ = ["RunPodProvider", "pod_body"]

STATES = {"PROVISIONING": "pending", "STARTING": "pending", "RUNNING": "running", "EXITED": "stopped",
          "ERROR": "unhealthy", "TERMINATED": "terminated"}
#: statuses from which a pod does not become RUNNING by itself: a launch waiting on one has lost that node
LOST = ("EXITED", "ERROR", "TERMINATED")
DATA_CENTER = re.compile(r"^[A-Z]{2,4}-[A-Z]{2}-\d+$")
SPOT_WHY = ("RunPod's API v2 creates on-demand pods only (no interruptible/spot field); REST v1's `interruptible` "
            "was retired on 2026-11-15, and GraphQL's podRentInterruptable goes with GraphQL (deprecated, retired "
            "in early 2027), so gtrain does not build on it")


def pod_body(cluster_id: str, rank: int, gpu_id: str, count: int, opts: RunPodOptions, public_key: str,
             disk_gb: int, data_center: str | None) -> dict[str, Any]:
    """The ``POST /v2/pods`` body of one rank (``CreatePodRequest``): the cluster's key as ``PUBLIC_KEY`` (RunPod's
    images put it in authorized_keys; no account key is uploaded), ``22/tcp`` published for direct SSH, and the
    cluster's tag in the name and the env."""
    body: dict[str, Any] = {
        "name": pod_name(cluster_id, rank), "image": opts.image, "gpu": {"id": gpu_id, "count": count},
        "cloud": opts.cloud, "ports": ["22/tcp"], "disk": disk_gb, "startSsh": True,
        "env": {"PUBLIC_KEY": public_key, TAG_ENV: cluster_id}}
    if data_center:
        body["dataCenterIds"] = [data_center]
    return body


def pod_price(pod: dict[str, Any]) -> float | None:
    """The pod's ``cost``: USD/h RunPod bills for it now (0.0 when EXITED or TERMINATED: then None)."""
    v = pod.get("cost")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def ssh_direct(pod: dict[str, Any]) -> tuple[str, int] | None:
    """(host, port) of the pod's published ``22/tcp`` (``ssh.direct``), None until it has one."""
    ssh: dict[str, Any] = pod["ssh"] if isinstance(pod.get("ssh"), dict) else {}
    d: dict[str, Any] = ssh["direct"] if isinstance(ssh.get("direct"), dict) else {}
    if not d.get("host") or not isinstance(d.get("port"), int):
        return None
    return str(d["host"]), int(d["port"])


class RunPodProvider(CloudProvider):
    name = "runpod"
    gc_scope: ClassVar[str | None] = "region"
    #: RunPod bills pods by the second (docs.runpod.io/pods/pricing), no minimum
    billing_minimum_s: ClassVar[float] = 0.0
    nodes_enforce_limits: ClassVar[bool] = False
    can_stop: ClassVar[bool] = False
    cannot_stop_why: ClassVar[str | None] = ("gtrain does not stop RunPod pods: a stopped pod keeps its disk but "
                                             "may find its GPU taken when started again")

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, api: RunPodAPI | None = None,
                 max_workers: int = 32) -> None:
        super().__init__(store, report, max_workers=max_workers)
        self.api = api or RunPodAPI()
        self.teardown = RunPodTeardown(self.api, self.ledger, report)

    @staticmethod
    def check(timeout: float) -> ProviderCheck:
        from gtrain.providers.runpod.check import check

        return check(timeout)

    def cloud_options(self, spec: ClusterSpec) -> RunPodOptions:
        return runpod_options(spec.section("runpod"))

    # ---- plan ----

    @staticmethod
    def _data_centers(spec: ClusterSpec) -> list[str]:
        res = spec.resources
        if res.zones:
            raise ConfigError("resources.zones: RunPod places pods by data center", field="resources.zones",
                              hint="give data center ids in resources.regions (e.g. US-TX-3, EU-RO-1)")
        if res.regions and res.region and res.region not in res.regions:
            raise ConfigError(f"resources.region: {res.region!r} is not in resources.regions",
                              hint="give one or the other", field="resources.region")
        given = res.region_list()
        for i, dc in enumerate(given):
            if not DATA_CENTER.match(dc):
                where = f"resources.regions[{i}]" if res.regions else "resources.region"
                raise ConfigError(f"{where}: {dc!r} is not a RunPod data center id", field=where,
                                  hint="e.g. US-TX-3, EU-RO-1, CA-MTL-1 (GET /v2/catalog/datacenters lists them)")
        return given

    def _choose(self, spec: ClusterSpec, opts: RunPodOptions, offline_ok: bool = False
                ) -> tuple[rg.GpuType, int, str | None]:
        """(type, GPUs per pod, the snapshot's date when the live list could not be had and ``offline_ok``)."""
        try:
            types, snap = rg.parse(self.api.gpu_types()), None
        except (NoAPIKey, Unreachable):
            if not offline_ok:
                raise
            types, snap = rg.snapshot()
        t, count = rg.choose(types, spec.resources, opts.cloud)
        return t, count, snap

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = runpod_options(spec.section("runpod"))
        res = spec.resources
        if spec.num_nodes > 1 and opts.cloud != "SECURE":
            raise ConfigError(f"runpod.cloud: {spec.num_nodes} nodes are one RunPod Instant Cluster, which its API "
                              "places without a cloud choice (RunPod's own data centers)", field="runpod.cloud",
                              hint="leave runpod.cloud out (SECURE), or num_nodes: 1")
        if spec.num_nodes > 1 and spec.min_nodes is not None and spec.min_nodes != spec.num_nodes:
            raise ConfigError("num_nodes: an elastic {min, max} run needs nodes added and removed one at a time; a "
                              "RunPod Instant Cluster has a fixed pod count, made and deleted whole",
                              field="num_nodes", hint="give num_nodes as one number on RunPod")
        if spec.num_nodes > rc.MAX_PODS:
            raise ConfigError(f"num_nodes: a RunPod Instant Cluster has at most {rc.MAX_PODS} pods",
                              field="num_nodes")
        if res.use_spot:
            raise ConfigError(f"resources.use_spot: {SPOT_WHY}", field="resources.use_spot",
                              hint="set use_spot: false (RunPod on-demand), or use a provider with spot capacity")
        if res.image_id:
            raise ConfigError("resources.image_id: a RunPod pod runs a container image", field="resources.image_id",
                              hint="leave resources.image_id out; set runpod.image")
        dcs = self._data_centers(spec)
        t, count, snap = self._choose(spec, opts, offline_ok=True)
        price = t.price(opts.cloud, count) or 0.0
        notes = [f"{count}x {t.id} ({t.name}, {t.memory_gb} GB) on RunPod's {opts.cloud} cloud, image {opts.image}",
                 f"${price:g}/h: RunPod's live list price (GET /v2/catalog/gpus); `up` freezes the cost RunPod "
                 "reports for the pod itself; billed by the second" if snap is None else
                 f"OFFLINE: no RunPod API key or network; ${price:g}/h from gtrain's bundled list of {snap} (an "
                 f"estimate), capacity unknown (set {ENV_KEY} for the live list)",
                 f"data center: {', '.join(dcs) if dcs else 'any (RunPod picks)'}"
                 + (f"; on no capacity: the next ({', '.join(dcs[1:])})" if len(dcs) > 1 else "")]
        if spec.num_nodes > 1:
            notes.append(f"one RunPod Instant Cluster (POST /v2/clusters, TRAINING): {spec.num_nodes} pods on one "
                         "private network in one data center, made and deleted together; a lost member is not "
                         "replaced alone")
        if spec.policies.max_hours or spec.policies.max_cost_usd:
            notes.append("RunPod pods do not end themselves: policies.max_hours / max_cost_usd bound the estimate "
                         "only; `gtrain down` ends the bill")
        return Plan(provider="runpod", num_nodes=spec.num_nodes, instance_type=t.id, market="on-demand",
                    region=dcs[0] if dcs else None, gpu_name=t.name, gpus_per_node=count, price_per_hour=price,
                    max_hours=spec.policies.max_hours, notes=notes)

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        opts = runpod_options(spec.section("runpod"))
        dcs = self._data_centers(spec)
        t, count, _ = self._choose(spec, opts)
        if spec.num_nodes > 1:
            self._provision_group(spec, cluster, plan, opts, dcs, t, count)
            return
        existing: dict[int, dict[str, Any]] = {}
        for pod in self.teardown.pods(cluster.id):
            own = owner_of_pod(pod)
            if own and 0 <= own[1] < spec.num_nodes and pod.get("status") not in LOST:
                existing[own[1]] = pod
        candidates: list[str | None] = list(dcs) or [None]
        if existing:
            pinned = next(iter(existing.values())).get("dataCenterId")
            candidates = [str(pinned) if pinned else None]
            self.report.info(f"found {len(existing)} of {spec.num_nodes} pod(s) of {cluster.name}"
                             + (f" in {pinned}" if pinned else ""))
        pub = ensure_key(cluster.id)
        attempts = Attempts()
        for dc in candidates:
            made: list[str] = []
            try:
                pods = self._launch(spec, cluster, opts, t, count, dc, pub, existing, made)
            except (CapacityError, QuotaError) as e:
                attempts.add(dc or "any data center", e)
                self._undo(cluster, made)
                if isinstance(e, QuotaError):
                    break  # 402: no balance, no candidate will succeed
                self.report.warn(f"{dc or 'any data center'}: {e.message}; trying the next")
                continue
            except BaseException:
                self._undo(cluster, made)
                raise
            self._record(spec, cluster, plan, opts, t.id, pods)
            self._reach(spec, cluster, opts)
            return
        if not existing:
            drop_key(cluster.id)
        attempts.fail(f"{spec.num_nodes}x {count}x {t.id}", quota_hint="add funds at "
                      "https://www.console.runpod.io/user/billing (RunPod wants an hour of credit per pod)",
                      capacity_hint="add data centers (resources.regions), pick another GPU or runpod.cloud, or "
                                    "try again later; nothing was left running")

    def _reach(self, spec: ClusterSpec, cluster: Cluster, opts: RunPodOptions) -> None:
        if opts.wait_ssh:
            wait_ssh(cluster, self.ledger, self.report, host_keys=lambda node: [], host_key_wait_s=0,
                     ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=self.max_workers,
                     key_source="RunPod (it publishes none)",
                     hint="check runpod.image (it must start sshd from PUBLIC_KEY) and runpod.ssh_user; "
                          "`gtrain down` removes the pods")
        idle_watch(spec, opts, self.runners(cluster), self.report, self.max_workers, cluster=cluster,
                   limits=self.nodes_enforce_limits)

    def _provision_group(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: RunPodOptions,
                         dcs: list[str], t: rg.GpuType, count: int) -> None:
        """``num_nodes`` > 1: one RunPod Instant Cluster, made whole in each data center tried (a resumed ``up``
        finds it by name and waits for it)."""
        existing = self.teardown.clusters(cluster.id)
        candidates: list[str | None] = list(dcs) or [None]
        if existing:
            candidates = [str(existing[0].get("dataCenterId") or "") or None]
            self.report.info(f"found RunPod cluster {existing[0]['id']} of {cluster.name}")
        pub = ensure_key(cluster.id)
        attempts = Attempts()
        for dc in candidates:
            made: str | None = None
            try:
                if existing:
                    group = str(existing[0]["id"])
                else:
                    body = rc.cluster_body(cluster.id, t.id, count, spec.num_nodes, opts, pub,
                                           spec.resources.disk_gb, dc)
                    rid = self.ledger.record(cluster, "pod-cluster", body["name"], dc or "any",
                                             meta={"name": body["name"]})
                    try:
                        got = self.api.create_cluster(body)
                    except GtrainError:
                        self.ledger.mark(rid, "not-created")
                        raise
                    made = group = str(got["id"])
                    self.ledger.mark(rid, "created", ref=group, meta={"name": body["name"]})
                    self.report.info(f"created RunPod cluster {group}: {spec.num_nodes}x {count}x {t.id} "
                                     f"({got.get('dataCenterId') or dc or 'RunPod places it'})")
                pods = self._wait_group(spec, cluster, opts, group)
            except (CapacityError, QuotaError) as e:
                attempts.add(dc or "any data center", e)
                self._undo_group(cluster, made)
                if isinstance(e, QuotaError):
                    break
                self.report.warn(f"{dc or 'any data center'}: {e.message}; trying the next")
                continue
            except BaseException:
                self._undo_group(cluster, made)
                raise
            self._record(spec, cluster, plan, opts, t.id, pods)
            self._reach(spec, cluster, opts)
            return
        if not existing:
            drop_key(cluster.id)
        attempts.fail(f"a cluster of {spec.num_nodes}x {count}x {t.id}", quota_hint="add funds at "
                      "https://www.console.runpod.io/user/billing", capacity_hint="add data centers "
                      "(resources.regions), pick another GPU, or try again later; nothing was left running")

    def _wait_group(self, spec: ClusterSpec, cluster: Cluster, opts: RunPodOptions,
                    group: str) -> dict[int, dict[str, Any]]:
        """Wait until every member of the RunPod cluster ``group`` runs with its rank and SSH port; by rank."""
        deadline = time.monotonic() + opts.boot_timeout_s
        while True:
            pods = self.api.cluster_pods(group)
            if pods is None:
                raise ProviderError(f"RunPod cluster {group} is gone before it ran")
            lost = [p for p in pods if p.get("status") in LOST]
            if lost:
                raise ProviderError(f"RunPod cluster {group}: pod {lost[0].get('id')} is {lost[0].get('status')} "
                                    "before the cluster ran")
            ready = {rank: p for p in pods if p.get("status") == "RUNNING" and ssh_direct(p)
                     and (rank := rc.rank_of(p)) is not None and 0 <= rank < spec.num_nodes}
            if len(ready) == spec.num_nodes:
                return ready
            if time.monotonic() > deadline:
                raise ProviderError(f"RunPod cluster {group}: {len(ready)} of {spec.num_nodes} pods running with a "
                                    f"public SSH port after {opts.boot_timeout_s:g} s",
                                    hint="raise runpod.boot_timeout_s; nothing was left running")
            time.sleep(opts.poll_s)

    def _undo_group(self, cluster: Cluster, group: str | None) -> None:
        if group is None:
            return
        try:
            self.teardown.delete_clusters([group], cluster)
        except GtrainError as e:
            self.report.warn(f"could not clean up after the failed attempt: {e.message}")

    def _launch(self, spec: ClusterSpec, cluster: Cluster, opts: RunPodOptions, t: rg.GpuType, count: int,
                dc: str | None, pub: str, existing: dict[int, dict[str, Any]],
                made: list[str]) -> dict[int, dict[str, Any]]:
        """Create the missing ranks in ``dc`` (ids appended to ``made`` as they come) and wait until every pod
        runs with its SSH port published."""
        ids = {rank: str(p["id"]) for rank, p in existing.items()}
        where = dc or "any"
        for rank in range(spec.num_nodes):
            if rank in ids:
                continue
            body = pod_body(cluster.id, rank, t.id, count, opts, pub, spec.resources.disk_gb, dc)
            rid = self.ledger.record(cluster, "pod", body["name"], where, meta={"name": body["name"]})
            try:
                pod = self.api.create_pod(body)
            except GtrainError:
                self.ledger.mark(rid, "not-created")
                raise
            made.append(str(pod["id"]))
            self.ledger.mark(rid, "created", ref=str(pod["id"]), meta={"name": body["name"]})
            ids[rank] = str(pod["id"])
            self.report.node(rank, f"created pod {pod['id']} ({count}x {t.id}, {pod.get('dataCenterId') or where})")
        deadline = time.monotonic() + opts.boot_timeout_s
        out: dict[int, dict[str, Any]] = {}
        while len(out) < len(ids):
            live = {str(p.get("id")): p for p in self.api.pods()}  # one call a round, not one per pod
            for rank, pid in sorted(ids.items()):
                if rank in out:
                    continue
                seen = live.get(pid)
                st = (seen or {}).get("status")
                if seen is None or st in LOST:
                    raise ProviderError(f"pod {pid} ({pod_name(cluster.id, rank)}) is {st or 'gone'} before it ran")
                if st == "RUNNING" and ssh_direct(seen):
                    out[rank] = seen
            if len(out) < len(ids):
                if time.monotonic() > deadline:
                    raise ProviderError(f"{where}: pods not running with a public SSH port after "
                                        f"{opts.boot_timeout_s:g} s", hint="raise runpod.boot_timeout_s; "
                                        "nothing was left running")
                time.sleep(opts.poll_s)
        return out

    def _record(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: RunPodOptions, gpu_type: str,
                pods: dict[int, dict[str, Any]]) -> None:
        from gtrain.state.nodes import NodeRecord
        from gtrain.state.sshtarget import SSHTarget

        known = {n.rank: n for n in self.ledger.nodes(cluster.id)}
        listed = plan.price_per_hour
        rates = []
        for rank, pod in sorted(pods.items()):
            old = known.get(rank)
            rate = pod_price(pod) or listed
            if old is not None and old.instance_id == pod["id"]:
                rates.append(float(old.extra.get("price_per_hour") or rate))
                continue  # a resumed up: the node is recorded already, with its own price and start
            rates.append(rate)
            host, port = ssh_direct(pod) or ("", 22)
            dc = pod.get("dataCenterId")
            meta = {"region": dc, "instance_type": gpu_type, "price_per_hour": rate,
                    "price_source": "pod cost" if pod_price(pod) else "catalog list price", "name": pod.get("name"),
                    "public_ip": host, "private_ip": rc.overlay_ip(pod), "ssh_port": port, "ssh_user": opts.ssh_user,
                    "key_file": str(key_path(cluster.id)), "proxy_command": opts.ssh_proxy_command}
            self.ledger.put_node(cluster.id, NodeRecord(
                rank=rank, status="up", address=rc.overlay_ip(pod) or host, instance_id=str(pod["id"]),
                ssh=SSHTarget(host=host, port=port, user=opts.ssh_user, identity_file=str(key_path(cluster.id)),
                              proxy_command=opts.ssh_proxy_command),
                launched_at=time.time(), extra=meta))
        region = next((str(p.get("dataCenterId")) for p in pods.values() if p.get("dataCenterId")), plan.region)
        price = max(rates) if rates else listed
        # the $/h up freezes, live: the pods' own cost as RunPod reports it, else the live GPU list's price
        what = "runpod pod cost" if pods and all(pod_price(p) for p in pods.values()) else "runpod gpu list"
        freeze_price(self.store, cluster, plan, live_price(price, what, region), self.report)
        plan.region, plan.price_per_hour = region, price
        with self.ledger.lock:
            self.store.update_cluster(cluster.id, region=region, price_per_hour=price)
        write_ssh_config(self.ledger, self.report)

    def _undo(self, cluster: Cluster, made: list[str]) -> None:
        """Delete what a failed attempt made (best effort: the first error is the one to report)."""
        try:
            self.teardown.terminate(made, cluster)
        except GtrainError as e:
            self.report.warn(f"could not clean up after the failed attempt: {e.message}")

    # ---- describe / terminate / price / gc ----

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        out: list[NodeStatus] = []
        live = {str(p.get("id")): p for p in self.api.pods()}
        if cluster.num_nodes > 1:  # an Instant Cluster's members are listed only under it
            for group in self.teardown.clusters(cluster.id):
                live.update({str(p.get("id")): p for p in self.api.cluster_pods(str(group["id"])) or []})
        for node in self.store.node_records(cluster.id):
            found = live.get(node.instance_id or "")
            if found is None:
                out.append(NodeStatus(node.rank, "missing", node.address, f"{node.instance_id}: no such pod"))
                continue
            st = str(found.get("status") or "")
            out.append(NodeStatus(node.rank, STATES.get(st, st.lower()), node.address, f"{found.get('name')}: {st}"))
        return out

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        from gtrain.providers.runpod.adopt import find_by_name

        return find_by_name(self, spec, regions)

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        from gtrain.providers.runpod.adopt import adopt

        adopt(self, spec, cluster, plan, region)

    def ended_at(self, cluster: Cluster) -> dict[int, float]:
        return {}  # RunPod pods enforce no limit: they bill until terminated

    def terminate(self, cluster: Cluster) -> None:
        known = [n.instance_id for n in self.store.node_records(cluster.id) if n.instance_id]
        left = self.teardown.teardown(cluster.id, cluster, known)
        finish_down(self.ledger, self.report, cluster, left, f"tagged for cluster {cluster.id}",
                    "gtrain gc --provider runpod --yes")

    def replace_nodes(self, cluster: Cluster, ranks: list[int]) -> None:
        if cluster.num_nodes > 1:
            raise ConfigError(f"cannot replace node(s) {ranks} of {cluster.name}: its pods are one RunPod Instant "
                              "Cluster, whose members RunPod makes and deletes only together", field="--replace-bad",
                              hint=f"`gtrain down {cluster.name}` and `gtrain up` again (a new cluster)")
        super().replace_nodes(cluster, ranks)

    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        if node.instance_id:
            self.teardown.terminate([node.instance_id], cluster)

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        cost = self.billed_cost(interval, time.time())
        return IntervalCost(round(cost, 6), estimate=False,
                            note=f"${interval.price_per_hour:g}/h, the pod's cost as RunPod reported it at launch "
                                 f"{cluster.extra.get('price_source') or ''}; billed by the second")

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Pods tagged ``gtrain-<cluster id>-<rank>`` that no live cluster owns (in the data centers ``regions``
        only, when given)."""
        return self.teardown.sweep(live_cluster_ids, delete, list(regions) if regions else None)
