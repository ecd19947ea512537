"""Replace only the dead node (docs/durable.md, "Elastic runs"): an elastic job (``num_nodes: {min, max}`` with
torchrun, or ``job.fault_tolerance: torchft``) that lost nodes other than node 0 keeps its survivors' processes.
The watcher re-provisions what the provider lost (or, where the machine is still there, clears what the dead
agent left), starts the job's part on those nodes only, and records the world size over time. torchrun's agents
re-rendezvous among the survivors by themselves (a shrink) and again when the replacement joins (a grow); with
torchft the other replica groups never stop. gtrain stops nothing on a surviving node.

Whether a loss can take this path is :func:`gtrain.jobs.elastic.replaceable` (pure); otherwise the whole-job
recovery of gtrain.runs.recovery runs, as for any job.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gtrain.errors import CapacityError, GtrainError, QuotaError
from gtrain.jobs.elastic import replaceable
from gtrain.locks import cluster_lock

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.runs.decide import Verdict
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord


def world(job: JobRecord, cluster: Cluster, nodes: int) -> list[list[float]]:
    """``info["world_sizes"]`` with the size now appended: ``[unix time, nodes, ranks]`` entries (the first, the
    launch's, added where it is missing)."""
    nproc = int(job.info.get("nproc_per_node") or 1)
    sizes = [list(x) for x in job.info.get("world_sizes") or []]
    if not sizes:  # the launch's: the nodes the job was rendered for then
        first = int(job.info.get("num_nodes") or cluster.num_nodes)
        sizes.append([round(job.created_at, 3), first, first * nproc])
    sizes.append([round(time.time(), 3), nodes, nodes * nproc])
    return sizes


#: a replacement (or the nodes an elastic cluster is short of) the provider had no capacity for is tried again
#: after this long, doubling, at most MAX_RETRY_S apart (GTRAIN_ELASTIC_RETRY_S: the first wait, for tests)
RETRY_S, MAX_RETRY_S = 15.0, 300.0


def retry_s(tries: int) -> float:
    """How long after the last try (``tries`` so far) the next one is due."""
    first = float(os.environ.get("GTRAIN_ELASTIC_RETRY_S") or RETRY_S)
    return min(first * 2 ** max(0, tries - 1), MAX_RETRY_S)


class Replacer:
    """The watcher's elastic side, polled from gtrain.runs.follow's ``check``: a lost node of an elastic job is
    replaced in a thread of its own while the survivors' lines keep streaming; each node that rejoins is put on
    :attr:`rejoin` (follow opens its lines from its start). A loss it cannot take (node 0, too few left) or a
    replacement that failed is returned as a reason: the watcher then recovers the whole job."""

    def __init__(self, cluster: Cluster, job_id: str, ctx: Context,
                 classify: Callable[[Cluster, JobRecord, Context], Verdict]) -> None:
        self.cluster, self.job_id, self.ctx, self.classify = cluster, job_id, ctx, classify
        self.rejoin: queue.Queue[int] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.error: str | None = None

    def check(self, base: Callable[[], str | None]) -> str | None:
        if self.thread is not None and self.thread.is_alive():
            return None  # a replacement is under way; the survivors train
        if self.error is not None:
            return f"replacing the lost node(s) failed: {self.error}"
        job = self.ctx.store.get_job(self.job_id)
        if not job.info.get("elastic"):
            return base()
        if self._grow_due(job):  # fewer nodes than max (capacity was short): ask for the rest now and then
            self.thread = threading.Thread(target=self._grow, daemon=True, name="gtrain-elastic-grow")
            self.thread.start()
            return None
        pending = job.info.get("elastic_pending")
        if pending:
            wait_s = retry_s(int(pending.get("tries", 0)))
            if time.time() - float(pending.get("tried_at") or 0) < wait_s:
                return None
        why = base()
        if not (why or job.info.get("degraded") or pending):
            return None
        # the record as base() left it: the watcher's finding (two signals, the stream that broke among them) is
        # in it now; an older copy made classify look again on its own, see one signal, and end the elastic path
        job = self.ctx.store.get_job(self.job_id)
        v = self.classify(self.cluster, job, self.ctx)
        # a lost node only: a hang's ranks were all stopped to dump their stacks, the whole job goes again
        if v.recover and v.kind in ("node_failure", "preemption") and \
                replaceable(job.info, v.lost, self.cluster.num_nodes) is None:
            self.thread = threading.Thread(target=self._replace, args=(v,), daemon=True, name="gtrain-elastic")
            self.thread.start()
            return None
        if why:
            return why
        if not v.lost:  # a node the state still counts out is back (its rejoin not yet seen by a refresh)
            return None
        return (f"node(s) {v.lost} lost and not replaced alone: "
                f"{replaceable(job.info, v.lost, self.cluster.num_nodes) or v.why}")

    def _grow_due(self, job: JobRecord) -> bool:
        el = job.info["elastic"]
        if job.info.get("elastic_pending") or job.info.get("degraded") or el.get("mode") != "torchrun":
            return False
        if self.ctx.store.get_cluster_by_id(self.cluster.id).num_nodes >= int(el.get("max") or 0):
            return False
        g = job.info.get("elastic_grow") or {}
        wait_s = retry_s(int(g.get("tries", 0)))
        return time.time() - float(g.get("tried_at") or job.created_at) >= wait_s

    def _grow(self) -> None:
        try:
            new = grow(self.cluster, self.ctx.store.get_job(self.job_id), self.ctx)
        except GtrainError as e:
            self.ctx.report.warn(f"growing job {self.job_id} failed: {e.message}; it trains on as it is")
            return
        for n in new:
            self.rejoin.put(n)

    def _replace(self, v: Verdict) -> None:
        try:
            _job, joined = replace(self.cluster, self.ctx.store.get_job(self.job_id), self.ctx, v)
        except GtrainError as e:
            self.error = e.message
            return
        except Exception as e:  # noqa: BLE001 - a bug here must end in the whole-job recovery, not a dead thread
            self.error = f"{type(e).__name__}: {e}"
            return
        for n in joined:
            self.rejoin.put(n)


def _update(ctx: Context, job: JobRecord, **info: Any) -> JobRecord:
    now = ctx.store.get_job(job.id)
    ctx.store.update_job(job.id, status=now.status, info={**now.info, **info})
    return ctx.store.get_job(job.id)


def replace(cluster: Cluster, job: JobRecord, ctx: Context, v: Verdict) -> tuple[JobRecord, list[int]]:
    """Bring the nodes ``v.lost`` back into ``job`` while the others keep training. When the provider has no
    capacity now, the survivors go on at their size and the next poll tries again (``info["elastic_pending"]``).
    Returns the job and the nodes that joined (none while there is no capacity)."""
    lost = sorted(set(v.lost))
    detected = time.time()
    with cluster_lock(ctx.store.home, cluster.name, "recover"):
        cluster = ctx.store.get_cluster_by_id(cluster.id)
        job = ctx.store.get_job(job.id)
        left = cluster.num_nodes - len(lost)
        if not job.info.get("elastic_pending"):
            ctx.report.warn(f"job {job.id}: {v.detail}; node(s) {lost} replaced alone, the other {left} node(s) "
                            "keep training (elastic)")
            job = _update(ctx, job, world_sizes=world(job, cluster, left),
                          elastic_pending={"lost": lost, "kind": v.kind, "detail": v.detail,
                                           "reprovision": list(v.reprovision), "detected_at": detected})
        pending = dict(job.info["elastic_pending"])
        backend = ctx.backend(cluster)
        try:
            if pending["reprovision"]:
                _reprovision(cluster, ctx, pending)
                backend = ctx.backend(ctx.store.get_cluster_by_id(cluster.id))  # the new machines' runners
            else:  # the machine is there, its agent died: end what it left behind before the join
                backend.cancel(job, nodes=lost, grace_s=2)
        except (CapacityError, QuotaError) as e:
            ctx.report.warn(f"no capacity for node(s) {lost} now ({e.message}); the job trains on {left} node(s) "
                            "and gtrain tries again")
            return _update(ctx, job, elastic_pending={**pending, "tries": int(pending.get("tries", 0)) + 1,
                                                      "last_error": e.message, "tried_at": time.time()}), []
        provisioned = time.time()
        c = ctx.store.get_cluster_by_id(cluster.id)
        grown = list(range(c.num_nodes, _present(ctx, c)))  # an elastic cluster short of max: filled too
        if grown:
            ctx.store.update_cluster(c.id, num_nodes=c.num_nodes + len(grown))
            for rank in grown:
                ctx.store.open_interval(c.id, rank, instance_type=c.instance_type, market=c.market,
                                        price_per_hour=c.price_per_hour, started_at=provisioned)
            c = ctx.store.get_cluster_by_id(cluster.id)
        join(c, job, ctx, lost + grown)
        now = time.time()
        rec = {"attempt": int(job.info.get("attempt", 1)), "kind": pending["kind"], "lost": lost,
               "reprovision": pending["reprovision"], "detail": pending["detail"], "elastic": True,
               "detected_at": pending["detected_at"], "ended_at": now, "progress": True,
               "seconds": round(now - float(pending["detected_at"]), 3),
               "provision_s": round(provisioned - float(pending["detected_at"]), 3),
               "launch_s": round(now - provisioned, 3),
               # only the replaced nodes were down: their time is the recovery's cost
               "cost_usd": round((now - float(pending["detected_at"])) * c.price_per_hour * len(lost) / 3600, 6)}
        job = ctx.store.get_job(job.id)
        info = {k: x for k, x in job.info.items() if k != "elastic_pending"}
        info.update(recoveries=[*(job.info.get("recoveries") or []), rec],
                    world_sizes=world(job, c, c.num_nodes))
        ctx.store.update_job(job.id, status="running", info=info)
        ctx.report.info(f"node(s) {lost + grown} rejoined job {job.id}: {rec['seconds']:.1f}s after the loss "
                        f"(provision {rec['provision_s']:.1f}s, start {rec['launch_s']:.1f}s)")
        return ctx.store.get_job(job.id), lost + grown


def _present(ctx: Context, cluster: Cluster) -> int:
    """The nodes the cluster has now (an elastic cluster's are ranks 0..n-1: the provider makes the lowest missing
    ranks first)."""
    return len([n for n in ctx.store.node_records(cluster.id) if n.status not in ("terminated", "deleted")])


def grow(cluster: Cluster, job: JobRecord, ctx: Context) -> list[int]:
    """An elastic job on fewer nodes than its max (``up`` found capacity for min..max): ask the provider for the
    rest; those it makes join the running job (the others' agents restart their workers into the bigger round).
    Returns the ranks that joined; none when there is still no capacity (tried again later, backing off)."""
    with cluster_lock(ctx.store.home, cluster.name, "recover"):
        cluster = ctx.store.get_cluster_by_id(cluster.id)
        job = ctx.store.get_job(job.id)
        want, before = int(job.info["elastic"]["max"]), cluster.num_nodes
        g = dict(job.info.get("elastic_grow") or {})
        provider, spec = ctx.provider(cluster.provider), ctx.spec_of(cluster)
        plan = provider.plan(spec)
        started = time.time()
        try:
            provider.provision(spec, cluster, plan)
        except (CapacityError, QuotaError) as e:
            tries = int(g.get("tries", 0)) + 1
            ctx.report.info(f"job {job.id}: still {before} of {want} node(s): {e.message} (try {tries}; again in "
                            f"{retry_s(tries):.0f}s)")
            _update(ctx, job, elastic_grow={"tries": tries, "tried_at": time.time(), "last_error": e.message})
            return []
        have = _present(ctx, cluster)
        new = list(range(before, have))
        ctx.store.update_cluster(cluster.id, num_nodes=have)
        for rank in new:
            ctx.store.open_interval(cluster.id, rank, instance_type=plan.instance_type, market=plan.market,
                                    price_per_hour=plan.price_per_hour, started_at=started)
        c = ctx.store.get_cluster_by_id(cluster.id)
        if new:
            join(c, job, ctx, new)
        job = ctx.store.get_job(job.id)
        info = {k: x for k, x in job.info.items() if k != "elastic_grow"}
        if new:
            info["world_sizes"] = world(job, c, have)
        if have < want:
            info["elastic_grow"] = {"tries": 0, "tried_at": time.time()}
        ctx.store.update_job(job.id, status=job.status, info=info)
        ctx.report.info(f"node(s) {new} joined job {job.id}: {have} of {want} node(s) now")
        return new


def _reprovision(cluster: Cluster, ctx: Context, pending: dict[str, Any]) -> None:
    """Make the lost nodes again (idempotent: the provider makes only what is missing); never a move to another
    any_of candidate, which would stop the survivors."""
    provider = ctx.provider(cluster.provider)
    spec = ctx.spec_of(cluster)
    plan = provider.plan(spec)
    ranks = pending["reprovision"]
    for rank in ranks:
        ctx.store.close_node_interval(cluster.id, rank, at=float(pending["detected_at"]))
    ctx.report.info(f"re-provisioning node(s) {ranks} of {cluster.name}")
    started = time.time()
    if provider.can_stop:
        try:
            provider.start_nodes(cluster, ranks)
        except GtrainError as e:
            ctx.report.warn(f"could not start the stopped node(s) of {ranks}: {e.message}")
    provider.provision(spec, cluster, plan)
    for rank in ranks:
        ctx.store.open_interval(cluster.id, rank, instance_type=plan.instance_type, market=plan.market,
                                price_per_hour=plan.price_per_hour, started_at=started)


def join(cluster: Cluster, job: JobRecord, ctx: Context, nodes: list[int]) -> None:
    """Start ``job``'s part on ``nodes`` only, under its id and attempt, on the rendezvous endpoint it has: the
    nodes restore the newest complete checkpoint and their torchrun joins the running ones."""
    from gtrain.jobs.backend import JobRequest
    from gtrain.jobs.nodescript import NodeScriptBackend
    from gtrain.runs.ship import _archive, job_spec, prepare

    spec = job_spec(job, cluster, ctx)
    workdir = str(job.info.get("workdir") or spec.workdir_path())
    port = int(str(job.info.get("master") or ":0").rsplit(":", 1)[1] or 0) or None
    backend = ctx.backend(cluster)
    plan = backend.dryrun(JobRequest(cluster, spec, job.id, workdir, master_port=port))
    attempt = int(job.info.get("attempt", 1))
    prepare(plan, backend, ctx.report, attempt=attempt, nodes=nodes)
    if backend.checkpoint_tool == "runners":
        _archive(backend, plan, attempt, nodes)
    if not isinstance(backend, NodeScriptBackend):  # the spec refuses elastic runs on the others
        raise GtrainError(f"the {backend.name} backend cannot start one node's part of a job")
    backend.submit(plan, ctx.report, nodes=nodes)
