"""Issue 10's promises that live in the core (cluster, jobs, api): each test failed on main before its fix.

Money and teardown: a per-cluster lock (two `up`/`launch` never both act), a failed `up` rolls back what it
made, an `up` of a changed shape is refused (or recreated). Jobs: a read-only `status` never stops anything,
`cancel` stops a job and leaves the cluster, `exec` gets the node's GTRAIN_* env.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.context import Context
from gtrain.errors import ConfigError, JobConflict, RemoteError
from gtrain.locks import ClusterBusy, cluster_lock
from gtrain.spec import parse_spec

JOBS = Path(__file__).parent / "jobs"


def local_spec(name: str, work: Path, run: str = "contract.py", n: int = 2, **res: Any) -> Any:
    shutil.copy(JOBS / "contract.py", work / "contract.py")
    doc: dict[str, Any] = {"name": name, "provider": "local", "num_nodes": n,
                           "job": {"workdir": str(work), "run": run, "nproc_per_node": 1, "python": sys.executable,
                                   "env": {"OMP_NUM_THREADS": "1"}}}
    if res:
        doc["resources"] = res
    return parse_spec(doc)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def node_dirs(home: Path, name: str) -> list[str]:
    base = home / "clusters" / name
    return sorted(p.name for p in base.iterdir()) if base.exists() else []


# ---------------------------------------------------------------------------------------------- the lock


def test_a_second_gtrain_on_a_locked_cluster_is_refused_at_once(tmp_path: Path, gtrain_home: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "busy", "provider": "local", "num_nodes": 1}))
    with cluster_lock(gtrain_home, "busy", "up"):  # as a live `gtrain up` in another process would hold it
        t0 = time.monotonic()
        r = cli("up", str(spec), "--json")
        took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert "another gtrain is working on cluster 'busy'" in r.stderr and f"pid {os.getpid()}" in r.stderr
    assert json.loads(r.stdout)["error"]
    assert took < 10
    assert node_dirs(gtrain_home, "busy") == []  # nothing was made
    with pytest.raises(ClusterBusy):  # and in-process: a different process would not get it; ours re-enters
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        with cluster_lock(gtrain_home, "busy", "up"):
            q = ctx.Queue()
            p = ctx.Process(target=_try_lock, args=(gtrain_home, q))
            p.start()
            p.join(30)
            raise ClusterBusy(q.get(timeout=5))
    r = cli("up", str(spec))  # the lock went with its holder: free again
    assert r.returncode == 0, r.stderr
    gtrain.down("busy")


def _try_lock(home: Path, q: Any) -> None:
    try:
        with cluster_lock(home, "busy", "launch"):
            q.put("got it")
    except ClusterBusy as e:
        q.put(e.message)


def test_two_concurrent_launches_start_one_job(tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    spec = local_spec("race", work, run="contract.py --sleep 30")
    gtrain.up(spec)
    path = tmp_path / "race.yaml"
    path.write_text(json.dumps(spec.to_yaml_dict()))
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "gtrain", "launch", str(path), "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
                 for _ in range(3)]
        outs = [(p.wait(120), *p.communicate()) for p in procs]
        codes = sorted(rc for rc, _o, _e in outs)
        assert codes == [0, 2, 2], outs
        refused = [e for rc, _o, e in outs if rc == 2]
        assert all("another gtrain is working on" in e or "is still running" in e for e in refused), refused
        ctx = Context()
        try:
            jobs = ctx.store.jobs(ctx.cluster("race").id)
        finally:
            ctx.store.close()
        assert len(jobs) == 1 and jobs[0].status == "running"
    finally:
        gtrain.down("race")


# ---------------------------------------------------------------------------------------------- up


def test_a_failed_up_deletes_what_it_made(moto_server: str, tmp_path: Path) -> None:
    """Nodes run but SSH never answers: `up` fails, and the instances it made are terminated (unless
    --keep-failed, which keeps them and says how to delete them)."""
    import boto3

    from gtrain.providers.aws import TAG_CLUSTER

    never = tmp_path / "never.sh"
    never.write_text("#!/bin/sh\nexit 1\n")
    never.chmod(0o755)

    def spec(name: str) -> Any:
        return parse_spec({"name": name, "provider": "aws", "num_nodes": 2,
                           "resources": {"accelerators": "A10G:1", "region": "us-east-1", "disk_gb": 50},
                           "aws": {"ssh_cidr": "198.51.100.7/32", "ssh_proxy_command": f"{never} %h",
                                   "host_key_wait_s": 0, "ssh_timeout_s": 3, "poll_s": 0.2}})

    ec2 = boto3.client("ec2", region_name="us-east-1")

    def live(cid: str) -> list[str]:
        res = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]},
                                              {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        return [i["InstanceId"] for r in res["Reservations"] for i in r["Instances"]]

    with pytest.raises(RemoteError):
        gtrain.up(spec("rollback"))
    ctx = Context()
    try:
        c = ctx.store.find_cluster("rollback")
    finally:
        ctx.store.close()
    assert c is not None and c.status == "terminated"
    assert live(c.id) == []

    with pytest.raises(RemoteError):
        gtrain.up(spec("kept"), keep_failed=True)
    ctx = Context()
    try:
        k = ctx.store.find_cluster("kept")
    finally:
        ctx.store.close()
    assert k is not None and k.status == "failed" and len(live(k.id)) == 2
    gtrain.down("kept")
    assert live(k.id) == []


def test_up_of_a_changed_shape_is_refused_or_recreated(tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    gtrain.up(local_spec("shape", work, accelerators="A100:1"))
    first = node_dirs(gtrain_home, "shape")
    with pytest.raises(ConfigError) as ei:
        gtrain.up(local_spec("shape", work, accelerators="H100:1"))
    assert "resources.accelerators: 'A100:1' -> 'H100:1'" in ei.value.message and ei.value.exit_code == 2
    assert ei.value.field == "resources.accelerators" and "--recreate" in (ei.value.hint or "")
    assert gtrain.up(local_spec("shape", work, accelerators="A100:1")).created is False  # same shape: as before
    res = gtrain.up(local_spec("shape", work, n=3, accelerators="H100:1"), recreate=True)
    assert res.created and res.cluster is not None and res.cluster.num_nodes == 3
    assert node_dirs(gtrain_home, "shape") == ["node-0", "node-1", "node-2"] and first == ["node-0", "node-1"]
    with pytest.raises(ConfigError) as ei:  # launching a spec of another shape on it: refused, not fewer nodes
        gtrain.launch(local_spec("shape", work, n=2), cluster="shape")
    assert ei.value.field == "num_nodes"
    gtrain.down("shape")


# ---------------------------------------------------------------------------------------------- jobs


def test_status_never_stops_a_job_and_cancel_does(tmp_path: Path, gtrain_home: Path) -> None:
    """Node 1's part fails while node 0's rank still works. A read-only `status` reports it and stops nothing
    (it used to end node 0's rank: a job killed by looking at it); following the job (`wait`) stops node 0
    (fail-fast). `cancel` stops a job and keeps the cluster."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "uneven.py").write_text(
        "import os, sys, time\n"
        "print('rank', os.environ['RANK'], flush=True)\n"
        "if os.environ['GTRAIN_NODE_RANK'] == '1':\n    sys.exit(3)\n"
        "time.sleep(float(os.environ['HOLD']))\n")
    spec = local_spec("uneven", work, run="uneven.py")
    gtrain.up(spec)

    def with_hold(seconds: int) -> Any:
        doc = spec.to_yaml_dict()
        return parse_spec({**doc, "job": {**doc["job"], "env": {"HOLD": str(seconds)}}})

    try:
        job = gtrain.launch(with_hold(120))
        deadline = time.monotonic() + 90
        while _node_states(job.job_id) != ["running", "failed"]:
            assert time.monotonic() < deadline, _node_states(job.job_id)
            time.sleep(0.2)
        for _ in range(3):
            assert gtrain.status("uneven")[0]["jobs"][-1]["status"] == "running"
        assert _node_states(job.job_id) == ["running", "failed"]  # node 0's rank was left alone
        t0 = time.monotonic()
        final = gtrain.wait("uneven", job_id=job.job_id)
        assert (final.status, final.exit_code) == ("failed", 3), (final.info, _ranks(job.job_id))
        assert time.monotonic() - t0 < 60  # stopped, not waited out

        long = with_hold(120)
        job2 = gtrain.launch(long)
        with pytest.raises(JobConflict):
            gtrain.launch(long)
        res = gtrain.cancel("uneven")
        assert (res.job_id, res.status, res.exit_code, res.was_running) == (job2.job_id, "cancelled", 130, True)
        assert gtrain.status("uneven")[0]["status"] == "up"
        again = gtrain.cancel("uneven", job_id=job2.job_id)
        assert not again.was_running and again.status == "cancelled"
        assert gtrain.launch(long).job_id  # the cluster is free for the next job
        gtrain.cancel("uneven")
    finally:
        gtrain.down("uneven")


def _ranks(job_id: str) -> list[Any]:
    ctx = Context()
    try:
        job = ctx.store.get_job(job_id)
        c = ctx.store.get_cluster_by_id(job.cluster_id)
        return [(n.detail, n.raw) for n in ctx.backend(c).describe(job).nodes]
    finally:
        ctx.store.close()


def _node_states(job_id: str) -> list[str]:
    ctx = Context()
    try:
        job = ctx.store.get_job(job_id)
        c = ctx.store.get_cluster_by_id(job.cluster_id)
        return [n.detail for n in ctx.backend(c).describe(job).nodes]
    finally:
        ctx.store.close()


def test_exec_gets_the_nodes_env(tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    gtrain.up(local_spec("envx", work))
    try:
        got: list[tuple[int, str]] = []
        codes = gtrain.exec_command("envx", 'echo "$GTRAIN_NODE_RANK $GTRAIN_NUM_NODES $GTRAIN_CLUSTER"',
                                    on_line=lambda ln: got.append((ln.node, ln.text)))
        assert codes == {0: 0, 1: 0}
        assert sorted(got) == [(0, "0 2 envx"), (1, "1 2 envx")]
    finally:
        gtrain.down("envx")
