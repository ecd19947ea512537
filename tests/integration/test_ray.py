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
#: jobs for the tests that need torchrun's ranks, not torch's work (a rank that imports no torch starts in a blink)
LITTLE = {"fail.py": "import os, sys\nrank = int(os.environ['RANK'])\nprint(f'rank {rank} up', flush=True)\n"
                     "sys.exit(7 if rank == 3 else 0)\n",
          "sleep.py": "import time\nprint('sleeping', flush=True)\ntime.sleep(1000)\n"}


def cli(tmp: Path, *args: str, timeout: float = 240, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GTRAIN_HOME": str(tmp / "home"), "RAY_TEST_TOKEN": SECRET, **(env or {})}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


def spec(tmp: Path, name: str, run: str, address: str, num_nodes: int = 2, **ray: Any) -> str:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "slurm_train.py", work / "slurm_train.py")
    for fname, text in LITTLE.items():
        (work / fname).write_text(text)
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


STEPS, EVERY = 12, 3
STORE_SECRET = "ray-store-secret-7c1e4b"


def durable_spec(tmp: Path, name: str, address: str, moto: str, store: str) -> str:
    """durable_train.py (2 nodes x 2 ranks, rank 0 checkpoints every EVERY steps) with the store's credentials
    as job.secrets: the fixture's Ray nodes have no AWS_* of their own, so the store is reached only so."""
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "durable_train.py", work / "durable_train.py")
    doc = {"name": name, "provider": "ray", "num_nodes": 2, "resources": {"accelerators": "A100:2"},
           "ray": {"address": address, "gpu_resource": "fake_gpu", "driver_python": sys.executable,
                   "root": str(tmp / "nodes")},
           "job": {"workdir": str(work), "run": f"durable_train.py {STEPS} {EVERY} 0.5", "nproc_per_node": 2,
                   "checkpoint_dir": "ckpt", "checkpoint_store": store,
                   "env": {"OMP_NUM_THREADS": "1", "AWS_ENDPOINT_URL": moto, "AWS_DEFAULT_REGION": "us-east-1"},
                   "secrets": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]},
           "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0}}}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def store_env() -> dict[str, str]:
    return {"AWS_SECRET_ACCESS_KEY": STORE_SECRET, "GTRAIN_WATCH_POLL_S": "1"}


def bucket(name: str) -> str:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}/runs"


def weights_equal_an_uninterrupted_run(pulled: Path) -> None:
    import torch

    from tests.integration.jobs.durable_train import reference

    final = torch.load(pulled / "final.pt")
    assert final["step"] == STEPS and final["w"].tolist() == reference(STEPS, 4)


def no_secret_left(tmp: Path, out: str) -> None:
    for value in (SECRET, STORE_SECRET):
        assert value not in out  # secrets went in the Ray job's runtime_env, never gtrain's output or state
        assert value.encode() not in b"".join(p.read_bytes() for p in (tmp / "home").rglob("*") if p.is_file())


def test_a_failing_rank_exit_code_out_of_run(ray_cluster: Any, tmp_path: Path) -> None:
    """`gtrain run` 2 nodes x 2 torchrun ranks whose rank 3 exits 7 (ranks that import no torch): 7 out of `run`,
    the rank named."""
    res = cli(tmp_path, "run", spec(tmp_path, "ray-fail", "fail.py", ray_cluster.address), "--no-report", "--to",
              str(tmp_path / "pulled"))
    out = res.stdout + res.stderr
    assert res.returncode == 7 and "rank 3 (node 1) failed first, exit 7" in out, out[-4000:]
    no_secret_left(tmp_path, out)  # job.secrets: RAY_TEST_TOKEN
    assert not live_actors(ray_cluster.address)


