"""Durable runs on the local provider with moto's S3 as the store: kill -9 every process of node 1 mid-run,
the run recovers on that node, resumes from the store and ends with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.checkpoints.store import Store
from gtrain.jobs.backend import LogLine
from gtrain.remote.nodeside import job_pids
from tests.integration.durable_nodes import run_key

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY = 12, 3


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_CHECKPOINT_POLL_S", "0.3")
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GTRAIN_IMDS_ENDPOINT", "")  # no metadata server to ask on this machine
    monkeypatch.setenv("GTRAIN_GCE_METADATA_ENDPOINT", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def bucket(moto_server: str, name: str) -> str:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}/runs"


def spec_file(tmp_path: Path, name: str, store: str, run: str, **policy: object) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "durable_train.py", work / "durable_train.py")
    spec = {"name": name, "provider": "local", "num_nodes": 2,
            "job": {"workdir": str(work), "run": run, "nproc_per_node": 1, "checkpoint_dir": "ckpt",
                    "checkpoint_store": store, "env": {"OMP_NUM_THREADS": "1"}},
            "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0, **policy}}}
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps(spec))
    return p


def kill_node_when_checkpointed(home: Path, cluster: str, store: str, after: str, *,
                                key: str, remove: bool = False) -> threading.Thread:
    """Once checkpoint ``after`` is complete in the store: SIGKILL every process of node 1's job (and with
    ``remove``, delete the node itself: the provider then reports it missing)."""
    def run() -> None:
        node = home / "clusters" / cluster / "node-1" / "jobs"
        deadline = time.time() + 240
        while time.time() < deadline:
            jobs = list(node.glob("*/pid")) if node.is_dir() else []
            if jobs:
                job_dir = jobs[0].parent
                st = Store(store, key)
                names = [c.name for c in st.checkpoints() if c.complete]
                st.close()
                if after in names:
                    pgid = int(jobs[0].read_text())
                    pids = set(job_pids(job_dir.name, str(job_dir)))
                    os.killpg(pgid, signal.SIGKILL)
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    if remove:
                        shutil.rmtree(home / "clusters" / cluster / "node-1")
                    (home / "killed").write_text(str(time.time()))
                    return
            time.sleep(0.2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("remove", [False, True], ids=["kill9", "node-gone"])
def test_kill9_node1_recovers_from_the_store_same_weights(moto_server: str, gtrain_home: Path, tmp_path: Path,
                                                          fast: None, remove: bool) -> None:
    """kill9: the node's agent died (job state); node-gone: the provider says the node is missing, so it is
    re-provisioned before the relaunch."""
    import torch

    store = bucket(moto_server, f"durable-{'gone' if remove else 'kill9'}")
    spec = spec_file(tmp_path, "dur", store, f"durable_train.py {STEPS} {EVERY} 0.6")
    killer = kill_node_when_checkpointed(gtrain_home, "dur", store, "step-0003.pt", key=run_key(spec),
                                         remove=remove)
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    killer.join(timeout=1)
    assert (gtrain_home / "killed").exists(), "the node was never killed"
    assert res.status == "succeeded" and res.exit_code == 0, (res, [x.text for x in lines][-30:])
    assert len(res.recoveries) == 1 and res.recoveries[0]["kind"] == "node_failure"
    assert res.recoveries[0]["lost"] == [1] and res.recoveries[0]["attempt"] == 2
    assert res.recoveries[0]["reprovision"] == ([1] if remove else [])
    # the store's final weights (pulled from the store, not the nodes) equal an uninterrupted run's
    from tests.integration.jobs.durable_train import reference

    final = torch.load(tmp_path / "out" / "final.pt")
    assert final["step"] == STEPS and final["w"].tolist() == reference(STEPS, 2)
    # every node resumed from the same checkpoint (written by rank 0's node only)
    starts = [x.text for x in lines if x.text.startswith("attempt 2 start")]
    assert len(starts) == 2 and len({s.split(" resume ")[0] for s in starts}) == 1, starts
    resumed_at = int(starts[0].split()[3])
    assert resumed_at >= EVERY
    # at most one checkpoint interval computed twice (rank-0 lines of both attempts)
    computed = [x.text for x in lines if x.text.startswith("computed step") and x.rank == 0]
    assert len(computed) - STEPS <= EVERY, computed
    rec = res.recoveries[0]
    assert rec["seconds"] > 0 and rec["cost_usd"] == 0 and rec["ended_at"] > rec["detected_at"]


def _one_node(tmp_path: Path, name: str, store: str, script: str, **policy: object) -> Path:
    p = spec_file(tmp_path, name, store, "fails.py", **policy)
    (tmp_path / "work" / "fails.py").write_text(script)
    spec = json.loads(p.read_text())
    spec["num_nodes"] = 1
    p.write_text(json.dumps(spec))
    return p


FAIL_137 = "import sys\nprint('failing', flush=True)\nsys.exit(137)\n"


def test_max_restarts_honoured_then_the_job_exit_code(moto_server: str, gtrain_home: Path, tmp_path: Path,
                                                      fast: None) -> None:
    store = bucket(moto_server, "durable-maxr")
    spec = _one_node(tmp_path, "maxr", store, FAIL_137, max_restarts=1, on=["node_failure", {"exit_codes": [137]}])
    res = gtrain.run(spec, to=tmp_path / "out")
    assert res.exit_code == 137 and res.status == "failed"
    assert len(res.recoveries) == 1 and "max_restarts (1) reached" in (res.recovery_stopped or "")


def test_a_crash_loop_stops(moto_server: str, gtrain_home: Path, tmp_path: Path, fast: None) -> None:
    store = bucket(moto_server, "durable-loop")
    spec = _one_node(tmp_path, "loop", store, FAIL_137, max_restarts=10, on=[{"exit_codes": [137]}])
    res = gtrain.run(spec, to=tmp_path / "out")
    assert res.exit_code == 137 and len(res.recoveries) == 2
    assert "crash loop" in (res.recovery_stopped or "")


def test_a_failure_not_in_on_is_not_recovered(moto_server: str, gtrain_home: Path, tmp_path: Path,
                                              fast: None) -> None:
    store = bucket(moto_server, "durable-noton")
    spec = _one_node(tmp_path, "noton", store, "import sys\nsys.exit(3)\n", max_restarts=5)
    res = gtrain.run(spec, to=tmp_path / "out")
    assert res.exit_code == 3 and res.recoveries == []
    assert "not of a node" in (res.recovery_stopped or "") and "exit_codes: [3]" in (res.recovery_stopped or "")


def _job_info(cluster: str) -> tuple[str, dict[str, object]]:
    from gtrain.state import StateStore

    st = StateStore()
    try:
        job = st.latest_job(st.get_cluster(cluster).id)
        assert job is not None
        return job.status, job.info
    finally:
        st.close()


def test_ctrl_c_of_the_watcher_mid_recovery_then_watch_continues(moto_server: str, gtrain_home: Path,
                                                                 tmp_path: Path, fast: None) -> None:
    """`gtrain watch` is interrupted while a recovery waits out its backoff; `status` says nobody recovers it;
    the next `gtrain watch` finishes that recovery (one recovery, attempt 2), and the job succeeds."""
    import subprocess
    import sys

    store = bucket(moto_server, "durable-ctrlc")
    script = "import os, sys\nprint('attempt', os.environ['GTRAIN_ATTEMPT'], flush=True)\n" \
             "sys.exit(137 if os.environ['GTRAIN_ATTEMPT'] == '1' else 0)\n"
    spec = _one_node(tmp_path, "ctrlc", store, script, max_restarts=3, backoff_s=6,
                     on=[{"exit_codes": [137]}])
    gtrain.up(spec)
    try:
        gtrain.launch(spec)
        cli = [sys.executable, "-m", "gtrain", "watch", "ctrlc"]
        w = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            status, info = _job_info("ctrlc")
            if status == "recovering" and (info.get("recovery") or {}).get("phase") == "backoff":  # type: ignore[union-attr]
                break
            time.sleep(0.2)
        else:
            w.kill()
            pytest.fail(f"no recovery began: {w.communicate()}")
        w.send_signal(signal.SIGINT)
        _out, err = w.communicate(timeout=60)
        assert w.returncode == 130, err
        assert _job_info("ctrlc")[0] == "recovering"
        note = gtrain.status("ctrlc")[0]["recovery"]
        assert "no watcher is running" in note and "gtrain watch ctrlc" in note, note
        again = subprocess.run(cli, capture_output=True, text=True, timeout=180)
        assert again.returncode == 0, again.stderr
        status, info = _job_info("ctrlc")
        assert status == "succeeded" and info["attempt"] == 2
        assert len(info["recoveries"]) == 1  # type: ignore[arg-type]
    finally:
        gtrain.down("ctrlc", yes=True)


def test_a_sigkilled_rank_is_a_node_failure_by_default(moto_server: str, gtrain_home: Path, tmp_path: Path,
                                                       fast: None) -> None:
    """Exit 137 (the OOM killer's SIGKILL) is recovered with the default `on:`; with `on: [preemption]` it is
    not, and the message says what 137 means."""
    kill9 = "import os, signal\nprint('oom', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    store = bucket(moto_server, "durable-oom")
    res = gtrain.run(_one_node(tmp_path, "oom", store, kill9, max_restarts=1), to=tmp_path / "out")
    assert res.exit_code == 137 and len(res.recoveries) == 1, res.recovery_stopped
    assert res.recoveries[0]["kind"] == "node_failure" and "max_restarts (1) reached" in (res.recovery_stopped or "")
    res = gtrain.run(_one_node(tmp_path, "oom2", store, kill9, max_restarts=1, on=["preemption"]),
                     to=tmp_path / "out2")
    assert res.exit_code == 137 and res.recoveries == []
    assert "OOM killer" in (res.recovery_stopped or "") and "not in policies.recovery.on" in (res.recovery_stopped
                                                                                            or "")
