"""Two signals before a recovery, and hangs, replayed: each incident is the sequence of polls a watcher would
record (the provider's word, each node's own -- launcher, heartbeat -- and its ranks' progress), fed one after
another to the pure :func:`gtrain.runs.decide.decide_lost` as gtrain.runs.signals.Watch does, and what the
watcher found to :func:`gtrain.runs.decide.decide`. The SkyPilot incidents: #10155 (25 status-call timeouts in
19 hours became 24 recoveries), #10162 (one failed probe recovered a healthy job)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from gtrain.runs.decide import (
    HANG,
    HEALTHY,
    RECOVER,
    SUSPECT,
    Health,
    NodeSignals,
    Observed,
    Poll,
    decide,
    decide_lost,
    first_stalled,
)
from gtrain.runs.signals import finding, node_signals

POLICY = {"max_restarts": 5, "on": ["preemption", "node_failure"], "exit_codes": [], "backoff_s": 0,
          "hang_minutes": 1.0}
T0 = 1_700_000_000.0


def alive(rank: int, at: float, *, step: int | None = None, progress: float | None = None, provider: str = "running",
          hb: float = 2.0) -> NodeSignals:
    """A node that answers: its launcher alive, heartbeat ``hb`` seconds old, its ranks' newest progress."""
    return NodeSignals(rank, provider, "", "alive", hb, at - 1 if progress is None else progress, step, rank, True)


def replay(polls: Iterable[Poll], *, hang_s: float | None = None) -> list[Health]:
    """The watcher's loop: the newest two polls decide; a recovery (or hang) ends the follow, and the next
    attempt starts a fresh watch."""
    seen: list[Poll] = []
    out = []
    for p in polls:
        seen = [*seen[-1:], p]
        h = decide_lost(seen, hang_s=hang_s)
        out.append(h)
        if h.state in (RECOVER, HANG):
            seen = []
    return out


def states(hs: list[Health]) -> list[str]:
    return [h.state for h in hs]


def test_skypilot_10155_status_call_timeouts_over_19_hours_recover_nothing() -> None:
    """A poll a minute for 19 hours; 25 of the provider's status calls time out (the watcher records
    ``unknown``) and the nodes, asked then, answer; 3 of those times a node's own read failed too."""
    timeouts = {round(i * 1140 / 25) for i in range(25)}
    node_blips = set(sorted(timeouts)[::9])

    def poll(i: int) -> Poll:
        at = T0 + 60 * i
        if i - 1 in node_blips:  # a suspect is asked again on the next poll: it answers
            return Poll(at, (alive(0, at, step=i), alive(1, at, step=i)))
        if i not in timeouts:  # the provider says they run: the nodes are not asked
            return Poll(at, (NodeSignals(0, "running"), NodeSignals(1, "running")))
        one = NodeSignals(1, "unknown", agent="unreached") if i in node_blips else alive(1, at, step=i)
        return Poll(at, (NodeSignals(0, "unknown", "", "alive", 3.0, at - 5, i, 0, True), one))

    got = replay(poll(i) for i in range(19 * 60))
    assert len(timeouts) == 25 and len(got) == 1140
    assert states(got).count(RECOVER) == 0 and states(got).count(HANG) == 0
    assert states(got).count(SUSPECT) == len(node_blips)  # the read that failed once: asked again, no more


def test_skypilot_10162_one_failed_probe_of_a_healthy_job_recovers_nothing() -> None:
    """One poll where the provider calls a node unreachable and the node's read fails; the next poll it answers.
    Also the provider's wrong word: ``terminated`` of a node the watcher then does not ask (a machine that is
    gone costs SSH's retries) while its stream still flows and the run progresses; ``missing`` of a node that
    answers with a fresh heartbeat."""
    at = [T0 + 5 * i for i in range(6)]
    polls = [Poll(at[0], (alive(0, at[0], step=10), alive(1, at[0], step=10))),
             Poll(at[1], (alive(0, at[1], step=11), NodeSignals(1, "unreachable", agent="unreached"))),
             Poll(at[2], (alive(0, at[2], step=12), alive(1, at[2], step=12))),
             Poll(at[3], (alive(0, at[3], step=13), NodeSignals(1, "terminated"))),
             Poll(at[4], (alive(0, at[4], step=14), NodeSignals(1, "terminated"))),
             Poll(at[5], (alive(0, at[5], step=15), alive(1, at[5], step=15, provider="missing")))]
    got = replay(polls, hang_s=60)
    assert states(got) == [HEALTHY, SUSPECT, HEALTHY, SUSPECT, SUSPECT, SUSPECT]
    assert got[1].lost == [1] and got[1].detail == "node 1: the provider says unreachable"
    assert got[3].detail == "node 1: the provider says terminated"
    assert got[5].detail == "node 1: the provider says missing, but it answers (heartbeat 2s)"


