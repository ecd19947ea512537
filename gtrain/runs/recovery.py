"""Recovery with no controller: whoever waits on a job (``run``, ``launch --wait``, ``logs -f``, ``watch``)
notices a lost node -- from the provider (spot preemption, a terminated or missing node, an ssh host gone) or
from the job's state (a node's agent gone: killed, OOM, rebooted) -- stops the survivors, re-provisions what
is missing, and relaunches the job under the same id (a new attempt) that restores from the store.

Each step of a recovery is recorded in the job's info (``recovery``: phase, what was lost, when) BEFORE it is
taken, under the cluster's lock, so a watcher killed halfway leaves it for the next ``gtrain watch`` to finish:
cancelling, provisioning and launching are each idempotent or undone first, so nothing is done twice. Done
recoveries are kept in ``info["recoveries"]`` (``status``, ``cost`` and ``run``'s summary show them).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gtrain.errors import CapacityError, GtrainError, QuotaError
from gtrain.jobs.backend import JobState, LogLine
from gtrain.locks import ClusterBusy, cluster_lock
from gtrain.runs import signals
from gtrain.runs.decide import (  # re-exported: the recovery's names, as before
    LOST,
    SUSPECT,
    NodeLost,  # noqa: F401 - re-exported
    Observed,
    Poll,
    Verdict,
    decide,
    decide_lost,
    progress_matters,
    streak,
)
from gtrain.runs.signals import Watch

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

RECOVERING = "recovering"
MAX_BACKOFF_S = 600.0


def _watch_poll_s() -> float:
    return float(os.environ.get("GTRAIN_WATCH_POLL_S", "5"))


def policy(job: JobRecord) -> dict[str, Any]:
    return dict(job.info.get("recovery_policy") or {"max_restarts": 0, "on": [], "exit_codes": [], "backoff_s": 30})


def watcher_lock(ctx: Context, cluster: str) -> contextlib.AbstractContextManager[None]:
    """Held by the one process that recovers the cluster's job; others only follow."""
    return cluster_lock(ctx.store.home, f"{cluster}.watch", "watch")


def watched(ctx: Context, cluster: str) -> bool:
    """Whether a live process watches (and so recovers) the cluster's job now."""
    try:
        with watcher_lock(ctx, cluster):
            return False
    except ClusterBusy:
        return True


def provider_lost(cluster: Cluster, ctx: Context) -> dict[int, Any]:
    """The nodes the provider says are gone: its word alone, one signal (a status call that fails or times out
    says nothing: {})."""
    try:
        return {s.rank: s for s in ctx.provider(cluster.provider).describe(cluster) if s.status in LOST}
    except (GtrainError, OSError, TimeoutError, ValueError):
        return {}


#: the watchers of this process: cluster id -> (job id, attempt, its Watch, which keeps its last polls)
_WATCHES: dict[str, tuple[str, int, Watch]] = {}


def lost_reason(cluster: Cluster, ctx: Context, job: JobRecord | None = None) -> str | None:
    """The watcher's poll (follow's ``check``): why the cluster's job (``job``, else its newest) must be recovered
    now -- a node lost on two signals, or a hang (docs/durable.md) -- or None. Stateful per job and attempt:
    a node with one signal against it is a suspect, asked again on the next call."""
    job = ctx.store.get_job(job.id) if job is not None else ctx.store.latest_job(cluster.id)
    if job is None:
        return None
    attempt = int(job.info.get("attempt", 1))
    had = _WATCHES.get(cluster.id)
    if had is None or had[:2] != (job.id, attempt):  # a new job or attempt: a fresh watch
        had = _WATCHES[cluster.id] = (job.id, attempt, Watch(cluster, job, ctx, poll_s=_watch_poll_s()))
    return had[2]()


def _newest(job: JobRecord) -> str | None:
    from gtrain.checkpoints.pull import store_checkpoints

    try:
        done = [c for c in store_checkpoints(job) or [] if c["complete"]]
    except GtrainError:
        return None
    return done[-1]["name"] if done else None


def observe(cluster: Cluster, job: JobRecord, ctx: Context) -> Observed:
    """What the decision needs: what the watcher found in this attempt (a loss on two signals, a hang), else one
    look at the provider and every node (two, a moment apart, when the first leaves a suspect: a node that did
    not answer once is asked again), and (only where it can matter) the store."""
    pol = policy(job)
    recs = list(job.info.get("recoveries") or [])
    found = job.info.get("signals")
    if not found or found.get("used") or int(found.get("attempt", 0)) != int(job.info.get("attempt", 1)):
        found = None
    polls: list[Poll] = []
    if found is None:
        from gtrain.jobs.nodescript import direct_reads

        ended = job.status not in (JobState.RUNNING.value, JobState.PENDING.value)
        # the decision stands on each node's own word and the provider's, not on node 0's heartbeat aggregate:
        # a relayed word is up to two beats old, and a node killed within them reads as running (docs/scale.md)
        with direct_reads():
            for _ in range(2):
                view = signals.provider_view(cluster, ctx)
                polls.append(signals.poll(cluster, job, ctx, view, ask=signals.askable(cluster, view), ended=ended))
                if decide_lost(polls, stale_s=signals.stale_s()).state != SUSPECT:
                    break
                time.sleep(min(2.0, _watch_poll_s()))
    progress = _progress(job, recs) if progress_matters(pol, recs) else None
    return Observed(job.id, job.exit_code, pol, recs, (), (), progress, polls=polls, found=found,
                    stale_s=signals.stale_s())


