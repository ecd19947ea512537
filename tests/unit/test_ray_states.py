"""provider ray: the driver's log and Ray's job status -> gtrain's job states (the lines are the ones
gtrain/providers/ray/driver.py prints; the job documents are shaped like GET /api/jobs/{id} of Ray's Jobs REST
API), and the spec's ray section's errors."""

from __future__ import annotations

import pytest

from gtrain.errors import ConfigError
from gtrain.jobs.backend import JobState, aggregate
from gtrain.providers.ray import states
from gtrain.providers.ray.options import RayOptions, resolve_address

LOG = """Running entrypoint for job j: python _gtrain/driver.py
[gtrain] pending: placement group STRICT_SPREAD of 2 bundle(s) [{'CPU': 1.0}] per node is NO_RESOURCES: busy
[gtrain] placed node 0 on 10.0.0.1 (Ray node a)
[gtrain] placed node 1 on 10.0.0.2 (Ray node b)
[gtrain-log 0 0] hello from rank 0
[gtrain-log 1 -] [gtrain] node 1/2 starting torchrun
[gtrain] rank-exit 1 2 0 100.5
[gtrain] rank-exit 1 3 7 100.2
[gtrain] node-exit 1 failed 7
"""


def test_a_failed_rank_gives_its_code_and_the_others_run_on() -> None:
    job = {"status": "RUNNING", "message": ""}
    nodes, reason = states.node_statuses(job, states.parse(LOG), 2)
    assert [n.state for n in nodes] == [JobState.RUNNING, JobState.FAILED]
    assert nodes[1].exit_code == 7 and sorted(r.rank for r in nodes[1].ranks) == [2, 3]
    assert aggregate(nodes) == (JobState.RUNNING, None) and reason == ""


def test_pending_with_the_placement_groups_reason_then_timeout() -> None:
    head = "\n".join(LOG.splitlines()[:2])
    nodes, reason = states.node_statuses({"status": "RUNNING"}, states.parse(head), 2)
    assert all(n.state is JobState.PENDING for n in nodes) and "NO_RESOURCES" in reason
    log = head + "\n[gtrain] pending-timeout: not placed in 10 s (ray.pending_timeout_s): INFEASIBLE\n"
    nodes, reason = states.node_statuses({"status": "FAILED", "driver_exit_code": 124}, states.parse(log), 2)
    assert aggregate(nodes) == (JobState.FAILED, 124) and "not placed in 10 s" in reason


def test_a_lost_node_is_preempted_and_stopped_is_cancelled() -> None:
    log = LOG.split("[gtrain] rank-exit")[0] + "[gtrain] node-lost 1: the Ray node of bundle 1 died\n"
    nodes, reason = states.node_statuses({"status": "RUNNING"}, states.parse(log), 2)
    assert nodes[1].state is JobState.PREEMPTED and "node(s) [1] lost" in reason
    nodes, _ = states.node_statuses({"status": "STOPPED"}, states.parse(LOG.split("[gtrain] rank-exit")[0]), 2)
    assert aggregate(nodes) == (JobState.CANCELLED, 130)


def test_a_driver_that_failed_before_any_node_ended_says_rays_message() -> None:
    job = {"status": "FAILED", "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR", "driver_exit_code": 1,
           "message": "Job entrypoint command failed with exit code 1, last logs:\nModuleNotFoundError: ray"}
    nodes, reason = states.node_statuses(job, states.parse(""), 2)
    assert aggregate(nodes) == (JobState.FAILED, 1) and "ModuleNotFoundError: ray" in reason


def test_the_ray_sections_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="working_dir"):
        RayOptions.model_validate({"runtime_env": {"working_dir": "."}})
    with pytest.raises(ValueError, match="dashboard"):
        RayOptions.model_validate({"address": "ray://head:10001"})
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    with pytest.raises(ConfigError, match="not the Jobs API"):
        resolve_address(None)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265/")
    assert resolve_address(None) == "http://head:8265"
    assert RayOptions().bundle(2) == {"CPU": 1, "GPU": 2.0}
