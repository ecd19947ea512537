"""The recovery decision, with no I/O: what the follower observed of a job that ended badly or lost a node
(:class:`Observed`) in, whether to recover it and why (:class:`Verdict`) out.

Sans-I/O, as h11 is: :func:`gtrain.runs.recovery.observe` asks the provider, the job backend and the store,
and this module only decides, so an incident replays as a test from the events it recorded
(tests/unit/test_recovery_decide.py, tests/unit/test_recovery_signals.py) and the rule can change without a
cluster.

Two signals before a recovery (:func:`decide_lost`, docs/durable.md): the provider's word on a node, the node's
own (its launcher alive, its heartbeat fresh) and the run's progress are gathered by each poll of the watcher
(:class:`Poll`); a node is lost only when two of them agree, or when its own state says its launcher died. One
signal makes it a suspect, asked again on the next poll. A status call that failed says nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: what the provider says of a node that is gone
LOST = ("preempted", "terminated", "missing", "stopped", "unreachable")
#: what the provider says of a node that is certainly gone (a machine that is stopped or unreachable may come back)
GONE_FOR_SURE = ("preempted", "terminated", "missing")
#: this many failures in a row without progress (no new checkpoint in the store) is a crash loop
CRASH_LOOP = 3
#: exit codes of a rank killed by SIGKILL (bash's 128+9; -9 where the agent reports the signal): recovered as
#: a node_failure (the crash-loop guard stops a script that OOMs every time)
SIGKILLED = (137, -9)
#: a node's heartbeat (``JOB/heartbeat``, written by its launch.sh every GTRAIN_HEARTBEAT_S, default 5 s) older
#: than this is stale; so is a run whose ranks made no progress for this long (one signal each, never alone)
HEARTBEAT_STALE_S = 30.0
#: provider words that end a machine for good: with the node not answering, that one look is enough
DEFINITIVE = ("preempted", "terminated")
#: a node stalled first when its newest progress is older than every other node's by at least this
STALL_MARGIN_S = 1.0
HEALTHY, SUSPECT, RECOVER, HANG = "healthy", "suspect", "recover", "hang"


@dataclass
class Verdict:
    recover: bool
    kind: str = ""
    lost: list[int] = field(default_factory=list)
    reprovision: list[int] = field(default_factory=list)
    why: str = ""
    detail: str = ""


@dataclass(frozen=True)
class NodeLost:
    """A node the provider reports gone (its ``NodeStatus`` with a status in :data:`LOST`)."""

    rank: int
    status: str
    detail: str = ""


@dataclass(frozen=True)
class NodeSignals:
    """One node as one poll of the watcher saw it."""

    rank: int
    #: the provider's word: ``running``, a word of :data:`LOST`, or ``unknown`` (the status call failed or timed
    #: out, or it was not asked): unknown is never a loss
    provider: str = "unknown"
    provider_detail: str = ""
    #: the node's own word: ``alive`` (its launcher runs), ``ended`` (its part of the job ended by itself),
    #: ``pending``, ``dead`` (its launcher died: the backend's ``lost``, or the job's folder is gone),
    #: ``unreached`` (the node did not answer) or ``unknown`` (not asked)
    agent: str = "unknown"
    #: seconds since the node last wrote its heartbeat (None: none read)
    heartbeat_age_s: float | None = None
    #: when one of its live ranks last made progress in this attempt (the watcher's clock; None: none yet)
    progress_at: float | None = None
    #: the highest step its ranks logged (``gtrain.metrics.log(step=...)``; None: they log none)
    step: int | None = None
    #: its rank that progressed least (lowest step, else oldest progress), when it has live ranks
    slowest_rank: int | None = None
    #: whether it has ranks still running
    live_ranks: bool = False


@dataclass(frozen=True)
class Poll:
    """What one poll observed of every node asked."""

    at: float
    nodes: tuple[NodeSignals, ...] = ()
    #: the job is over (a fail-fast or the nodes ended it): nothing progresses any more
    ended: bool = False
    #: when this attempt started (its launchers' start; the watcher's clock): progress counts from here
    started_at: float | None = None
    #: the nodes whose own word this poll took from node 0's heartbeat aggregate (their last beat, relayed:
    #: up to one GTRAIN_HEARTBEAT_S old) instead of asking them (docs/scale.md, "Status from heartbeats")
    relayed: tuple[int, ...] = ()


def confirm_first(health: Health, p: Poll) -> bool:
    """Whether ``health`` must be asked again of every node itself before it is acted on: a recovery or a hang
    decided on a poll that took some node's word from node 0's aggregate. The aggregate is the nodes' own word,
    relayed and up to a beat old; what a decision stands on is read from the nodes directly (a node the
    aggregate calls silent was asked directly already)."""
    return health.state in (RECOVER, HANG) and bool(p.relayed)


@dataclass
class Health:
    """:func:`decide_lost`'s answer: ``healthy``, ``suspect`` (one signal: ask again next poll), ``recover``
    (``lost`` nodes, two signals or a dead launcher) or ``hang``."""

    state: str = HEALTHY
    kind: str = ""
    lost: list[int] = field(default_factory=list)
    detail: str = ""
    #: a hang's node that stalled first (and its rank), where that can be told
    first_stalled: int | None = None
    first_rank: int | None = None


def _node(n: NodeSignals, prev: NodeSignals | None, stalled: bool, ended: bool,
          stale_s: float) -> tuple[str, str]:
    """One node's verdict (``lost``, ``suspect`` or ``""``) and why."""
    said = n.provider in LOST
    word = f"the provider says {n.provider}{f' ({n.provider_detail})' if n.provider_detail else ''}"
    if n.agent == "dead":  # the node's own state: a second signal by itself
        return "lost", f"{word} and its launcher died" if said else "its launcher died (the node's own state)"
    stale = n.agent == "alive" and n.heartbeat_age_s is not None and n.heartbeat_age_s >= stale_s
    if n.agent in ("alive", "pending") and not stale:  # it runs and says so: its own word overrules one other
        return ("suspect", f"{word}, but it answers (heartbeat {_age(n.heartbeat_age_s)})") if said else ("", "")
    # not answering twice in a row is a signal; once is not (one failed probe), except at the job's end, where
    # the follower's own look that ended the job was the first
    unreached = n.agent == "unreached" and (ended or (prev is not None and prev.agent == "unreached"))
    own = stale or unreached
    if said and n.agent == "unreached" and n.provider in DEFINITIVE:
        return "lost", f"{word} and the node does not answer"
    if said + own + stalled >= 2:
        parts = [word] if said else []
        parts += [f"its heartbeat is {_age(n.heartbeat_age_s)} old" if stale else "it does not answer"] if own else []
        parts += ["the job ended" if ended else f"no rank made progress in {stale_s:.0f}s"] if stalled else []
        return "lost", " and ".join(parts)
    if said or own or n.agent == "unreached":
        what = word if said else (f"heartbeat {_age(n.heartbeat_age_s)} old" if stale else "it did not answer")
        return "suspect", what
    return "", ""


