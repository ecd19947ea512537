"""The watcher's signals (docs/durable.md, "Two signals before a recovery" and "Hangs"): each poll of a watched
job asks the provider about its nodes and, where that matters, the nodes themselves (gtrain.remote.nodehealth:
their launcher, heartbeat and ranks' progress); the pure gtrain.runs.decide.decide_lost decides. A suspect is
asked again on the next poll; a loss on two signals, or a hang (after its stacks are dumped into the rank logs),
is recorded in the job's info (``signals``) and ends the follow; the recovery takes it from there
(gtrain.runs.recovery.classify reads it).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.runs.decide import (
    DEFINITIVE,
    HANG,
    HEARTBEAT_STALE_S,
    LOST,
    RECOVER,
    SUSPECT,
    Health,
    NodeSignals,
    Poll,
    confirm_first,
    decide_lost,
)

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

#: how long one node may take to answer a health read or a stack dump
ASK_TIMEOUT_S = 30.0
#: while the provider cannot say (its status calls fail), the nodes are asked at most this often
MUTE_PROVIDER_ASK_S = 30.0


def stale_s() -> float:
    """:data:`HEARTBEAT_STALE_S`, or ``GTRAIN_HEARTBEAT_STALE_S`` (tests, with ``GTRAIN_HEARTBEAT_S``)."""
    return float(os.environ.get("GTRAIN_HEARTBEAT_STALE_S") or HEARTBEAT_STALE_S)


def hang_s(job: JobRecord) -> float | None:
    minutes = (job.info.get("recovery_policy") or {}).get("hang_minutes")
    return float(minutes) * 60 if minutes else None


def provider_view(cluster: Cluster, ctx: Context) -> dict[int, tuple[str, str]] | None:
    """The provider's word on each node; None when its status call failed or timed out (it says nothing then:
    never a loss)."""
    try:
        return {s.rank: (s.status, s.detail or "") for s in ctx.provider(cluster.provider).describe(cluster)}
    except (GtrainError, OSError, TimeoutError, ValueError):
        return None


def _source() -> str:
    from gtrain.remote import nodehealth

    with open(nodehealth.__file__, encoding="utf-8") as f:
        return f.read()


def _ask(cluster: Cluster, job: JobRecord, ctx: Context, func: str, *args: str,
         nodes: list[int] | None = None, direct: bool = False) -> dict[int, dict[str, Any]]:
    """``gtrain.remote.nodehealth.<func>(JOB_DIR, *args)`` on each node, in parallel; a node that does not
    answer gives ``{"agent": "unreached"}``. A backend without node scripts (a scheduler, pods) gives its own
    word on each node instead (no heartbeat, no progress; no stacks). ``health`` reads node 0's heartbeat
    aggregate first (one request, gtrain.remote.nodebeat): a node it heard within two beats (``on_time``) with
    its launcher alive (or not started yet) is taken as its last beat said (``"via": "node 0"``); only the
    others (late, silent, never heard, ended, dead) are asked themselves. ``direct``: every node asked
    itself."""
    from gtrain.jobs.nodescript import NodeScriptBackend, beats, job_dir
    from gtrain.remote.fanout import parallel
    from gtrain.remote.nodebeat import health_of, on_time

    backend = ctx.backend(cluster)
    picked = list(range(cluster.num_nodes)) if nodes is None else nodes
    if not isinstance(backend, NodeScriptBackend):
        if func != "health":
            return {}
        try:
            desc = backend.describe(job, picked)
        except GtrainError:
            return {i: {"agent": "unknown"} for i in picked}
        return {n.node: {"agent": "dead" if n.raw.get("lost") or n.detail == "missing" else
                         "unreached" if n.detail == "unreachable" else "ended" if n.state.terminal else "alive"}
                for n in desc.nodes}
    src, runners = _source(), backend.runners
    relayed: dict[int, dict[str, Any]] = {}
    if func == "health" and not direct and picked:
        got = beats(runners, job) or {}
        relayed = {i: dict(health_of(got[i])) for i in picked
                   if i in got and got[i]["word"] in ("running", "pending") and on_time(got[i])}
        picked = [i for i in picked if i not in relayed]

    def one(i: int) -> dict[str, Any]:
        r = runners[i]
        try:
            res = r.run_python(src, [func, job_dir(r, job.id), *args], timeout=ASK_TIMEOUT_S)
            return dict(json.loads(res.stdout))
        except (GtrainError, OSError, ValueError, TypeError) as e:
            return {"agent": "unreached", "error": getattr(e, "message", str(e))}

    return {**relayed, **dict(zip(picked, parallel(one, picked), strict=True))}


def node_signals(rank: int, at: float, view: dict[int, tuple[str, str]] | None,
                 health: dict[str, Any] | None) -> NodeSignals:
    """One node's signals from the provider's view and the node's health (ages turned into the watcher's
    clock: ``at`` minus the age the node measured)."""
    word, detail = (view or {}).get(rank, ("unknown", ""))
    if health is None:
        return NodeSignals(rank, word, detail)
    ranks = {int(r): v for r, v in (health.get("ranks") or {}).items() if isinstance(v, dict)}
    ages = {r: float(v["age"]) for r, v in ranks.items() if v.get("age") is not None}
    steps = {r: int(v["step"]) for r, v in ranks.items() if v.get("step") is not None}
    slowest = min(ranks, key=lambda r: (steps.get(r, 1 << 62), -ages.get(r, 0.0))) if ranks else None
    age = health.get("heartbeat_age")
    return NodeSignals(rank, word, detail, str(health.get("agent") or "unknown"),
                       float(age) if age is not None else None, at - min(ages.values()) if ages else None,
                       max(steps.values()) if steps else None, slowest, bool(ranks))


def askable(cluster: Cluster, view: dict[int, tuple[str, str]] | None) -> list[int]:
    """The nodes that may be asked: not those the provider says were preempted or terminated (a machine that is
    gone costs SSH's retries, and a new one may have its address): their second signal is one that needs no
    asking -- the follower's stream to it broke, the run stopped progressing, the job ended."""
    return [i for i in range(cluster.num_nodes) if (view or {}).get(i, ("", ""))[0] not in DEFINITIVE]


def poll(cluster: Cluster, job: JobRecord, ctx: Context, view: dict[int, tuple[str, str]] | None, *,
         ask: list[int], broken: set[int] | None = None, ended: bool = False, direct: bool = False) -> Poll:
    """One look at every node: the provider's ``view`` (:func:`provider_view`), the own word of the nodes in
    ``ask`` (node 0's heartbeat aggregate first, unless ``direct``: :func:`_ask`); a node not asked whose
    followed stream broke (gtrain.runs.follow.BROKEN) did not answer."""
    health = _ask(cluster, job, ctx, "health", nodes=ask, direct=direct) if ask else {}
    at = time.time()
    starts = [at - float(h["started_age"]) for h in health.values() if h.get("started_age") is not None]
    nodes = tuple(node_signals(i, at, view, health[i]) if i in health else
                  NodeSignals(i, *(view or {}).get(i, ("unknown", "")),
                              "unreached" if i in (broken or ()) else "unknown")
                  for i in range(cluster.num_nodes))
    return Poll(at, nodes, ended, max(starts) if starts else None,
                tuple(sorted(i for i, h in health.items() if h.get("via") == "node 0")))


def finding(job: JobRecord, health: Health, last: Poll, **extra: Any) -> dict[str, Any]:
    """What the watcher found, as recorded in the job's info (``signals``) for the recovery to read."""
    return {"attempt": int(job.info.get("attempt", 1)), "state": health.state, "kind": health.kind,
            "lost": list(health.lost), "detail": health.detail, "first_stalled": health.first_stalled,
            "first_rank": health.first_rank, "at": last.at,
            "provider": {str(n.rank): [n.provider, n.provider_detail] for n in last.nodes}, **extra}


def _record(ctx: Context, job: JobRecord, found: dict[str, Any]) -> None:
    now = ctx.store.get_job(job.id)
    ctx.store.update_job(job.id, status=now.status, info={**now.info, "signals": found})


def dump_stacks(cluster: Cluster, job: JobRecord, ctx: Context) -> dict[str, dict[str, str]]:
    """Every live rank's Python stacks into its own log (py-spy, else faulthandler's SIGABRT); node -> rank ->
    how."""
    out: dict[str, dict[str, str]] = {}
    for i, v in _ask(cluster, job, ctx, "dump", job.id, str(int(ASK_TIMEOUT_S - 10))).items():
        out[str(i)] = ({"error": str(v.get("error") or v["agent"])} if "agent" in v else
                       {str(r): str(how) for r, how in v.items()})
    return out


class Watch:
    """The watcher's check (follow's ``check``, one per attempt): returns why the job must be recovered now, or
    None. Each call asks the provider; the nodes are asked when the provider says a node is gone or cannot say
    (then at most every :data:`MUTE_PROVIDER_ASK_S`), when the last poll left a suspect, and, with
    ``hang_minutes``, every sixth of it (1 poll to 60 s)."""

    def __init__(self, cluster: Cluster, job: JobRecord, ctx: Context, *, poll_s: float = 5.0) -> None:
        self.cluster, self.job, self.ctx = cluster, job, ctx
        self.hang_s = hang_s(job)
        self.stale_s = stale_s()
        self.every = min(60.0, max(poll_s, self.hang_s / 6)) if self.hang_s else None
        self.polls: list[Poll] = []
        self.state = ""
        self.asked = float("-inf")
        self.said = ""

    def _due(self, every: float | None) -> bool:
        return every is not None and time.monotonic() - self.asked >= every

    def __call__(self) -> str | None:
        from gtrain.runs.follow import BROKEN

        view = provider_view(self.cluster, self.ctx)
        gone = view is not None and any(w in LOST for w, _ in view.values())
        ask = (gone or self.state == SUSPECT or self._due(self.every)
               or (view is None and self._due(MUTE_PROVIDER_ASK_S)))
        if ask:
            self.asked = time.monotonic()
        asked = askable(self.cluster, view) if ask else []
        p = poll(self.cluster, self.job, self.ctx, view, ask=asked, broken=BROKEN.get(self.job.id))
        h = decide_lost([*self.polls[-1:], p], hang_s=self.hang_s, stale_s=self.stale_s)
        if confirm_first(h, p):  # decided on relayed beats: the provider and every node asked itself first
            from gtrain.jobs.nodescript import direct_reads

            with direct_reads():
                view = provider_view(self.cluster, self.ctx)
                p = poll(self.cluster, self.job, self.ctx, view, ask=askable(self.cluster, view) if asked else [],
                         broken=BROKEN.get(self.job.id), direct=True)
            h = decide_lost([*self.polls[-1:], p], hang_s=self.hang_s, stale_s=self.stale_s)
        self.polls = [*self.polls[-1:], p]
        self.state = h.state
        if h.state == SUSPECT:
            if h.detail != self.said:
                self.ctx.report.info(f"job {self.job.id}: {h.detail}: one signal, not two: not recovering; asking "
                                     "again on the next poll")
            self.said = h.detail
            return None
        self.said = ""
        if h.state == RECOVER:
            _record(self.ctx, self.job, finding(self.job, h, p))
            return h.detail
        if h.state == HANG:
            self.ctx.report.warn(f"job {self.job.id}: hang: {h.detail}; dumping every rank's Python stacks into "
                                 "its log")
            started = time.time()
            dumped = dump_stacks(self.cluster, self.job, self.ctx)
            found = finding(self.job, h, p, dumped=dumped, dump_s=round(time.time() - started, 3),
                            stalled_s=round(p.at - _newest(p), 3))
            found["detail"] = f"hang: {h.detail}; stacks dumped into the rank logs ({_how(dumped)})"
            _record(self.ctx, self.job, found)
            return str(found["detail"])
        return None


def _newest(p: Poll) -> float:
    return max([t for t in (n.progress_at for n in p.nodes) if t is not None] + [p.started_at or 0.0])


def _how(dumped: dict[str, dict[str, str]]) -> str:
    return "; ".join(f"node {i}: " + (ranks["error"] if "error" in ranks else
                                      ", ".join(f"rank {r} {how}" for r, how in sorted(ranks.items())))
                     for i, ranks in sorted(dumped.items()) if ranks) or "no live rank found"