def test_a_real_loss_terminated_and_a_stale_heartbeat_recovers_at_once() -> None:
    at = T0 + 100
    got = replay([Poll(at - 5, (alive(0, at - 5), alive(1, at - 5))),
                  Poll(at, (alive(0, at, progress=at - 35), alive(1, at, provider="terminated", hb=40.0)))])
    assert states(got) == [HEALTHY, RECOVER]
    assert got[1].lost == [1] and got[1].kind == "node_failure"
    assert got[1].detail == "node 1: the provider says terminated and its heartbeat is 40s old"
    # with node 0 stalled too (it waits for node 1 in a collective): three signals
    three = decide_lost([Poll(at, (alive(0, at, progress=at - 35),
                                   alive(1, at, progress=at - 35, provider="terminated", hb=40.0)))])
    assert three.detail == "node 1: the provider says terminated and its heartbeat is 40s old and no rank made " \
                           "progress in 30s"


def test_a_real_loss_with_the_node_gone_recovers_within_two_polls() -> None:
    """``stopped`` (a weaker word) and the node does not answer: a suspect on the first poll, lost on the second;
    ``preempted`` and not answering: lost on the first."""
    at = T0 + 50
    stopped = [Poll(at, (alive(0, at), NodeSignals(1, "stopped", agent="unreached"))),
               Poll(at + 5, (alive(0, at + 5), NodeSignals(1, "stopped", agent="unreached")))]
    assert states(replay(stopped)) == [SUSPECT, RECOVER]
    pre = replay([Poll(at, (alive(0, at), NodeSignals(1, "preempted", "spot", "unreached")))])
    assert states(pre) == [RECOVER] and pre[0].kind == "preemption"
    assert pre[0].detail == "node 1: the provider says preempted (spot) and the node does not answer"


def test_a_dead_launcher_is_lost_alone_and_a_mute_provider_needs_two_of_the_node_signals() -> None:
    at = T0 + 500
    dead = replay([Poll(at, (alive(0, at), NodeSignals(1, "running", agent="dead")))])
    assert states(dead) == [RECOVER] and dead[0].detail == "node 1: its launcher died (the node's own state)"
    # the provider cannot say; node 1 does not answer twice and nothing progressed for 30 s: lost
    mute = [Poll(at + 5 * i, (alive(0, at + 5 * i, progress=at - 40), NodeSignals(1, "unknown", agent="unreached")))
            for i in range(2)]
    assert states(replay(mute)) == [SUSPECT, RECOVER]
    # ... the same while node 0 still trains (progress): a suspect, asked again
    busy = [Poll(at + 5 * i, (alive(0, at + 5 * i), NodeSignals(1, "unknown", agent="unreached"))) for i in range(2)]
    assert states(replay(busy)) == [SUSPECT, SUSPECT]


def test_at_the_jobs_end_the_end_is_a_signal() -> None:
    """The job ended (the fail-fast stopped it): a node the provider says is missing, or that does not answer,
    is lost; one that answers ``ended`` while the provider says it runs is not."""
    at = T0 + 9
    ended = NodeSignals(0, "running", "", "ended", 3.0)
    assert replay([Poll(at, (ended, NodeSignals(1, "missing", agent="ended")), ended=True)])[0].lost == [1]
    assert replay([Poll(at, (ended, NodeSignals(1, "running", agent="unreached")), ended=True)])[0].state == RECOVER
    assert replay([Poll(at, (ended, NodeSignals(1, "running", "", "ended", 3.0)), ended=True)])[0].state == HEALTHY


