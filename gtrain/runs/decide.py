"""The recovery decision, with no I/O: what the follower observed of a job that ended badly or lost a node
(:class:`Observed`) in, whether to recover it and why (:class:`Verdict`) out.

Sans-I/O, as h11 is: :func:`gtrain.runs.recovery.observe` asks the provider, the job backend and the store,
and this module only decides, so an incident replays as a test from the events it recorded
(tests/unit/test_recovery_decide.py) and the rule can change without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: what the provider says of a node that is gone
LOST = ("preempted", "terminated", "missing", "stopped", "unreachable")
#: this many failures in a row without progress (no new checkpoint in the store) is a crash loop
CRASH_LOOP = 3
#: exit codes of a rank killed by SIGKILL (bash's 128+9; -9 where the agent reports the signal): recovered as
#: a node_failure (the crash-loop guard stops a script that OOMs every time)
SIGKILLED = (137, -9)


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
class Observed:
    """Everything the decision reads, as observed when the job ended badly or lost a node."""

    job_id: str
    exit_code: int | None
    #: ``policies.recovery`` as stored with the job (``max_restarts``, ``on``, ``exit_codes``, ``backoff_s``)
    policy: Mapping[str, Any]
    #: the job's recoveries so far (``info["recoveries"]``), oldest first
    recoveries: Sequence[Mapping[str, Any]] = ()
    #: nodes the provider reports gone
    lost: Sequence[NodeLost] = ()
    #: nodes whose part of the job died with its agent (the backend's ``lost`` / missing / unreachable)
    gone: Sequence[int] = ()
    #: whether the attempt that just ended got anywhere (a new complete checkpoint in the store, else a minute
    #: or more of running); None when it was not asked (it cannot change the verdict)
    progress: bool | None = None


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


def decide(obs: Observed) -> Verdict:
    """Whether (and why not) to recover the job."""
    pol = obs.policy
    if obs.lost:
        lost = sorted(obs.lost, key=lambda n: n.rank)
        kind = "preemption" if any(n.status == "preempted" for n in lost) else "node_failure"
        ranks = [n.rank for n in lost]
        v = Verdict(True, kind, ranks, list(ranks),
                    detail="; ".join(f"node {n.rank}: {n.status} {n.detail}".strip() for n in lost))
    elif obs.gone:
        gone = list(obs.gone)
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
    elif v.kind != "exit_code" and v.kind not in pol.get("on", []):
        v.recover, v.why = False, f"{v.detail}: {v.kind} is not in policies.recovery.on"
    elif len(recs) >= int(pol["max_restarts"]):
        v.recover, v.why = False, f"{v.detail}: max_restarts ({pol['max_restarts']}) reached"
    elif not obs.progress and streak(recs) + 1 >= CRASH_LOOP:
        v.recover, v.why = False, (f"{v.detail}: crash loop: {CRASH_LOOP} failures in a row with no new checkpoint "
                                   "in the store; not restarting")
    return v