def classify(cluster: Cluster, job: JobRecord, ctx: Context) -> Verdict:
    """Whether (and why not) to recover ``job``, which ended badly or lost a node: :func:`observe`, then the
    pure :func:`gtrain.runs.decide.decide`. What the watcher found is used once (an elastic job goes on in the
    same attempt)."""
    obs = observe(cluster, job, ctx)
    if obs.found is not None:
        now = ctx.store.get_job(job.id)
        ctx.store.update_job(job.id, status=now.status, info={**now.info, "signals": {**obs.found, "used": True}})
    return decide(obs)


def _progress(job: JobRecord, recs: list[dict[str, Any]]) -> bool:
    """Whether the attempt that just ended got anywhere: a new complete checkpoint (with a store), else ran
    a minute or more."""
    if job.info.get("checkpoint_store"):
        newest = _newest(job)
        return newest is not None and newest != (recs[-1].get("store_newest") if recs else None)
    started = float(recs[-1]["ended_at"]) if recs else job.created_at
    return time.time() - started >= 60


# ---- the recovery, step by step ------------------------------------------------------------------


def _save(ctx: Context, job: JobRecord, rec: dict[str, Any] | None, *, status: str = RECOVERING,
          **extra: Any) -> JobRecord:
    info = {**ctx.store.get_job(job.id).info, **extra}
    if rec is None:
        info.pop("recovery", None)
    else:
        info["recovery"] = rec
    ctx.store.update_job(job.id, status=status, info=info)
    return ctx.store.get_job(job.id)


def begin(cluster: Cluster, job: JobRecord, ctx: Context, v: Verdict) -> JobRecord:
    recs = list(job.info.get("recoveries") or [])
    progress = _progress(job, recs)
    in_a_row = 0 if progress else streak(recs) + 1
    backoff = min(float(policy(job).get("backoff_s", 30)) * (2 ** max(0, in_a_row - 1)), MAX_BACKOFF_S)
    rec = {"attempt": int(job.info.get("attempt", 1)) + 1, "kind": v.kind, "lost": v.lost,
           "reprovision": v.reprovision, "detail": v.detail, "detected_at": time.time(),
           "failed_exit_code": job.exit_code, "progress": progress, "backoff_s": backoff,
           "store_newest": _newest(job) if job.info.get("checkpoint_store") else None, "phase": "stopping"}
    ctx.report.warn(f"job {job.id}: {v.detail}; recovering (attempt {rec['attempt']}, "
                    f"{len(recs) + 1} of at most {policy(job)['max_restarts']} recoveries)")
    return _save(ctx, job, rec)


