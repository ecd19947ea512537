"""slurm.hold (an allocation taken at `up`, each launch a step in it, released by `down`, its held time
charged) and `gtrain exec` inside the running job's allocation (srun --overlap) or on the login side, against
the real Slurm of tests/fixtures/slurm.py."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import gtrain
from gtrain.spec import parse_spec
from tests.integration.test_slurm import _slurm_id, cli, processes, slurm_spec, wait_ranks, write


def _hold_jobs(c: Any, name: str) -> list[str]:
    return [j for j in c.jobs() if j.endswith(f" gtrain-hold-{name}")]


def test_hold_two_launches_in_one_allocation_cancel_exec_cost_down(slurm_cluster: Any, tmp_path: Path) -> None:
    c = slurm_cluster
    spec = slurm_spec(c, tmp_path, "sl-hold", "slurm_train.py --steps 2", hold=True)
    path = write(tmp_path, spec)
    res = cli("up", path)
    t_up = time.time()
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        held = _hold_jobs(c, "sl-hold")
        assert len(held) == 1 and " RUNNING " in held[0], c.jobs()  # the nodes are held, nothing launched yet
        alloc = held[0].split()[0]
        res = cli("exec", "sl-hold", "--", "echo on $SLURMD_NODENAME step $SLURM_STEP_ID")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"inside the held allocation {alloc}" in res.stderr
        assert "on gtn1" in res.stdout and "on gtn2" in res.stdout, res.stdout
        for run, code in (("slurm_train.py --steps 1 --exit-code 7", 7), ("slurm_train.py --steps 2", 0)):
            spec["job"]["run"] = run  # two launches, one allocation; a failing rank's code comes through
            res = cli("launch", write(tmp_path, spec), "--wait")
            out = res.stdout + res.stderr
            assert res.returncode == code, out
            assert f"step of the held Slurm allocation {alloc}" in out
            for r in range(4):
                assert f"slurm rank {r}/4" in out, out[-3000:]
        spec["job"]["run"] = "slurm_train.py --steps 200 --step-s 0.5"
        job_id = gtrain.launch(parse_spec(spec)).job_id
        wait_ranks(job_id)
        res = cli("cancel", "sl-hold")
        assert res.returncode == 0, res.stdout + res.stderr
        assert processes(job_id) == []
        assert [j["status"] for j in gtrain.status("sl-hold")[0]["jobs"] if j["id"] == job_id] == ["cancelled"]
        assert [j.split()[1] for j in _hold_jobs(c, "sl-hold")] == ["RUNNING"]  # cancel ended the step only
        assert _slurm_id(job_id) == alloc
        time.sleep(1.0)
        t_down = time.time()
        (report,) = [r for r in gtrain.cost() if r.cluster == "sl-hold"]
        note = report.lines[0].note or ""
        held_s = float(re.search(r"([\d.]+) job-hour", note).group(1)) * 3600  # type: ignore[union-attr]
        assert held_s >= t_down - t_up - 2, note  # the whole held time, idle included, not just the steps'
    finally:
        res = cli("down", "sl-hold")
    assert res.returncode == 0, res.stdout + res.stderr
    assert [j.split()[1] for j in _hold_jobs(c, "sl-hold")] == ["CANCELLED"]  # down released the allocation


def test_exec_inside_a_running_job_else_on_the_login_side(slurm_cluster: Any, tmp_path: Path) -> None:
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-exec", "slurm_train.py --steps 200 --step-s 0.5")
    gtrain.up(parse_spec(spec))
    try:
        res = cli("exec", "sl-exec", "--", "echo where=${SLURMD_NODENAME:-login}")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "on the login side" in res.stderr and res.stdout.count("where=login") == 2, res.stdout + res.stderr
        job_id = gtrain.launch(parse_spec(spec)).job_id
        wait_ranks(job_id)
        sid = _slurm_id(job_id)
        res = cli("exec", "sl-exec", "--node", "1", "--",
                  "echo where=$SLURMD_NODENAME job=$SLURM_JOB_ID; pgrep -f slurm_train.py | wc -l")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"inside Slurm job {sid}" in res.stderr, res.stderr
        assert "where=gtn2" in res.stdout and f"job={sid}" in res.stdout, res.stdout
        assert len(processes(job_id)) >= 4  # beside the job's ranks, which go on
    finally:
        gtrain.down("sl-exec")
