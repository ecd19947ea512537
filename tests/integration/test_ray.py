"""provider: ray against a real Ray cluster (tests/fixtures/ray.py: a head and two worker nodes offering
``fake_gpu``): `gtrain run` of a 2-node x 2-process torchrun job with a secret, a failing rank's exit code,
`down` mid-run leaving no process of the job on any node, an unplaceable request pending with Ray's reason then
failing at its timeout, a worker node killed mid-run as PREEMPTED, and the edge's errors (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

JOBS = Path(__file__).parent / "jobs"
SECRET = "ray-secret-value-5f3a9c"


def cli(tmp: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GTRAIN_HOME": str(tmp / "home"), "RAY_TEST_TOKEN": SECRET}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


def spec(tmp: Path, name: str, run: str, address: str, num_nodes: int = 2, **ray: Any) -> str:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "slurm_train.py", work / "slurm_train.py")
    doc = {"name": name, "provider": "ray", "num_nodes": num_nodes, "resources": {"accelerators": "A100:2"},
           "ray": {"address": address, "gpu_resource": "fake_gpu", "driver_python": sys.executable,
                   "root": str(tmp / "nodes"), **ray},
           "job": {"workdir": str(work), "run": run, "nproc_per_node": 2, "env": {"OMP_NUM_THREADS": "1"},
                   "secrets": ["RAY_TEST_TOKEN"]}}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def job_processes(job_id: str) -> list[int]:
    """Processes whose environment names the job. Every Ray node of the fixture is on this machine, so this
    looks on every node."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if f"GTRAIN_JOB_ID={job_id}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    out.append(int(pid))
            except OSError:
                pass
    return out


def describe_processes(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            env = dict(x.split("=", 1) for x in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in x)
            cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:120]
        except OSError:
            continue
        out.append(f"{pid} node {env.get('GTRAIN_NODE_RANK')}: {cmd}")
    watch = subprocess.run("ps -eo pid,args | grep 'kill -0' | grep -v grep", shell=True, capture_output=True,
                           text=True).stdout
    return [*out, f"watchdogs: {watch}"]