def test_run_through_the_store_a_worker_node_killed_mid_run_recovers_same_weights(
        ray_cluster: Any, moto_server: str, tmp_path: Path) -> None:
    """`gtrain run` 2 nodes x 2 torchrun ranks with a store (credentials as job.secrets), every process of one
    Ray worker node SIGKILLed once checkpoint step 3 is in the store: the job is preempted (its actor died with
    the node), `run`'s recovery relaunches it as attempt 2 once the node is back, every node resumes from the
    store, `run` exits 0 with every rank's lines rank-prefixed from the Ray job's log, and `run --to` pulls the
    checkpoints from the store: the final weights equal an uninterrupted run's (computed)."""
    from gtrain.checkpoints.store import Store
    from tests.integration.durable_nodes import run_key

    store = bucket("ray-kill")
    s = durable_spec(tmp_path, "ray-kill", ray_cluster.address, moto_server, store)
    env = {**os.environ, "GTRAIN_HOME": str(tmp_path / "home"), **store_env()}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "run.log"
    with open(log, "wb") as f:
        run = subprocess.Popen([sys.executable, "-m", "gtrain", "run", s, "--no-report", "--no-fold", "--to",
                                str(tmp_path / "pulled")], stdout=f, stderr=subprocess.STDOUT, env=env,
                               stdin=subprocess.DEVNULL)
    try:
        key, deadline = run_key(Path(s)), time.monotonic() + 150
        while True:
            st = Store(store, key)
            names = [c.name for c in st.checkpoints() if c.complete]
            st.close()
            if "step-0003.pt" in names:
                break
            assert time.monotonic() < deadline and run.poll() is None, names
            time.sleep(0.2)
        argv = b"".join(Path(f"/proc/{p}/cmdline").read_bytes() for p in os.listdir("/proc") if p.isdigit()
                        and Path(f"/proc/{p}/cmdline").exists())
        assert STORE_SECRET.encode() not in argv  # no process of any node has the secret in its argv
        ray_cluster.kill_worker(1)
        ray_cluster.wait_nodes(2)  # Ray has seen the node die
        ray_cluster.start_worker(1)  # the relaunch waits (pending) until the cluster can place it again
        run.wait(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        ray_cluster.wait_nodes(3)
    out = log.read_text()
    assert run.returncode == 0, out[-5000:]
    assert "recovery to attempt 2: node_failure of node(s) [" in out, out[-5000:]
    starts = [ln for ln in out.splitlines() if "] attempt 2 start " in ln]
    # every rank of both nodes resumed from the same checkpoint of the store (written by rank 0's node only)
    resumed = {(ln.split("attempt 2 start ")[1].split()[0], os.path.basename(ln.rstrip("'").split("'")[-1]))
               for ln in starts}
    assert len(starts) == 4 and len(resumed) == 1, starts
    assert int(next(iter(resumed))[0]) >= EVERY, starts
    for r in range(4):  # every rank's lines, rank-prefixed, from the Ray job's log
        assert f"rank {r}] computed step {STEPS}" in out, out[-4000:]
    assert "submitted to Ray at" in out and "writable from every node" in out, out[-4000:]
    weights_equal_an_uninterrupted_run(tmp_path / "pulled")  # pulled from the store, not the nodes
    assert (tmp_path / "pulled" / f"step-{STEPS:04d}.pt").exists()
    no_secret_left(tmp_path, out)
    res = cli(tmp_path, "down", "ray-kill", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not live_actors(ray_cluster.address)


def test_down_mid_run_leaves_no_process_on_any_node(ray_cluster: Any, tmp_path: Path) -> None:
    s = spec(tmp_path, "ray-down", "sleep.py", ray_cluster.address)
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
    left = job_processes(job["id"])
    assert left == [], describe_processes(left)
    assert not live_actors(ray_cluster.address)


def test_unplaceable_request_pends_with_the_reason_then_times_out(ray_cluster: Any, tmp_path: Path) -> None:
    s = spec(tmp_path, "ray-big", "slurm_train.py --steps 1", ray_cluster.address, num_nodes=3,
             pending_timeout_s=2)
    up = cli(tmp_path, "up", s)
    assert up.returncode == 0 and "cannot place the job now: 2 of 3 alive Ray node(s)" in up.stdout + up.stderr
    assert cli(tmp_path, "launch", s).returncode == 0
    res = cli(tmp_path, "logs", "ray-big", "-f")
    said = res.stdout + res.stderr
    assert "[gtrain] pending: placement group STRICT_SPREAD of 3 bundle(s)" in said, said
    assert res.returncode == 124 and "not placed in 2 s (ray.pending_timeout_s)" in said, said
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
             runtime_env={"py_modules": ["gcs://_ray_pkg_gtrain_no_such_module_x9.zip"],
                          "config": {"setup_timeout_seconds": 30}})
    assert cli(tmp_path, "up", s).returncode == 0
    res = cli(tmp_path, "launch", s)
    assert res.returncode == 2 and "ray.runtime_env: Ray could not build" in res.stderr, res.stdout + res.stderr
    assert cli(tmp_path, "down", "ray-env", "--yes").returncode == 0