def test_a_hang_is_found_after_hang_minutes_and_names_the_node_that_stalled_first() -> None:
    """Node 1's rank 1 stops at step 41 (before its collective); node 0's rank 0 logged step 42 and waits in the
    all-reduce. Every node alive, heartbeats fresh. A poll every 10 s, hang_minutes 1."""
    stop = T0 + 1000
    polls = [Poll(stop + 10 * i, (alive(0, stop + 10 * i, step=42, progress=stop + 0.3),
                                  alive(1, stop + 10 * i, step=41, progress=stop)), started_at=T0)
             for i in range(8)]
    got = replay(polls, hang_s=60)
    assert states(got) == [HEALTHY] * 7 + [HANG]
    h = got[7]
    assert (h.state, h.kind, h.lost, h.first_stalled, h.first_rank) == (HANG, "hang", [1], 1, 1)
    assert h.detail == "no rank made progress for 70s while every node is alive; node 1 (rank 1) stalled first " \
                       "at step 41"
    # the watcher records it (with how the stacks were dumped); the recovery reads it: a hang, nothing re-provisioned
    found = finding(_job(), h, polls[7], dumped={"0": {"0": "faulthandler"}, "1": {"1": "faulthandler"}})
    v = decide(Observed("j1", None, POLICY, found=found))
    assert (v.recover, v.kind, v.lost, v.reprovision) == (True, "hang", [1], [])
    # the kind is asked for by hang_minutes, not by `on`; max_restarts still holds
    assert decide(Observed("j1", None, {**POLICY, "on": []}, found=found)).recover
    assert not decide(Observed("j1", None, POLICY, recoveries=[{"progress": True}] * 5, found=found)).recover