def _age(s: float | None) -> str:
    return "unknown" if s is None else f"{s:.0f}s"


def first_stalled(nodes: Sequence[NodeSignals], started_at: float | None = None) -> NodeSignals | None:
    """The node whose ranks stopped first: the one lowest step when every node logs steps and one is behind
    the rest, else the one whose newest progress is oldest by :data:`STALL_MARGIN_S` or more (when every node
    made progress in this attempt); None when that cannot be told (one node, ties)."""
    nodes = [n for n in nodes if n.live_ranks]
    if len(nodes) < 2:
        return None
    steps = [n.step for n in nodes]
    if all(s is not None for s in steps):
        low = min(s for s in steps if s is not None)
        behind = [n for n in nodes if n.step == low]
        if len(behind) == 1:
            return behind[0]
    times = [n.progress_at for n in nodes]
    if all(t is not None and (started_at is None or t > started_at) for t in times):
        order = sorted(nodes, key=lambda n: n.progress_at or 0.0)
        if (order[1].progress_at or 0.0) - (order[0].progress_at or 0.0) >= STALL_MARGIN_S:
            return order[0]
    return None


def decide_lost(polls: Sequence[Poll], *, hang_s: float | None = None,
                stale_s: float = HEARTBEAT_STALE_S) -> Health:
    """Whether the watcher's polls (oldest first; the newest two are read) show a lost node, a hang, a suspect
    or a healthy run. A node is lost when its own state says its launcher died, or when two of these agree:
    the provider says it is gone; its heartbeat is stale, or it did not answer twice in a row; no rank of the
    run made progress for ``stale_s`` (or the job ended). The provider saying ``preempted``/``terminated`` of a
    node that does not answer is enough at once. A node that answers with a fresh heartbeat is never lost. A
    hang (``hang_s``): every node alive and answering, and no live rank made progress for ``hang_s``."""
    if not polls:
        return Health()
    now = polls[-1]
    before = {n.rank: n for n in polls[-2].nodes} if len(polls) > 1 else {}
    floor = now.started_at
    seen = [t for t in (n.progress_at for n in now.nodes) if t is not None]
    newest = max([*seen, *([floor] if floor is not None else [])], default=None)
    stalled = now.ended or (newest is not None and now.at - newest >= stale_s)
    lost: list[tuple[NodeSignals, str]] = []
    suspects: list[tuple[NodeSignals, str]] = []
    for n in sorted(now.nodes, key=lambda x: x.rank):
        verdict, why = _node(n, before.get(n.rank), stalled, now.ended, stale_s)
        (lost if verdict == "lost" else suspects if verdict == "suspect" else []).append((n, why))
    if lost:
        kind = "preemption" if any(n.provider == "preempted" for n, _ in lost) else "node_failure"
        return Health(RECOVER, kind, [n.rank for n, _ in lost], "; ".join(f"node {n.rank}: {w}" for n, w in lost))
    if hang_s and not suspects and not now.ended and newest is not None and any(n.live_ranks for n in now.nodes):
        alive = all(n.agent == "alive" and n.provider not in LOST for n in now.nodes)
        if alive and now.at - newest >= hang_s:
            first = first_stalled(now.nodes, floor)
            where = (f"; node {first.rank}{f' (rank {first.slowest_rank})' if first.slowest_rank is not None else ''}"
                     f" stalled first{f' at step {first.step}' if first.step is not None else ''}"
                     if first else "; which node stalled first cannot be told")
            return Health(HANG, "hang", [first.rank] if first else [],
                          f"no rank made progress for {now.at - newest:.0f}s while every node is alive{where}",
                          first.rank if first else None, first.slowest_rank if first else None)
    if suspects:
        return Health(SUSPECT, "", [n.rank for n, _ in suspects],
                      "; ".join(f"node {n.rank}: {w}" for n, w in suspects))
    return Health()


