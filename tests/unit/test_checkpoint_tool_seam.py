"""The JobBackend seam's ``checkpoint_tool``: a backend whose plan carries gtrain's checkpoint tool ("plan":
its nodes exist only once submitted) is never asked for runners by gtrain/runs/ship.py; the run's store
folder comes from its plan, and the collect before a relaunch is skipped."""

from __future__ import annotations

from typing import Any

import pytest

from gtrain.events import SILENT
from gtrain.jobs.backend import JobBackend, JobPlan, JobRequest
from gtrain.runs import ship
from gtrain.spec import parse_spec


class PlanBackend(JobBackend):
    name = "plan-carrier"
    checkpoint_tool = "plan"

    @property
    def runners(self) -> Any:  # what a "plan" backend must never be asked for
        raise AssertionError("ship.py reached for runners of a backend whose plan carries the tool")

    def dryrun(self, request: JobRequest) -> JobPlan:
        return JobPlan(request, {}, {"checkpoint_key": "c/run-1"})

    def submit(self, plan: JobPlan, report: Any = None) -> str:
        return plan.job_id

    def describe(self, job: Any, nodes: list[int] | None = None) -> Any:
        raise NotImplementedError

    def log_iter(self, *a: Any, **kw: Any) -> Any:
        raise NotImplementedError

    def cancel(self, *a: Any, **kw: Any) -> None:
        raise NotImplementedError


def _plan(tmp_path: Any) -> tuple[PlanBackend, JobPlan]:
    (tmp_path / "train.py").write_text("")
    spec = parse_spec({"name": "c", "provider": "local", "num_nodes": 2,
                       "job": {"run": "train.py", "workdir": str(tmp_path), "checkpoint_store": "s3://ckpt-bucket/runs"}})
    cluster: Any = type("C", (), {"name": "c", "num_nodes": 2, "id": "c-1"})()
    backend = PlanBackend(provider=None, cluster=cluster)  # type: ignore[arg-type]
    return backend, backend.dryrun(JobRequest(cluster, spec, "c-20260101-000000-abcd", str(tmp_path)))


def test_prepare_takes_the_key_from_the_plan_and_touches_no_node(tmp_path: Any) -> None:
    backend, plan = _plan(tmp_path)
    ship.prepare(plan, backend, SILENT, attempt=3)
    assert plan.info["checkpoint_key"] == "c/run-1" and plan.info["attempt"] == 3
    assert plan.info["checkpoint_store"] == "s3://ckpt-bucket/runs"


def test_a_runners_backend_without_runners_is_refused_naming_the_field(tmp_path: Any) -> None:
    from gtrain.errors import ConfigError

    backend, plan = _plan(tmp_path)
    backend.checkpoint_tool = "runners"  # as the default: the tool goes over runners, which this one lacks
    type(backend).runners = property(lambda self: None)  # type: ignore[assignment]
    try:
        with pytest.raises(ConfigError) as e:
            ship.prepare(plan, backend, SILENT)
        assert e.value.field == "job.checkpoint_store"
    finally:
        del type(backend).runners