def resume(cluster: Cluster, job: JobRecord, ctx: Context) -> JobRecord:
    """Take the recorded recovery of ``job`` from its recorded phase to the relaunch."""
    from gtrain.runs.ship import collect, relaunch

    with cluster_lock(ctx.store.home, cluster.name, "recover"):
        cluster = ctx.store.get_cluster_by_id(cluster.id)  # where it is now (a move changes its provider)
        job = ctx.store.get_job(job.id)
        rec = dict(job.info.get("recovery") or {})
        if job.status != RECOVERING or not rec:
            return job
        if rec["phase"] == "stopping":
            # the nodes the provider says are gone (to be re-provisioned) are not asked: nothing runs there
            # and SSH would only wait out its retries
            alive = [i for i in range(cluster.num_nodes) if i not in rec["reprovision"]]
            ctx.report.info(f"stopping the job's ranks on node(s) {alive} ({rec['kind']} of node(s) {rec['lost']})")
            ctx.backend(cluster).cancel(job, nodes=alive, grace_s=5)
            rec.update(phase="backoff", until=time.time() + float(rec.get("backoff_s", 0)))
            job = _save(ctx, job, rec)
        if rec["phase"] == "backoff":
            while time.time() < float(rec["until"]):
                if ctx.store.get_job(job.id).status != RECOVERING:  # cancelled meanwhile
                    return ctx.store.get_job(job.id)
                time.sleep(min(0.5, max(0.0, float(rec["until"]) - time.time())))
            rec.update(phase="provisioning")
            job = _save(ctx, job, rec)
        if rec["phase"] == "provisioning":
            if rec["reprovision"]:
                cluster = _reprovision(cluster, job, ctx, rec)
            # what the stopped survivors finished since their last upload goes to the store, to be restored next
            # (here, not right after the stop: every node is reachable again to render the tool's script)
            collect(ctx.store.get_cluster_by_id(cluster.id), job, ctx,
                    [i for i in range(cluster.num_nodes) if i not in rec["reprovision"]])
            if exclude_stalled(ctx.store.get_cluster_by_id(cluster.id), ctx, rec):
                job = _save(ctx, job, rec)
            rec.update(phase="launching", provisioned_at=time.time())
            job = _save(ctx, job, rec)
        if rec["phase"] == "launching":
            if ctx.store.get_job(job.id).status != RECOVERING:
                return ctx.store.get_job(job.id)
            # a launch a killed watcher had begun: ended before the next one (on the nodes as they are now)
            ctx.backend(ctx.store.get_cluster_by_id(cluster.id)).cancel(job, grace_s=5)
            rec["launch_started_at"] = time.time()
            relaunch(cluster, job, ctx, int(rec["attempt"]))
            now = time.time()
            c = ctx.store.get_cluster_by_id(cluster.id)
            seconds = now - float(rec["detected_at"])
            done = {k: v for k, v in rec.items() if k not in ("phase", "until")}
            done.update(ended_at=now, seconds=round(seconds, 3),
                        cost_usd=round(seconds * c.price_per_hour * c.num_nodes / 3600, 6),
                        provision_s=round(float(rec.get("provisioned_at", now)) - float(rec["detected_at"]), 3),
                        launch_s=round(now - float(rec["launch_started_at"]), 3))
            recs = [*(ctx.store.get_job(job.id).info.get("recoveries") or []), done]
            job = _save(ctx, job, None, status=JobState.RUNNING.value, recoveries=recs)
    return job


def exclude_stalled(cluster: Cluster, ctx: Context, rec: dict[str, Any]) -> bool:
    """A hang's node that stalled first (``rec["lost"]``, where it could be told) is swapped for a new machine of
    the same rank before the relaunch -- a bad GPU, NIC or host stays behind -- where the provider rents its nodes
    (``can_replace_nodes``); elsewhere the job restarts on the same machines. Once per recovery (``replaced``).
    Returns whether ``rec`` changed."""
    if rec.get("kind") != "hang" or not rec.get("lost") or "replaced" in rec:
        return False
    provider = ctx.provider(cluster.provider)
    if not provider.can_replace_nodes:
        rec["replaced"] = []
        ctx.report.info(f"node(s) {rec['lost']} stalled first; provider {cluster.provider} cannot swap a machine, "
                        "the job restarts on the same nodes")
        return True
    ranks = [int(r) for r in rec["lost"]]
    ctx.report.warn(f"node(s) {ranks} stalled first: replacing the machine(s) before the relaunch")
    try:
        provider.replace_nodes(cluster, ranks)
        rec["replaced"] = ranks
    except GtrainError as e:  # the job still restarts, on the machine it has
        rec["replaced"] = []
        ctx.report.warn(f"could not replace node(s) {ranks}: {e.message}; restarting on the same machines")
    return True


def _reprovision(cluster: Cluster, job: JobRecord, ctx: Context, rec: dict[str, Any]) -> Cluster:
    """Make the lost nodes again; when the cluster's cloud has no capacity for them and the spec has other
    ``resources.any_of`` candidates, move the whole cluster (gtrain.runs.move). Returns the cluster as it is now."""
    from gtrain.runs import move

    provider = ctx.provider(cluster.provider)
    spec = ctx.spec_of(cluster)
    plan = provider.plan(spec)
    for rank in rec["reprovision"]:
        ctx.store.close_node_interval(cluster.id, rank, at=float(rec["detected_at"]))
    ctx.report.info(f"re-provisioning node(s) {rec['reprovision']} of {cluster.name}")
    started = time.time()
    if provider.can_stop:  # a stopped node (an idle stop, a stop in the console) is started, not replaced
        try:
            again = provider.start_nodes(cluster, rec["reprovision"])
        except GtrainError as e:  # it cannot be started: provisioning below replaces it
            ctx.report.warn(f"could not start the stopped node(s) of {rec['reprovision']}: {e.message}")
            again = []
        if again:
            ctx.report.info(f"node(s) {again} were stopped, not gone: started again (same machines and disks)")
    try:
        provider.provision(spec, cluster, plan)  # idempotent: makes only what is missing
    except (CapacityError, QuotaError) as e:
        if not move.can_move(cluster):
            raise
        cluster = move.move(cluster, ctx, e)
        move.rebase_job(ctx.store.get_job(job.id), cluster, ctx)
        rec.update(reprovision=list(range(cluster.num_nodes)), moved_to=cluster.provider)
        return cluster
    for rank in rec["reprovision"]:  # the replacement nodes are billed from now
        ctx.store.open_interval(cluster.id, rank, instance_type=plan.instance_type, market=plan.market,
                                price_per_hour=plan.price_per_hour, started_at=started)
    return cluster


