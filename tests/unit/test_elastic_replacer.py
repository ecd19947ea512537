"""An elastic job's lost node, replaced alone (gtrain.runs.elastic), on two races found on ssh hosts and aws:

1. The watcher's elastic side (``Replacer``) decides on the job as the watcher's poll left it: the poll (``base``)
   records its finding -- the loss on two signals, the node's broken stream among them -- in the job's info, and
   the classification must read that record, not a copy taken before the poll. With the older copy, a spot
   instance EC2 took back was classified again from one fresh look (the provider's word only: the broken stream is
   the watcher's), found no loss, and the elastic job went to the whole-job recovery (test_elastic_aws.py).
2. While the replacement starts on the lost node, the follower's refresh must not end what runs there as "workers
   a dead agent left": it killed the replacement's store check (exit -15), and the job went to the whole-job
   recovery (bench/elastic_recovery.py, local)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gtrain.jobs.backend import JobDescription, JobState, NodeJobStatus
from gtrain.jobs.status import refresh_job
from gtrain.runs.decide import Verdict
from gtrain.runs.elastic import Replacer


class _Store:
    def __init__(self) -> None:
        self.info: dict[str, Any] = {"elastic": {"min": 2, "max": 3, "mode": "torchrun"}, "attempt": 1}

    def get_job(self, job_id: str) -> Any:
        return SimpleNamespace(id=job_id, info=dict(self.info), created_at=0.0, status="running")

    def get_cluster_by_id(self, cid: str) -> Any:
        return SimpleNamespace(id=cid, num_nodes=3)


def test_the_loss_is_classified_from_the_record_the_poll_left() -> None:
    store = _Store()
    seen: list[dict[str, Any]] = []

    def base() -> str:  # the watcher's poll: a loss on two signals, recorded for the recovery to read
        store.info["signals"] = {"attempt": 1, "state": "recover", "lost": [2], "kind": "preemption"}
        return "node 2: the provider says preempted and the node does not answer"

    def classify(_cluster: Any, job: Any, _ctx: Any) -> Verdict:
        seen.append(job.info)
        return Verdict(False, why="(not replaced in this test)")

    r = Replacer(SimpleNamespace(id="c", num_nodes=3), "j", SimpleNamespace(store=store), classify)  # type: ignore[arg-type]
    assert r.check(base) == "node 2: the provider says preempted and the node does not answer"
    assert seen and seen[0].get("signals", {}).get("lost") == [2], seen


class _Backend:
    def __init__(self) -> None:
        self.cancelled: list[list[int] | None] = []

    def describe(self, job: Any, nodes: list[int] | None = None) -> JobDescription:
        up = [NodeJobStatus(i, JobState.RUNNING, detail="running") for i in (0, 1)]
        # node 2: its old agent dead (state.json says failed), and something of the job runs there
        two = NodeJobStatus(2, JobState.FAILED, 137, detail="failed", orphans=True, raw={"lost": True})
        return JobDescription(job.id, JobState.RUNNING, None, [*up, two])

    def cancel(self, job: Any, nodes: list[int] | None = None, grace_s: float = 0) -> None:
        self.cancelled.append(nodes)


def _refresh(pending: dict[str, Any] | None) -> list[list[int] | None]:
    store, backend = _Store(), _Backend()
    if pending is not None:
        store.info["elastic_pending"] = pending
    store.update_job = lambda *a, **k: None  # type: ignore[attr-defined]
    ctx = SimpleNamespace(store=store, report=SimpleNamespace(warn=lambda m: None, info=lambda m: None),
                          backend=lambda c: backend)
    job = SimpleNamespace(id="j", status="running", exit_code=None, info=dict(store.info))
    refresh_job(SimpleNamespace(id="c", name="c", num_nodes=3), job, ctx)  # type: ignore[arg-type]
    return backend.cancelled


def test_the_refresh_leaves_a_node_being_replaced_to_its_replacement() -> None:
    assert _refresh({"lost": [2], "kind": "node_failure"}) == []
    # with no replacement under way, a dead agent's workers are ended as before, and only there
    assert _refresh(None) == [[2]]
