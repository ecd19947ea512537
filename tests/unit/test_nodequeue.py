"""The queue's node side (gtrain.remote.nodequeue): order, what counts as running, a dead waiter, a waiter
leaving a cancelled job; and what `launch --queue` refuses before anything is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.remote import nodequeue


def entry(root: Path, job_id: str, priority: int, seq: float, **extra: object) -> Path:
    jdir = root / "jobs" / job_id
    (jdir / "logs").mkdir(parents=True)
    (jdir / "state.json").write_text(json.dumps({"state": "queued"}))
    q = root / "jobs" / ".queue"
    q.mkdir(exist_ok=True)
    (q / f"{job_id}.json").write_text(json.dumps({"job_id": job_id, "priority": priority, "seq": seq,
                                                  "job_dir": str(jdir), "workdir": str(root / "workdir"),
                                                  **extra}))
    return jdir


def test_waiting_jobs_in_priority_then_enqueue_order_and_a_dead_waiter_is_lost(tmp_path: Path) -> None:
    entry(tmp_path, "a", 0, 1.0)
    entry(tmp_path, "b", 5, 3.0)
    entry(tmp_path, "c", 5, 2.0)
    entry(tmp_path, "d", 9, 4.0, waiter_pid=2**22 + 7)  # no such process: its waiter died
    cancelled = entry(tmp_path, "e", 9, 0.5)
    (cancelled / "cancel").write_text("1")
    docs = nodequeue.entries(str(tmp_path / "jobs" / ".queue"))
    assert [(d["job_id"], d["state"], d.get("position")) for d in docs] == [
        ("c", "waiting", 1), ("b", "waiting", 2), ("a", "waiting", 3), ("d", "lost", None), ("e", "cancelled", None)]


def test_busy_is_a_live_launcher_whose_state_has_not_ended(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jdir = entry(tmp_path, "x", 0, 1.0)
    assert nodequeue.busy(str(jobs)) is None  # queued: no pid
    (jdir / "pid").write_text(f"{os.getpid()}\n")
    (jdir / "state.json").write_text(json.dumps({"state": "running"}))
    assert nodequeue.busy(str(jobs)) == "x"
    assert nodequeue.job_word(str(jdir)) == "running"
    (jdir / "state.json").write_text(json.dumps({"state": "succeeded"}))
    assert nodequeue.busy(str(jobs)) is None
    (jdir / "state.json").write_text(json.dumps({"state": "running"}))
    (jdir / "pid").write_text(f"{2**22 + 7}\n")  # killed without writing its end
    assert nodequeue.busy(str(jobs)) is None and nodequeue.job_word(str(jdir)) == "failed"


def test_a_waiter_starts_its_job_with_the_secrets_then_one_cancelled_leaves(tmp_path: Path) -> None:
    (tmp_path / "workdir").mkdir()
    jdir = entry(tmp_path, "go", 0, 1.0)
    (jdir / "stage").mkdir()
    (jdir / "stage" / "train.txt").write_text("new")
    (jdir / "launch.sh").write_text('echo $$ > "$(dirname "$0")/pid"; read -r -d "" S; echo "got $S" '
                                    '> "$(dirname "$0")/out"; echo \'{"state": "succeeded"}\' > '
                                    '"$(dirname "$0")/state.json"\n')
    qdir = str(tmp_path / "jobs" / ".queue")
    script = Path(nodequeue.__file__)
    p = subprocess.run([sys.executable, str(script), "wait", qdir, "go", "0.05"], input=b"TOKEN=s\x00",
                       capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    deadline = time.time() + 10
    while not (jdir / "out").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (jdir / "out").read_text() == "got TOKEN=s\n"
    assert (tmp_path / "workdir" / "train.txt").read_text() == "new"  # the staged workdir, copied at the start
    assert b"started" in p.stdout
    gone = entry(tmp_path, "gone", 0, 2.0)
    (gone / "cancel").write_text("1")
    p = subprocess.run([sys.executable, str(script), "wait", qdir, "gone", "0.05"], input=b"", capture_output=True,
                       timeout=30)
    assert p.returncode == 0 and b"before it started" in p.stdout
    assert not (gone / "pid").exists()


def test_launch_queue_refuses_setup_and_a_scheduler_backend() -> None:
    from gtrain.errors import ConfigError
    from gtrain.jobs.nodescript import NodeScriptBackend
    from gtrain.jobs.queue import check_queueable
    from gtrain.spec import Job

    nodes = NodeScriptBackend.__new__(NodeScriptBackend)
    check_queueable(nodes, Job(run="t.py"))
    with pytest.raises(ConfigError, match=r"job.setup with --queue"):
        check_queueable(nodes, Job(run="t.py", setup="pip install x"))
    other = type("Sched", (), {"name": "slurm"})()
    with pytest.raises(ConfigError, match="queues jobs itself"):
        check_queueable(other, Job(run="t.py"))  # type: ignore[arg-type]
    assert Job(run="t.py", queue=True, priority=-3).priority == -3
    with pytest.raises(ValueError):
        Job(run="t.py", priority=5000)


def test_a_packed_job_gets_the_lowest_free_gpus_and_a_whole_node_job_waits_for_all(tmp_path: Path) -> None:
    qdir = str(tmp_path / "jobs" / ".queue")
    a = entry(tmp_path, "a", 0, 1.0, gpus=2, node_gpus=4)
    assert nodequeue.fit({"gpus": 2, "node_gpus": 4}, qdir) == [0, 1]
    (a / "pid").write_text(f"{os.getpid()}\n")
    (a / "state.json").write_text(json.dumps({"state": "running"}))
    doc = json.loads((tmp_path / "jobs" / ".queue" / "a.json").read_text())
    (tmp_path / "jobs" / ".queue" / "a.json").write_text(json.dumps({**doc, "devices": [0, 1]}))
    assert nodequeue.fit({"gpus": 1, "node_gpus": 4}, qdir) == [2]
    assert nodequeue.fit({"gpus": 3, "node_gpus": 4}, qdir) is False
    assert nodequeue.fit({}, qdir) is False  # a whole-node job waits for the packed one
    (tmp_path / "jobs" / ".queue" / "a.json").write_text(json.dumps({**doc, "devices": None}))
    assert nodequeue.fit({"gpus": 1, "node_gpus": 4}, qdir) is False  # a whole-node job runs


def test_gpus_per_node_checks() -> None:
    from gtrain.spec import ClusterSpec
    from gtrain.spec.queue import packed, problem

    def spec(accel: str | None, **job: object) -> ClusterSpec:
        return ClusterSpec.model_validate({"name": "x", "resources": {"accelerators": accel},
                                           "job": {"run": "t.py", **job}})

    s = spec("A100:8", gpus_per_node=2)
    assert s.job is not None and packed(s, s.job) and problem(s, s.job, 1) is None
    assert "whole nodes" in (problem(s, s.job, 2) or ("", ""))[1]
    assert problem(s, s.job, 2, scheduler=True) is None  # Slurm, Kubernetes, Ray pack multi-node jobs themselves
    for accel, want, says in (("A100:2", 4, "a node has 2"), (None, 1, "no GPU")):  # no backend could: at load
        with pytest.raises(ConfigError) as e:
            spec(accel, gpus_per_node=want)
        assert says in str(e.value) and e.value.exit_code == 2 and e.value.field == "job.gpus_per_node"
    s = spec("A100:8", gpus_per_node=1, image="ubuntu:24.04")
    assert s.job is not None and "container" in (problem(s, s.job, 1) or ("", ""))[1]
