"""The watcher's check (gtrain.runs.signals.Watch, follow's ``check`` through gtrain.runs.recovery.lost_reason)
against a fake provider and backend: status-call errors recover nothing, one provider word is a suspect (and a
node it calls terminated is not asked), a broken stream is the second signal, and the finding is recorded for
the recovery to read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gtrain.errors import GtrainError
from gtrain.events import Reporter
from gtrain.jobs.backend import JobDescription, JobState, NodeJobStatus
from gtrain.runs import follow, recovery
from gtrain.runs.decide import Observed, decide
from gtrain.runs.signals import Watch


class Notes(Reporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)

    def warn(self, msg: str) -> None:
        self.lines.append("warn: " + msg)


class Ctx:
    def __init__(self, words: list[Any], node_states: dict[int, str]) -> None:
        self.words, self.node_states, self.asked = iter(words), node_states, []  # type: ignore[var-annotated]
        self.report = Notes()
        self.job = SimpleNamespace(id="j1", status="running", info={"attempt": 1, "recovery_policy": {
            "max_restarts": 2, "on": ["preemption", "node_failure"], "exit_codes": [], "backoff_s": 0}})
        self.store = self

    # the provider
    def provider(self, name: str) -> Ctx:
        return self

    def describe(self, cluster: Any, nodes: Any = None) -> Any:
        if nodes is not None:  # the backend's describe (not a node-script backend: no heartbeat read)
            self.asked.append(list(nodes))
            return JobDescription("j1", JobState.RUNNING, None, [
                NodeJobStatus(i, JobState.parse(self.node_states[i]), detail=self.node_states[i]) for i in nodes])
        w = next(self.words)
        if isinstance(w, Exception):
            raise w
        return [SimpleNamespace(rank=i, status=s, detail="") for i, s in enumerate(w)]

    def backend(self, cluster: Any) -> Ctx:
        return self

    # the state store
    def get_job(self, job_id: str) -> Any:
        return self.job

    def latest_job(self, cluster_id: str) -> Any:
        return self.job

    def update_job(self, job_id: str, *, status: str, info: dict[str, Any] | None = None) -> None:
        self.job.info = info or self.job.info


CLUSTER = SimpleNamespace(id="c1", name="c", provider="fake", num_nodes=2)


def test_status_call_errors_and_one_provider_word_recover_nothing_then_a_broken_stream_does() -> None:
    words: list[Any] = [GtrainError("timed out")] * 25 + [["running", "running"]] + [["running", "terminated"]] * 3
    ctx = Ctx(words, {0: "running", 1: "running"})
    watch = Watch(CLUSTER, ctx.job, ctx, poll_s=1)  # type: ignore[arg-type]
    assert [watch() for _ in range(26)] == [None] * 26
    assert "signals" not in ctx.job.info
    follow.BROKEN["j1"] = set()
    assert watch() is None  # terminated, but its stream flows and nothing else says so: a suspect
    assert ctx.asked[-1] == [0]  # node 1 (terminated) is not asked: its machine is gone
    assert any("one signal, not two: not recovering" in n for n in ctx.report.lines), ctx.report.lines
    follow.BROKEN["j1"] = {1}  # the follower's stream to node 1 broke
    why = watch()
    assert why == "node 1: the provider says terminated and the node does not answer"
    found = ctx.job.info["signals"]
    assert (found["state"], found["lost"], found["attempt"]) == ("recover", [1], 1)
    v = decide(Observed("j1", None, ctx.job.info["recovery_policy"], found=found))
    assert (v.recover, v.kind, v.lost, v.reprovision) == (True, "node_failure", [1], [1])


def test_lost_reason_keeps_one_watch_per_job_and_attempt() -> None:
    ctx = Ctx([["running", "unreachable"]] * 3, {0: "running", 1: "unreachable"})
    follow.BROKEN.pop("j1", None)
    assert recovery.lost_reason(CLUSTER, ctx) is None  # type: ignore[arg-type]  # one look: a suspect
    assert recovery.lost_reason(CLUSTER, ctx) == (  # type: ignore[arg-type]
        "node 1: the provider says unreachable and it does not answer")
    ctx.job.info = {**ctx.job.info, "attempt": 2}  # the next attempt starts a fresh watch
    assert recovery.lost_reason(CLUSTER, ctx) is None  # type: ignore[arg-type]