@dataclass(frozen=True)
class Observed:
    """Everything the decision reads, as observed when the job ended badly or lost a node."""

    job_id: str
    exit_code: int | None
    #: ``policies.recovery`` as stored with the job (``max_restarts``, ``on``, ``exit_codes``, ``backoff_s``)
    policy: Mapping[str, Any]
    #: the job's recoveries so far (``info["recoveries"]``), oldest first
    recoveries: Sequence[Mapping[str, Any]] = ()
    #: nodes the provider reports gone, vouched for by the caller (a second signal seen)
    lost: Sequence[NodeLost] = ()
    #: nodes whose part of the job died with its agent, vouched for by the caller
    gone: Sequence[int] = ()
    #: whether the attempt that just ended got anywhere (a new complete checkpoint in the store, else a minute
    #: or more of running); None when it was not asked (it cannot change the verdict)
    progress: bool | None = None
    #: the nodes as the observer saw them (oldest first): lost nodes are found in them by :func:`decide_lost`
    polls: Sequence[Poll] = ()
    #: what the watcher found in this attempt and recorded (``info["signals"]``): ``state`` ``recover`` (with
    #: ``lost``, ``provider``: rank -> [word, detail]) or ``hang`` (``first_stalled``), ``detail``
    found: Mapping[str, Any] | None = None
    #: :data:`HEARTBEAT_STALE_S` as the observer used it
    stale_s: float = HEARTBEAT_STALE_S


def streak(recs: Sequence[Mapping[str, Any]]) -> int:
    """Failures in a row, newest first, that made no progress."""
    n = 0
    for r in reversed(recs):
        if r.get("progress"):
            break
        n += 1
    return n


