"""provider: slurm against a real slurmctld + 2 slurmd (tests/fixtures/slurm.py): `gtrain run` of a 2-node x
2-process torchrun job, a failing rank, cancel by `down`, a time limit, a requeue that resumes, a bad
partition, and `gtrain status` making one squeue call (a PATH shim counts them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import gtrain
from gtrain.spec import parse_spec

JOBS = Path(__file__).parent / "jobs"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def slurm_spec(c: Any, tmp: Path, name: str, run: str, **slurm: Any) -> dict[str, Any]:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "slurm_train.py", work / "slurm_train.py")
    return {"name": name, "provider": "slurm", "num_nodes": 2,
            "slurm": {"partition": c.partition, "shared_dir": str(c.shared), "conf": c.conf, **slurm},
            "job": {"workdir": str(work), "run": run, "nproc_per_node": 2, "python": sys.executable,
                    "env": {"OMP_NUM_THREADS": "1"}}}


def write(tmp: Path, spec: dict[str, Any]) -> str:
    p = tmp / f"{spec['name']}.yaml"
    p.write_text(yaml.safe_dump(spec))
    return str(p)


def processes(job_id: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                env = Path(f"/proc/{d}/environ").read_bytes()
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if f"GTRAIN_JOB_ID={job_id}".encode() in env and stat != "Z":
                out.append(int(d))
    return out


def test_run_two_nodes_four_ranks_logs_and_checkpoint(slurm_cluster: Any, tmp_path: Path) -> None:
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-run", "slurm_train.py --steps 3")
    dest = tmp_path / "pulled"
    res = cli("run", write(tmp_path, spec), "--to", str(dest))
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    for r in range(4):  # every rank's lines, live
        assert f"slurm rank {r}/4" in out, out[-3000:]
    assert "submitted as Slurm job" in out
    state = json.loads((dest / "state.json").read_text())  # the checkpoint, pulled and verified
    assert state == {"step": 3, "sum": 10.0, "restart": "0"}
    assert slurm_cluster.jobs() and all(" COMPLETED " in j for j in slurm_cluster.jobs() if "sl-run" in j)
    assert not (slurm_cluster.shared / "gtrain" / "sl-run").exists()  # down removed the job folders


def test_failing_rank_exit_code_is_the_jobs(slurm_cluster: Any, tmp_path: Path) -> None:
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-fail", "slurm_train.py --steps 1 --exit-code 7")
    res = cli("run", write(tmp_path, spec), "--to", str(tmp_path / "pulled"))
    assert res.returncode == 7, res.stdout + res.stderr


def test_down_cancels_a_running_job(slurm_cluster: Any, tmp_path: Path) -> None:
    down_cancels_running(slurm_cluster, slurm_spec(slurm_cluster, tmp_path, "sl-down",
                                                   "slurm_train.py --steps 200 --step-s 0.5"))


def wait_ranks(job_id: str, n: int = 4, timeout: float = 90) -> None:
    """Until ``n`` processes of the job run (its ranks, at least)."""
    deadline = time.monotonic() + timeout
    while len(processes(job_id)) < n:
        assert time.monotonic() < deadline, f"{job_id}: {len(processes(job_id))} process(es)"
        time.sleep(0.3)


def down_cancels_running(c: Any, spec: dict[str, Any], meanwhile: Callable[[str], None] | None = None) -> None:
    """up, launch, wait for the ranks (then ``meanwhile(job_id)``), `gtrain down`: no process of the job is
    left and Slurm says CANCELLED."""
    gtrain.up(parse_spec(spec))
    job_id = gtrain.launch(parse_spec(spec)).job_id
    wait_ranks(job_id)
    if meanwhile is not None:
        meanwhile(job_id)
    sid = _slurm_id(job_id)
    res = cli("down", spec["name"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert processes(job_id) == []
    assert [j for j in c.jobs() if j.startswith(f"{sid} ")] == [f"{sid} CANCELLED {job_id}"]


def _slurm_id(job_id: str) -> str:
    from gtrain.context import Context

    ctx = Context()
    try:
        return str(ctx.store.get_job(job_id).info["slurm_job_id"])
    finally:
        ctx.store.close()


def test_time_limit_signal_then_timeout(slurm_cluster: Any, tmp_path: Path) -> None:
    # Slurm's time limit has minute resolution: 1 minute, with the USR1 notice 50 s before it
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-time", "slurm_train.py --steps 500 --step-s 0.5", time="1",
                      signal="B:USR1@50")
    res = cli("run", write(tmp_path, spec), "--to", str(tmp_path / "pulled"), timeout=240)
    assert res.returncode == 124, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "saw GTRAIN_PREEMPT_FILE" in out, out[-3000:]  # the ranks learnt of the limit before it came
    assert "TIMEOUT" in out, out[-3000:]


def test_requeue_resumes_from_the_checkpoint(slurm_cluster: Any, tmp_path: Path) -> None:
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-requeue", "slurm_train.py --steps 12 --step-s 0.5")
    gtrain.up(parse_spec(spec))
    try:
        job_id = gtrain.launch(parse_spec(spec)).job_id
        ckpt = slurm_cluster.shared / "gtrain" / "sl-requeue" / "workdir" / "checkpoints" / "state.json"
        deadline = time.monotonic() + 90
        while not ckpt.exists() or json.loads(ckpt.read_text())["step"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        sid = _slurm_id(job_id)
        slurm_cluster.run("scontrol", "requeue", sid)
        while "PENDING" not in slurm_cluster.run("squeue", "-h", "-j", sid, "-o", "%T").stdout:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # slurmctld holds a requeued job back for a while (BeginTime); the test need not wait for it
        slurm_cluster.run("scontrol", "update", f"JobId={sid}", "StartTime=now", check=False)
        lines: list[str] = []
        final = gtrain.wait("sl-requeue", job_id=job_id, on_line=lambda ln: lines.append(ln.text))
        assert (final.status, final.exit_code) == ("succeeded", 0), final.info
        state = json.loads(ckpt.read_text())
        assert state["step"] == 12 and state["restart"] == "1", state
        resumed = [ln for ln in lines if "resumes at step" in ln and not ln.endswith("step 0")]
        assert resumed, lines[-30:]
    finally:
        gtrain.down("sl-requeue")


def test_bad_partition_exit_2_nothing_submitted(slurm_cluster: Any, tmp_path: Path) -> None:
    before = slurm_cluster.jobs()
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-bad", "slurm_train.py", partition="nope")
    res = cli("up", write(tmp_path, spec))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "slurm.partition" in res.stderr and "nope" in res.stderr and "Traceback" not in res.stderr
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-bad2", "slurm_train.py", extra_sbatch=["--mem=999999999"])
    res = cli("run", write(tmp_path, spec), "--to", str(tmp_path / "pulled"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert slurm_cluster.jobs() == before


def test_status_makes_one_squeue_call(slurm_cluster: Any, tmp_path: Path) -> None:
    shim = tmp_path / "bin"
    shim.mkdir()
    count = tmp_path / "squeue.calls"
    real = shutil.which("squeue")
    (shim / "squeue").write_text(f"#!/bin/sh\necho x >> {count}\nexec {real} \"$@\"\n")
    (shim / "squeue").chmod(0o755)
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-status", "slurm_train.py --steps 60 --step-s 0.5")
    gtrain.up(parse_spec(spec))
    try:
        gtrain.launch(parse_spec(spec))
        res = cli("status", "sl-status", env={"PATH": f"{shim}:{os.environ['PATH']}"})
        assert res.returncode == 0, res.stdout + res.stderr
        assert count.read_text().count("x") == 1, res.stdout
    finally:
        gtrain.down("sl-status")