def live_actors(address: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{address}/api/v0/actors?detail=1&limit=1000", timeout=10) as r:
        doc = json.load(r)
    return [a for a in doc["data"]["result"]["result"]
            if a.get("state") != "DEAD" and "NodePart" in str(a.get("class_name"))]


def status(tmp: Path, name: str) -> dict[str, Any]:
    res = cli(tmp, "status", name, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return dict(json.loads(res.stdout))


def wait_job(tmp: Path, name: str, want: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = status(tmp, name)
        jobs = doc.get("jobs") or []
        if jobs and want(jobs[0]):
            return dict(jobs[0])
        assert time.monotonic() < deadline, doc
        time.sleep(1)


def test_run_two_nodes_four_ranks_then_a_failing_rank(ray_cluster: Any, tmp_path: Path) -> None:
    res = cli(tmp_path, "run", spec(tmp_path, "ray-run", "slurm_train.py --steps 3", ray_cluster.address),
              "--no-report", "--to", str(tmp_path / "pulled"))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    for r in range(4):  # every rank's lines, rank-prefixed, from the Ray job's log
        assert f"rank {r}] slurm rank {r}/4" in out, out[-4000:]
        assert f"rank {r}] slurm rank {r} step 3 sum 10.0" in out, out[-4000:]
    assert "submitted to Ray at" in out
    assert SECRET not in out  # the secret went in the job's runtime_env, never into gtrain's output or state
    assert SECRET.encode() not in b"".join(p.read_bytes() for p in (tmp_path / "home").rglob("*") if p.is_file())
    assert not live_actors(ray_cluster.address)
    res = cli(tmp_path, "run", spec(tmp_path, "ray-fail", "slurm_train.py --steps 1 --exit-code 7",
                                    ray_cluster.address), "--no-report", "--to", str(tmp_path / "pulled2"))
    assert res.returncode == 7, (res.stdout + res.stderr)[-4000:]


def test_down_mid_run_leaves_no_process_on_any_node(ray_cluster: Any, tmp_path: Path) -> None:
    s = spec(tmp_path, "ray-down", "slurm_train.py --steps 1000 --step-s 0.5", ray_cluster.address)
    assert cli(tmp_path, "up", s).returncode == 0
    res = cli(tmp_path, "launch", s)
    assert res.returncode == 0, res.stdout + res.stderr
    job = wait_job(tmp_path, "ray-down", lambda j: j["status"] == "running")
    deadline = time.monotonic() + 90
    while len(job_processes(job["id"])) < 6:  # 2 launch.sh + 2 torchrun agents + 4 ranks, at least
        assert time.monotonic() < deadline, job_processes(job["id"])
        time.sleep(0.5)
    res = cli(tmp_path, "down", "ray-down", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert job_processes(job["id"]) == []
    assert not live_actors(ray_cluster.address)


def test_unplaceable_request_pends_with_the_reason_then_times_out(ray_cluster: Any, tmp_path: Path) -> None:
    s = spec(tmp_path, "ray-big", "slurm_train.py --steps 1", ray_cluster.address, num_nodes=3,
             pending_timeout_s=10)
    up = cli(tmp_path, "up", s)
    assert up.returncode == 0 and "cannot place the job now: 2 of 3 alive Ray node(s)" in up.stdout + up.stderr
    assert cli(tmp_path, "launch", s).returncode == 0
    res = cli(tmp_path, "logs", "ray-big", "-f")
    said = res.stdout + res.stderr
    assert "[gtrain] pending: placement group STRICT_SPREAD of 3 bundle(s)" in said, said
    assert res.returncode == 124 and "not placed in 10 s (ray.pending_timeout_s)" in said, said
    assert cli(tmp_path, "down", "ray-big", "--yes").returncode == 0


def test_errors_at_the_edge(ray_cluster: Any, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    res = cli(tmp_path, "up", spec(tmp_path, "ray-nowhere", "slurm_train.py", dead))
    assert res.returncode == 2 and "does not answer" in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = cli(tmp_path, "up", spec(tmp_path, "ray-wd", "x.py", ray_cluster.address, runtime_env={"working_dir": "."}))
    assert res.returncode == 2 and "ray.runtime_env" in res.stderr, res.stderr
    s = spec(tmp_path, "ray-env", "slurm_train.py", ray_cluster.address,
             runtime_env={"pip": ["gtrain-no-such-package-x9"], "config": {"setup_timeout_seconds": 30}})
    assert cli(tmp_path, "up", s).returncode == 0
    res = cli(tmp_path, "launch", s)
    assert res.returncode == 2 and "ray.runtime_env: Ray could not build" in res.stderr, res.stdout + res.stderr
    assert cli(tmp_path, "down", "ray-env", "--yes").returncode == 0


def test_a_worker_node_killed_mid_run_is_preempted(ray_cluster: Any, tmp_path: Path) -> None:
    s = spec(tmp_path, "ray-kill", "slurm_train.py --steps 1000 --step-s 0.5", ray_cluster.address)
    assert cli(tmp_path, "up", s).returncode == 0
    assert cli(tmp_path, "launch", s).returncode == 0
    job = wait_job(tmp_path, "ray-kill", lambda j: j["status"] == "running")
    deadline = time.monotonic() + 90
    while len(job_processes(job["id"])) < 6:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    try:
        ray_cluster.kill_worker(1)
        job = wait_job(tmp_path, "ray-kill", lambda j: j["status"] not in ("running", "pending"))
        assert job["status"] == "preempted", job
        assert cli(tmp_path, "down", "ray-kill", "--yes").returncode == 0
        # the dead node's processes died with it; the surviving node's part was stopped
        assert job_processes(job["id"]) == [], describe_processes(job_processes(job["id"]))
    finally:
        cli(tmp_path, "down", "ray-kill", "--yes")
        ray_cluster.start_worker(1)
        ray_cluster.wait_nodes(3)