def progress_matters(policy: Mapping[str, Any], recs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether :func:`decide` can read ``Observed.progress`` (recovery on, restarts left): the observer asks
    the store only then."""
    return 0 < int(policy.get("max_restarts", 0)) and len(recs) < int(policy["max_restarts"])


def signalled(obs: Observed) -> tuple[list[NodeLost], list[int]]:
    """The nodes lost on two signals: the caller's (``lost``, ``gone``), the watcher's recorded finding and
    :func:`decide_lost` of the polls; a node the provider says is gone is re-provisioned (``lost``), the others
    were lost by their launcher (``gone``)."""
    lost = {n.rank: n for n in obs.lost}
    gone = list(obs.gone)
    found = obs.found if obs.found and obs.found.get("state") == RECOVER else None
    said = (found or {}).get("provider") or {}
    words = {int(k): (str(v[0]), str(v[1]) if len(v) > 1 else "") for k, v in said.items()}
    health = decide_lost(obs.polls, stale_s=obs.stale_s) if obs.polls else Health()
    last = {n.rank: n for n in obs.polls[-1].nodes} if obs.polls else {}
    for r in [*((found or {}).get("lost") or []), *(health.lost if health.state == RECOVER else [])]:
        r = int(r)
        word, detail = words.get(r) or ((last[r].provider, last[r].provider_detail) if r in last else ("", ""))
        if word in LOST:
            lost.setdefault(r, NodeLost(r, word, detail))
        elif r not in gone:
            gone.append(r)
    if lost or gone:  # a recovery happens: a node the provider also says is gone must be made again for it
        seen = {**{r: (n.provider, n.provider_detail) for r, n in last.items()}, **words}
        for r, (word, detail) in seen.items():
            if word in GONE_FOR_SURE and r not in lost:
                lost[r] = NodeLost(r, word, detail)
    return sorted(lost.values(), key=lambda n: n.rank), [r for r in gone if r not in lost]


def decide(obs: Observed) -> Verdict:
    """Whether (and why not) to recover the job."""
    pol = obs.policy
    lost, gone = signalled(obs)
    hang = obs.found if obs.found and obs.found.get("state") == HANG else None
    if hang is not None:  # the watcher found it, dumped the stacks and recorded it (policies.recovery.hang_minutes)
        first = hang.get("first_stalled")
        v = Verdict(True, "hang", [int(first)] if first is not None else [], [],
                    detail=str(hang.get("detail") or "a hang"))
    elif lost:
        kind = "preemption" if any(n.status == "preempted" for n in lost) else "node_failure"
        ranks = [n.rank for n in lost]
        v = Verdict(True, kind, ranks, list(ranks),
                    detail="; ".join(f"node {n.rank}: {n.status} {n.detail}".strip() for n in lost))
    elif gone:
        v = Verdict(True, "node_failure", gone, [], detail=f"the job's agent died on node(s) {gone}")
    elif obs.exit_code in pol.get("exit_codes", []):
        v = Verdict(True, "exit_code", [], [], detail=f"the job exited {obs.exit_code}")
    elif obs.exit_code in SIGKILLED:  # the kernel's OOM killer or a kill -9: the node's doing, to most users
        v = Verdict(True, "node_failure", [], [],
                    detail=f"the job exited {obs.exit_code} (a rank was SIGKILLed: the kernel's OOM killer "
                           "or a kill -9)")
    else:
        return Verdict(False, why=f"job {obs.job_id} failed with exit {obs.exit_code}: a failure of the job, not of "
                                  f"a node (policies.recovery.on has no exit_codes: [{obs.exit_code}])")
    recs = list(obs.recoveries)
    if int(pol.get("max_restarts", 0)) <= 0:
        v.recover, v.why = False, f"{v.detail}: recovery is off (policies.recovery.max_restarts: 0)"
    elif v.kind not in ("exit_code", "hang") and v.kind not in pol.get("on", []):  # hang: hang_minutes asked
        v.recover, v.why = False, f"{v.detail}: {v.kind} is not in policies.recovery.on"
    elif len(recs) >= int(pol["max_restarts"]):
        v.recover, v.why = False, f"{v.detail}: max_restarts ({pol['max_restarts']}) reached"
    elif not obs.progress and streak(recs) + 1 >= CRASH_LOOP:
        v.recover, v.why = False, (f"{v.detail}: crash loop: {CRASH_LOOP} failures in a row with no new checkpoint "
                                   "in the store; not restarting")
    return v