def test_a_slow_run_that_progresses_is_no_hang() -> None:
    """A step every 50 s with hang_minutes 1, for an hour; and a run where only rank 0 logs (the other rank's
    log is silent since the start): the newest progress of any rank counts."""
    polls = [Poll(T0 + 10 * i, (alive(0, T0 + 10 * i, step=i // 5, progress=T0 + 50 * (i // 5)),
                                alive(1, T0 + 10 * i, step=i // 5, progress=T0 + 50 * (i // 5) - 1)), started_at=T0)
             for i in range(360)]
    assert set(states(replay(polls, hang_s=60))) == {HEALTHY}
    quiet = [Poll(T0 + 10 * i, (alive(0, T0 + 10 * i, step=i, progress=T0 + 10 * i - 2),
                                alive(1, T0 + 10 * i, progress=T0)), started_at=T0) for i in range(60)]
    assert set(states(replay(quiet, hang_s=60))) == {HEALTHY}


def test_no_hang_while_a_node_is_a_suspect_or_before_anything_could_progress() -> None:
    at = T0 + 1000
    sus = Poll(at, (alive(0, at, progress=at - 100), alive(1, at, progress=at - 100, provider="preempted")))
    assert decide_lost([sus], hang_s=60).state == SUSPECT
    # a new attempt: the ranks' files are from the last one; progress counts from the attempt's start
    fresh = Poll(at, (alive(0, at, progress=at - 300), alive(1, at, progress=at - 300)), started_at=at - 20)
    assert decide_lost([fresh], hang_s=60).state == HEALTHY


def test_which_node_stalled_first_cannot_always_be_told() -> None:
    at = T0
    tie = [alive(0, at, step=7, progress=at), alive(1, at, step=7, progress=at + 0.2)]
    assert first_stalled(tie) is None
    assert first_stalled([alive(0, at, progress=at + 5), alive(1, at, progress=at)]).rank == 1  # type: ignore[union-attr]
    assert first_stalled([alive(0, at)]) is None


def test_node_signals_turn_the_nodes_ages_into_the_watchers_clock() -> None:
    health = {"agent": "alive", "heartbeat_age": 1.5, "started_age": 90.0,
              "ranks": {"2": {"age": 4.0, "step": 12, "by": "metrics"},
                        "3": {"age": 30.0, "step": 11, "by": "metrics"}}}
    n = node_signals(1, 1000.0, {1: ("running", "")}, health)
    assert (n.agent, n.heartbeat_age_s, n.progress_at, n.step, n.slowest_rank, n.live_ranks) == (
        "alive", 1.5, 996.0, 12, 3, True)
    assert node_signals(0, 1000.0, None, None) == NodeSignals(0, "unknown")


def _job() -> Any:
    class J:
        id = "j1"
        info: dict[str, Any] = {"attempt": 1}
    return J()


# ---- the node's side (gtrain.remote.nodehealth), on this machine ----------------------------------------


def _job_dir(tmp_path: Path, state: dict[str, Any]) -> Path:
    jd = tmp_path / "job"
    (jd / "logs").mkdir(parents=True)
    (jd / "metrics").mkdir()
    (jd / "ranks").mkdir()
    (jd / "state.json").write_text(json.dumps(state))
    return jd


def test_nodehealth_reads_the_launcher_heartbeat_and_progress(tmp_path: Path) -> None:
    from gtrain.remote import nodehealth

    jd = _job_dir(tmp_path, {"state": "running", "pid": os.getpid(), "time": time.time() - 60})
    (jd / "heartbeat").write_text("1\n")
    (jd / "logs" / "rank-0.log").write_text("hello\n")
    (jd / "metrics" / "rank-0.jsonl").write_text('{"step": 4}\n{"step": 5, "loss": 1}\n{"note": "x"}\n')
    (jd / "logs" / "rank-1.log").write_text("done\n")
    (jd / "logs" / "rank-1.exit").write_text("0 1.0\n")
    got = nodehealth.health(str(jd))
    assert got["agent"] == "alive" and 0 <= float(got["heartbeat_age"]) < 5  # type: ignore[arg-type]
    assert list(got["ranks"]) == ["0"]  # type: ignore[call-overload]
    assert got["ranks"]["0"]["step"] == 5 and got["ranks"]["0"]["by"] == "metrics"  # type: ignore[index]
    (jd / "state.json").write_text(json.dumps({"state": "running", "pid": 2 ** 22 + 7}))
    assert nodehealth.health(str(jd))["agent"] == "dead"
    assert nodehealth.health(str(tmp_path / "gone"))["agent"] == "dead"


def test_nodehealth_dump_makes_a_wedged_rank_print_its_stacks(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No py-spy: SIGABRT, and PYTHONFAULTHANDLER=1 makes the rank print every thread's traceback into its log."""
    from gtrain.remote import nodehealth

    jd = _job_dir(tmp_path, {"state": "running", "pid": os.getpid()})
    log = jd / "logs" / "rank-0.log"
    script = "import time\ndef wedged_here():\n    print('ready', flush=True)\n    time.sleep(600)\nwedged_here()\n"
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "GTRAIN_JOB_ID": "job-x", "GTRAIN_PYSPY": "0"}
    with open(log, "ab") as out:
        p = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=out, env=env)
    (jd / "ranks" / "0.pid").write_text(f"{p.pid}\n")
    _until(lambda: "ready" in log.read_text())
    monkeypatch.setenv("GTRAIN_PYSPY", "0")  # the faulthandler way, whether this machine has py-spy or not
    assert nodehealth.dump(str(jd), "another-job") == {"0": f"pid {p.pid} is not this job's rank (ended, or in "
                                                             "a container)"}
    assert nodehealth.dump(str(jd), "job-x") == {"0": "faulthandler"}
    assert p.wait(timeout=10) == -signal.SIGABRT
    text = log.read_text()
    assert "[gtrain] hang: SIGABRT to rank 0" in text and "Current thread" in text, text
    assert 'line 4 in wedged_here' in text, text


def _until(cond: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline
        time.sleep(0.02)


def test_hang_minutes_is_checked_and_stored_with_the_job() -> None:
    from gtrain.errors import ConfigError
    from gtrain.spec import parse_spec

    def spec(v: object) -> Any:
        return parse_spec({"name": "a", "policies": {"recovery": {"max_restarts": 1, "hang_minutes": v}}})

    assert spec(0.1).policies.recovery.to_info()["hang_minutes"] == 0.1
    assert "hang_minutes" not in spec(None).policies.recovery.to_info()
    for bad, why in ((0, "greater than 0"), (-1, "greater than 0"), (float("inf"), "finite"), (True, "boolean"),
                     (20000, "less than or equal to 10080")):
        with pytest.raises(ConfigError) as e:
            spec(bad)
        assert e.value.field == "policies.recovery.hang_minutes" and why in e.value.message, e.value.message