# ---- the watcher -----------------------------------------------------------------------------------


def wait(cluster: Cluster, job: JobRecord, ctx: Context, on_line: Callable[[LogLine], None], *,
         tail: int | None = None, nodes: list[int] | None = None, rank: int | None = None) -> JobRecord:
    """Follow ``job`` to its end, recovering it on the way as its policy says (when no other process is)."""
    from gtrain.runs import elastic
    from gtrain.runs.follow import follow
    from gtrain.runs.notify import notify_job

    if int(policy(job).get("max_restarts", 0)) <= 0 and job.status != RECOVERING:
        return follow(cluster, job, ctx, on_line, tail=tail, nodes=nodes, rank=rank)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(watcher_lock(ctx, cluster.name))
        except ClusterBusy as e:
            ctx.report.info(f"{e.message}: it recovers this job; only following here")
            return follow(cluster, job, ctx, on_line, tail=tail, nodes=nodes, rank=rank)
        while True:
            job = ctx.store.get_job(job.id)
            if job.status == RECOVERING:
                job = resume(cluster, job, ctx)
                cluster = ctx.store.get_cluster_by_id(cluster.id)  # moved to another candidate, maybe
                if job.status != JobState.RUNNING.value:
                    return job
                notify_job(cluster, job, ctx, "recovered", key=f"recovered-{job.info.get('attempt', 1)}")
                tail = None  # a new attempt: all of its lines
            # an elastic job's lost node is replaced alone, from the poll, while its survivors' lines stream on
            replacer = elastic.Replacer(cluster, job.id, ctx, classify)
            job = follow(cluster, job, ctx, on_line, tail=tail, nodes=nodes, rank=rank, rejoin=replacer.rejoin,
                         check=functools.partial(replacer.check, functools.partial(lost_reason, cluster, ctx)),
                         check_every_s=_watch_poll_s())
            if job.status in (JobState.SUCCEEDED.value, JobState.CANCELLED.value):
                return job
            v = classify(cluster, job, ctx)
            if not v.recover:
                if job.status not in (JobState.FAILED.value, JobState.PREEMPTED.value):  # still running, lost a node
                    ctx.backend(cluster).cancel(job, grace_s=5)
                    ctx.store.update_job(job.id, status=JobState.FAILED.value, exit_code=job.exit_code or 1)
                ctx.report.warn(f"not recovering: {v.why}")
                return _save(ctx, job, None, status=ctx.store.get_job(job.id).status, recovery_stopped=v.why)
            attempt = int(job.info.get("attempt", 1)) + 1
            job = begin(cluster, job, ctx, v)
            notify_job(cluster, job, ctx, "preempted", key=f"preempted-{attempt}",
                       detail=f"{v.kind} of node(s) {v.lost}: recovering")


def summary_line(rec: dict[str, Any]) -> str:
    """One recovery in a sentence, for `run`, `watch` and `cost`."""
    again = f", re-provisioned node(s) {rec['reprovision']}" if rec.get("reprovision") else ", same node(s)"
    return (f"recovery to attempt {rec.get('attempt')}: {rec.get('kind')} of node(s) {rec.get('lost')}{again}; "
            f"{float(rec.get('seconds') or 0):.1f}s down, ~${float(rec.get('cost_usd') or 0):.4f}")


def status_note(cluster: Cluster, job: JobRecord | None, ctx: Context) -> str | None:
    """What `status` says of the cluster's recovery: who recovers a lost node now (nobody, without a watcher)."""
    if job is None:
        return None
    pol, recs = policy(job), list(job.info.get("recoveries") or [])
    done = f"{len(recs)} recovery(ies) so far, attempt {job.info.get('attempt', 1)}" if recs else ""
    if job.status in ("succeeded", "failed", "cancelled", "preempted"):
        why = job.info.get("recovery_stopped")
        return "; ".join(x for x in (done, f"stopped recovering: {why}" if why else "") if x) or None
    if int(pol.get("max_restarts", 0)) <= 0:
        return None
    if watched(ctx, cluster.name):
        state = "recovering now" if job.status == RECOVERING else "watched: a lost node is recovered"
        return "; ".join(x for x in (state, done) if x)
    what = (f"a recovery is halfway ({(job.info.get('recovery') or {}).get('phase')})"
            if job.status == RECOVERING else "a lost node will NOT be recovered")
    return "; ".join(x for x in (f"no watcher is running: {what}; `gtrain watch {cluster.name}` recovers it", done)
                     if x)
