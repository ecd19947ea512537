"""The recovery decision replayed from what a follower observed, with no cluster, provider or store: each
incident is the list of observations a real run recorded (tests/integration/test_recovery*.py make them for
real), fed one after another to :func:`gtrain.runs.decide.decide` the way the recovery does."""

from __future__ import annotations

from typing import Any

import pytest

from gtrain.errors import GtrainError
from gtrain.runs.decide import CRASH_LOOP, NodeLost, Observed, decide, progress_matters, streak

ON_ALL = {"max_restarts": 5, "on": ["preemption", "node_failure"], "exit_codes": [75], "backoff_s": 30}


def obs(**kw: Any) -> Observed:
    base: dict[str, Any] = {"job_id": "j1", "exit_code": None, "policy": ON_ALL}
    return Observed(**{**base, **kw})


def test_a_preempted_node_is_recovered_and_replaced() -> None:
    v = decide(obs(lost=[NodeLost(1, "preempted", "spot reclaimed")]))
    assert (v.recover, v.kind, v.lost, v.reprovision) == (True, "preemption", [1], [1])
    assert v.detail == "node 1: preempted spot reclaimed"


def test_a_terminated_and_a_preempted_node_in_one_observation_is_a_preemption_of_both() -> None:
    v = decide(obs(lost=[NodeLost(2, "terminated"), NodeLost(0, "preempted")]))
    assert (v.kind, v.lost) == ("preemption", [0, 2])
    assert v.detail == "node 0: preempted; node 2: terminated"


def test_a_dead_agent_is_a_node_failure_without_reprovisioning() -> None:
    v = decide(obs(gone=[3], exit_code=1))
    assert (v.recover, v.kind, v.lost, v.reprovision) == (True, "node_failure", [3], [])


@pytest.mark.parametrize(("code", "recover", "kind"), [(75, True, "exit_code"), (137, True, "node_failure"),
                                                       (-9, True, "node_failure"), (1, False, "")])
def test_exit_codes(code: int, recover: bool, kind: str) -> None:
    v = decide(obs(exit_code=code, progress=True))
    assert (v.recover, v.kind) == (recover, kind)
    if not recover:
        assert v.why == ("job j1 failed with exit 1: a failure of the job, not of a node "
                         "(policies.recovery.on has no exit_codes: [1])")


def test_recovery_off_and_a_kind_not_asked_for_say_why() -> None:
    off = decide(obs(policy={**ON_ALL, "max_restarts": 0}, lost=[NodeLost(0, "preempted")]))
    assert not off.recover and off.why.endswith("recovery is off (policies.recovery.max_restarts: 0)")
    only_pre = decide(obs(policy={**ON_ALL, "on": ["preemption"]}, gone=[1], progress=True))
    assert not only_pre.recover and only_pre.why.endswith("node_failure is not in policies.recovery.on")


def test_replayed_incident_max_restarts_reached() -> None:
    """Three preemptions, each followed by a recovery that made progress: the fourth is refused at
    max_restarts 3."""
    pol = {**ON_ALL, "max_restarts": 3}
    recs: list[dict[str, Any]] = []
    verdicts = []
    for _ in range(4):
        v = decide(obs(policy=pol, recoveries=list(recs), lost=[NodeLost(1, "preempted")], progress=True))
        verdicts.append(v.recover)
        if v.recover:
            recs.append({"kind": v.kind, "progress": True})
    assert verdicts == [True, True, True, False]
    assert v.why == "node 1: preempted: max_restarts (3) reached"


def test_replayed_incident_crash_loop_stops_restarting() -> None:
    """A script that OOMs (exit 137) at once on every attempt: no new checkpoint, so the third failure in a row
    is a crash loop, however many restarts are left."""
    recs: list[dict[str, Any]] = []
    verdicts = []
    for _ in range(CRASH_LOOP):
        v = decide(obs(exit_code=137, recoveries=list(recs), progress=False))
        verdicts.append(v.recover)
        if v.recover:
            recs.append({"kind": v.kind, "progress": False})
    assert verdicts == [True, True, False]
    assert "crash loop: 3 failures in a row with no new checkpoint" in v.why
    # progress on the last attempt breaks the streak
    assert decide(obs(exit_code=137, recoveries=list(recs), progress=True)).recover


def test_streak_and_when_progress_is_asked() -> None:
    assert streak([{"progress": True}, {"progress": False}, {}]) == 2
    assert streak([{"progress": False}, {"progress": True}]) == 0
    assert progress_matters(ON_ALL, [{}] * 4) and not progress_matters(ON_ALL, [{}] * 5)
    assert not progress_matters({"max_restarts": 0}, [])


def test_a_hangs_first_stalled_node_is_swapped_where_the_provider_can() -> None:
    from types import SimpleNamespace

    from gtrain.runs.recovery import exclude_stalled

    swapped: list[list[int]] = []

    class Provider:
        def __init__(self, can: bool, fail: bool = False) -> None:
            self.can_replace_nodes, self.fail = can, fail

        def replace_nodes(self, cluster: object, ranks: list[int]) -> None:
            if self.fail:
                raise GtrainError("no capacity")
            swapped.append(ranks)

    said: list[str] = []
    report = SimpleNamespace(info=said.append, warn=said.append)
    cluster = SimpleNamespace(provider="aws")
    for can, fail, want in ((True, False, [1]), (False, False, []), (True, True, [])):
        ctx = SimpleNamespace(provider=lambda _name, p=Provider(can, fail): p, report=report)
        rec = {"kind": "hang", "lost": [1]}
        assert exclude_stalled(cluster, ctx, rec) is True  # type: ignore[arg-type]
        assert rec["replaced"] == want
        assert exclude_stalled(cluster, ctx, rec) is False  # once per recovery  # type: ignore[arg-type]
    assert swapped == [[1]]
    assert exclude_stalled(cluster, ctx, {"kind": "node_failure", "lost": [1]}) is False  # type: ignore[arg-type]
    assert exclude_stalled(cluster, ctx, {"kind": "hang", "lost": []}) is False  # type: ignore[arg-type]
