"""A job's state: the nodes' (or scheduler's) truth folded into one status, fail-fast, cancel.

The job backend says where each node's part of the job is (:meth:`JobBackend.describe`); this module folds
that into the job's status and exit code, keeps the state database's copy current, and -- when asked to act
(``launch``, ``logs -f``, ``run``; never a read-only ``status``) -- stops the nodes still waiting in a
collective for a node whose part died.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gtrain.errors import ConfigError
from gtrain.jobs.backend import CANCEL_EXIT, JobState, aggregate, first_failed, job_exit_code
from gtrain.jobs.elastic import replaceable
from gtrain.state import TERMINAL_JOB, Cluster
from gtrain.state import Job as JobRecord

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.jobs.backend import JobBackend, JobDescription
    from gtrain.state import StateStore

__all__ = ["CANCEL_EXIT", "Context", "active_job", "aggregate", "cancel_job", "job_exit_code", "refresh_job",
           "resolve_job"]


class Context(Protocol):
    """What folding a job's state needs of the caller's :class:`gtrain.context.Context` (declared here: the
    context sits above the providers, which sit above jobs)."""

    store: StateStore
    report: Reporter

    def backend(self, cluster: Cluster) -> JobBackend: ...

#: a node's own words that mean its part of the job is over badly (or the node is)
_DEAD = ("failed", "missing", "unreachable")
_ALIVE = ("running", "pending", "starting", "setup")


def refresh_job(cluster: Cluster, job: JobRecord, ctx: Context, *, act: bool = True,
                desc: JobDescription | None = None) -> JobRecord:
    """Ask the backend where ``job`` is and store it. With ``act``, a job that died on some nodes is stopped
    on the others (fail-fast) and workers a dead launcher left behind are ended; without it (``status``),
    nothing is stopped: what would be is reported, and a node-script job's running nodes are read from node 0's
    heartbeat aggregate in one request (NodeScriptBackend.describe_from_beats; the others asked themselves)."""
    if (job.status in TERMINAL_JOB and job.info.get("final")) or job.status == "recovering":
        return job  # a recovery in progress is its watcher's (gtrain.runs.recovery)
    backend = ctx.backend(cluster)
    if desc is not None:  # every node's own word, just told (gtrain.runs.follow: each stream's end)
        pass
    elif act:
        desc = backend.describe(job)
    else:  # reading: node 0's heartbeat aggregate, one request, where the node scripts keep one
        from gtrain.jobs.nodescript import NodeScriptBackend

        desc = backend.describe_from_beats(job) if isinstance(backend, NodeScriptBackend) else backend.describe(job)
    nodes = desc.nodes
    state, code = desc.state, desc.exit_code
    dead = [n.node for n in nodes if n.detail in _DEAD]
    alive = [n.node for n in nodes if n.detail in _ALIVE]
    # a node the watcher is replacing alone (an elastic job's, gtrain.runs.elastic) is the replacement's: what of
    # the job runs there is its part starting (the store check, setup, the launcher), not a dead agent's workers
    replacing = set((job.info.get("elastic_pending") or {}).get("lost") or [])
    orphaned = [n.node for n in nodes if n.orphans and n.node not in replacing]
    if orphaned:
        if act:
            ctx.report.warn(f"job {job.id}: ending workers left behind on node(s) {orphaned}")
            backend.cancel(job, orphaned, grace_s=5)
        else:
            ctx.report.warn(f"job {job.id}: workers left behind on node(s) {orphaned} "
                            f"(`gtrain cancel {cluster.name}` ends them)")
    gone = [n.node for n in nodes if n.node in dead and (n.raw.get("lost") or n.detail != "failed")]
    if dead and alive and gone == dead and replaceable(job.info, dead, len(nodes)) is None:
        # an elastic job: the survivors keep training; the watcher replaces the dead node(s) (gtrain.runs.elastic)
        state, code = JobState.RUNNING, None
        if act and job.info.get("degraded") != dead:
            ctx.report.warn(f"job {job.id}: node(s) {dead} lost; node(s) {alive} keep training (elastic)")
    elif dead and alive:
        if act:
            # One node's job died (or its node did) while the others wait in a collective: stop them instead
            # of letting them hang until a timeout.
            ctx.report.warn(f"job {job.id} failed on node(s) {dead}; stopping it on node(s) {alive}")
            backend.cancel(job, alive, grace_s=5)
            again = {n.node: n for n in backend.describe(job, alive).nodes}
            nodes = [again.get(n.node, n) for n in nodes]
            failed = [n for n in nodes if n.state is JobState.FAILED]
            state, code = JobState.FAILED, (job_exit_code(failed) if failed else 255)
        else:
            ctx.report.warn(f"job {job.id} failed on node(s) {dead} and still runs on node(s) {alive}; "
                            f"`gtrain logs {cluster.name} -f` or `gtrain cancel {cluster.name}` stops it")
    info = dict(job.info)
    info["nodes"] = [{"state": n.detail, "exit_code": n.exit_code, "error": n.error} for n in nodes]
    if info.get("elastic"):  # the nodes an elastic job trains without now (gtrain.runs.elastic replaces them)
        info["degraded"] = dead if state is JobState.RUNNING else []
    if state is JobState.FAILED and (first := first_failed(nodes)) is not None:
        info["failed_first"] = first  # `run` ends naming it, with its last lines
    # terminal is final: a node that was unreachable may come back, but the rest of the job was stopped
    info["final"] = state.terminal and any(n.detail != "unreachable" for n in nodes)
    if state.value != job.status or code != job.exit_code or info != job.info:
        # onto the info as it is now: a watcher's elastic replacement may have written to it meanwhile
        mine: dict[str, Any] = {k: info[k] for k in ("nodes", "failed_first", "final", "degraded") if k in info}
        info = {**ctx.store.get_job(job.id).info, **mine}
        ctx.store.update_job(job.id, status=state.value, exit_code=code, info=info)
    return ctx.store.get_job(job.id)


def active_job(cluster: Cluster, ctx: Context) -> JobRecord | None:
    for job in reversed(ctx.store.jobs(cluster.id)):
        if job.status not in TERMINAL_JOB:
            job = refresh_job(cluster, job, ctx)
            if job.status not in TERMINAL_JOB:
                return job
    return None


def cancel_job(cluster: Cluster, job: JobRecord, ctx: Context) -> JobRecord:
    ctx.backend(cluster).cancel(job, grace_s=10)
    job = refresh_job(cluster, job, ctx, act=False)
    if job.status not in TERMINAL_JOB:
        ctx.store.update_job(job.id, status=JobState.CANCELLED.value, exit_code=CANCEL_EXIT)
    return ctx.store.get_job(job.id)


def cancel_active_jobs(cluster: Cluster, ctx: Context) -> list[JobRecord]:
    out = []
    for job in ctx.store.jobs(cluster.id):
        if job.status not in TERMINAL_JOB:
            ctx.report.info(f"stopping job {job.id}")
            out.append(cancel_job(cluster, job, ctx))
    return out


def resolve_job(cluster: Cluster, ctx: Context, job_id: str | None) -> JobRecord:
    if job_id:
        job = ctx.store.get_job(job_id)
        if job.cluster_id != cluster.id:
            raise ConfigError(f"job {job_id!r} is not a job of cluster {cluster.name!r}", field="--job")
        return job
    latest = ctx.store.latest_job(cluster.id)
    if latest is None:
        raise ConfigError(f"cluster {cluster.name!r} has no jobs yet", field="--job",
                          hint=f"`gtrain launch --cluster {cluster.name}` starts one")
    return latest
