"""Following a job's output: every node's (or rank's) lines, in the caller's thread, until the job ends.

One reader per node (the backend's :meth:`~gtrain.jobs.backend.JobBackend.log_iter`) feeds one queue; when a
node's part ends badly while others still run, the job is refreshed, which stops the rest (fail-fast) instead
of leaving them in a collective.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gtrain.jobs.backend import JobDescription, JobState, LogLine, NodeEnded, aggregate
from gtrain.jobs.status import refresh_job
from gtrain.state import TERMINAL_JOB, Cluster
from gtrain.state import Job as JobRecord

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.jobs.backend import JobBackend

#: after a refresh found the job over, how long streams of nodes that are gone may stay open
SETTLE_S = 10.0
#: how often a follower applies ``policies.min_gpu_util`` (the telemetry is sampled every 10 s)
IDLE_CHECK_S = 60.0
#: job id -> the nodes whose stream broke while followed (its connection died, or it ended with no end state):
#: the backend could not keep reaching them, a signal the watcher reads without asking a node that may be gone
#: (gtrain.runs.signals)
BROKEN: dict[str, set[int]] = {}


def follow(cluster: Cluster, job: JobRecord, ctx: Context, on_line: Callable[[LogLine], None], *,
           follow: bool = True, tail: int | None = None, nodes: list[int] | None = None,
           rank: int | None = None, check: Callable[[], str | None] | None = None,
           check_every_s: float = 5.0, rejoin: queue.Queue[int] | None = None) -> JobRecord:
    """Stream every node's and rank's lines to ``on_line``. With ``follow``, return when the job has ended
    (everywhere), with its record refreshed -- or, with ``check`` (every ``check_every_s``: the provider's
    word on lost nodes, see gtrain.runs.recovery), as soon as it returns a reason. ``rejoin``: nodes that
    (re)joined an elastic job meanwhile (gtrain.runs.elastic): each one's lines are followed from its start."""
    backend = ctx.backend(cluster)
    picked = [i for i in range(cluster.num_nodes) if nodes is None or i in nodes]
    q: queue.Queue[tuple[str, int, LogLine | NodeEnded | None]] = queue.Queue()

    def pump(i: int, tail: int | None = tail, source: JobBackend = backend) -> None:
        try:
            for item in source.log_iter(job, i, rank, follow=follow, tail=tail):
                q.put(("item", i, item))
        finally:
            q.put(("done", i, None))

    threads = [threading.Thread(target=pump, args=(i,), daemon=True, name=f"gtrain-follow-{i}") for i in picked]
    for t in threads:
        t.start()
    open_streams = set(picked)
    broken = BROKEN[job.id] = set()
    live = dict.fromkeys(picked, 1)  # streams open per node (a rejoined node's old one may end after its new one began)
    ended: dict[int, NodeEnded] = {}
    last_check = last_probe = last_idle_check = time.monotonic()
    lost = False  # ``check`` gave a reason: the streams of lost nodes are not waited for
    settled_at: float | None = None  # when a refresh found the job over while streams were still open
    while open_streams:
        if settled_at is not None and time.monotonic() - settled_at > SETTLE_S:
            break  # streams of nodes that are gone never end by themselves
        try:
            kind, i, item = q.get(timeout=0.5)
        except queue.Empty:
            kind, i, item = "tick", -1, None
        while rejoin is not None and not rejoin.empty():  # a replacement joined: its lines from its start
            n = rejoin.get()
            if nodes is None or n in nodes:
                ended.pop(n, None)
                open_streams.add(n)
                live[n] = live.get(n, 0) + 1
                fresh = ctx.backend(ctx.store.get_cluster_by_id(cluster.id))  # a node that grew the cluster
                t = threading.Thread(target=pump, args=(n, None, fresh), daemon=True, name=f"gtrain-follow-{n}")
                threads.append(t)
                t.start()
        if isinstance(item, LogLine):
            broken.discard(i)
            on_line(item)
        elif isinstance(item, NodeEnded):
            ended[i] = item
            if item.detail == "unreachable":
                broken.add(i)
            if item.error:
                ctx.report.warn(f"node {i}: {item.error}")
        elif kind == "done":
            if follow and i not in ended:
                broken.add(i)
            live[i] -= 1
            if live[i] <= 0:
                open_streams.discard(i)
        if follow and check is not None and time.monotonic() - last_probe > check_every_s:
            last_probe = time.monotonic()
            if why := check():
                ctx.report.warn(f"job {job.id}: {why}")
                lost = True
                break
        if follow and time.monotonic() - last_idle_check > IDLE_CHECK_S:  # policies.min_gpu_util
            last_idle_check = time.monotonic()
            _idle_gpus(cluster, job, ctx)
            budget_check(cluster, job, ctx)
        # A node that ended badly while others still run: refresh (which stops the rest, see refresh_job).
        if follow and ended and open_streams and time.monotonic() - last_check > 2:
            last_check = time.monotonic()
            if any(e.state is not JobState.SUCCEEDED for e in ended.values()):
                if check is not None and (why := check()):  # the provider knows first (a refresh would wait
                    ctx.report.warn(f"job {job.id}: {why}")  # out SSH's retries to the node that is gone)
                    lost = True
                    break
                job = refresh_job(cluster, ctx.store.get_job(job.id), ctx)
                if job.status in TERMINAL_JOB and settled_at is None:
                    settled_at = time.monotonic()
    for t in threads:
        t.join(timeout=0 if lost else 5)
    if lost:  # the caller acts on the provider's word; a refresh would try the lost node first
        return ctx.store.get_job(job.id)
    if not follow:
        return ctx.store.get_job(job.id)
    now = ctx.store.get_cluster_by_id(cluster.id)  # an elastic run's cluster may have grown while followed
    return refresh_job(cluster, ctx.store.get_job(job.id), ctx, desc=_from_ends(job, ended, now.num_nodes, nodes))


def _from_ends(job: JobRecord, ended: dict[int, NodeEnded], num_nodes: int,
               nodes: list[int] | None) -> JobDescription | None:
    """The job's end as every node's own stream said it at its end (its state document, where the backend's
    stream carries one: the node scripts'), so the follower does not ask all N nodes again once they have told
    it; None -- ask them -- when a node did not end that way (a subset followed, a stream that broke, a node
    not over)."""
    if nodes is not None:
        return None
    got = [ended[i].status if i in ended else None for i in range(num_nodes)]
    statuses = [s for s in got if s is not None and s.state.terminal]
    if len(statuses) != num_nodes:
        return None
    state, code = aggregate(statuses)
    return JobDescription(job.id, state, code, statuses)


def _idle_gpus(cluster: Cluster, job: JobRecord, ctx: Context) -> None:
    """``policies.min_gpu_util``: warn (or, with ``action: stop``, stop the job) when every GPU has idled that
    long while the money runs. Whoever follows the job applies it; a failure to read telemetry is not one."""
    from gtrain.errors import GtrainError
    from gtrain.runs.preflight import enforce_min_gpu_util

    try:
        if msg := enforce_min_gpu_util(cluster, ctx.store.get_job(job.id), ctx):
            ctx.report.warn(msg)
    except (GtrainError, OSError, ValueError) as e:
        ctx.report.warn(f"could not read GPU telemetry: {getattr(e, 'message', e)}")


def budget_check(cluster: Cluster, job: JobRecord, ctx: Context) -> float | None:
    """``notify.on: budget_80`` / ``budget_reached``: the share of ``policies.max_cost_usd`` spent so far; at 80%
    (100%) or more the message is sent (once: gtrain.notify dedups it, with the node's own watcher too)."""
    from gtrain.costs.report import cluster_cost
    from gtrain.errors import GtrainError
    from gtrain.runs.notify import notify_job

    try:
        cap = ctx.spec_of(cluster).policies.max_cost_usd
        if not cap:
            return None
        spent = cluster_cost(ctx.store, cluster, ctx.provider(cluster.provider)).total_usd
    except (GtrainError, OSError, ValueError):
        return None
    share = spent / cap
    for kind, at in (("budget_80", 0.8), ("budget_reached", 1.0)):
        if share >= at:
            notify_job(cluster, ctx.store.get_job(job.id), ctx, kind,
                       detail=f"${spent:.2f} of policies.max_cost_usd ${cap:.2f} spent ({share:.0%})")
    return share
