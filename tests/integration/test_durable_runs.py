"""Durable runs, the promises of issue 27 that are about whole runs (local provider, moto's S3 as the store):
the store is keyed by the run (a relaunch resumes, ``--fresh`` starts over, nothing uploaded twice); a
recovery collects what the surviving nodes finished before it restores; and teardown never deletes the only
copy of a checkpoint (a store that stops taking writes mid-run still leaves the newest one locally)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import gtrain
from gtrain.checkpoints.store import Store
from gtrain.errors import JobConflict
from gtrain.jobs.backend import LogLine
from tests.integration import durable_nodes as dn
from tests.integration.test_durable_local import bucket, fast  # noqa: F401 - fast is a fixture

pytestmark = pytest.mark.usefixtures("fast")  # quick polls, no metadata server to ask


def _spec(tmp_path: Path, name: str, store: str, script: str, *, nodes: int = 1, env: dict[str, str] | None = None,
          **policy: object) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(script)
    spec = {"name": name, "provider": "local", "num_nodes": nodes,
            "job": {"workdir": str(work), "run": "job.py", "nproc_per_node": 1, "checkpoint_dir": "ckpt",
                    "checkpoint_store": store, "env": {"OMP_NUM_THREADS": "1", **(env or {})}},
            "policies": {"recovery": {"backoff_s": 0, **policy}}}
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps(spec))
    return p


def _complete(store: str, key: str) -> dict[str, float]:
    """name -> when its (newest) manifest was written, for every complete checkpoint of the run."""
    st = Store(store, key)
    try:
        return {c.name: c.to_dict()["written_at"] for c in st.checkpoints() if c.complete}
    finally:
        st.close()


def _until(cond: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# ---- runs, not jobs ---------------------------------------------------------------------------------

STEPS_JOB = """import os, sys, pathlib
d = pathlib.Path(os.environ["GTRAIN_CHECKPOINT_DIR"]); d.mkdir(parents=True, exist_ok=True)
res = os.environ.get("GTRAIN_RESUME_FROM", "")
start = int(pathlib.Path(res).stem.split("-")[1]) if res else 0
print(f"start {start}", flush=True)
for s in range(start + 1, start + 4):
    (d / f"step-{s}.pt").write_text(str(s))
sys.exit(int(os.environ["CRASH"]))
"""


def test_a_relaunch_resumes_the_run_and_fresh_starts_it_over(moto_server: str, gtrain_home: Path,
                                                             tmp_path: Path) -> None:
    store = bucket(moto_server, "durable-runs")
    spec = _spec(tmp_path, "runs", store, STEPS_JOB, env={"CRASH": "1"})
    key = dn.run_key(spec)
    assert key.startswith("runs/run-")
    gtrain.up(spec)
    try:
        first = gtrain.launch(spec)
        end = gtrain.wait("runs", job_id=first.job_id)
        assert (end.status, end.exit_code) == ("failed", 1)
        before = _complete(store, key)
        assert sorted(before) == ["step-1.pt", "step-2.pt", "step-3.pt"], before
        # a new launch (a new job id) of the same spec: the same run, resumed from its newest checkpoint
        doc = json.loads(spec.read_text())
        doc["job"]["env"]["CRASH"] = "0"  # job.env is not part of the run's id
        spec.write_text(json.dumps(doc))
        assert dn.run_key(spec) == key
        lines: list[LogLine] = []
        second = gtrain.launch(spec)
        assert second.job_id != first.job_id
        end = gtrain.wait("runs", job_id=second.job_id, on_line=lines.append)
        assert (end.status, end.exit_code) == ("succeeded", 0)
        assert "start 3" in [x.text for x in lines], [x.text for x in lines]
        after = _complete(store, key)
        assert sorted(after) == [f"step-{i}.pt" for i in range(1, 7)], after
        # what the first launch uploaded (still in checkpoint_dir on the node) was not uploaded again
        assert {n: after[n] for n in before} == before
        # --fresh: starts from scratch; the older checkpoints stay in the store but are not the run's any more
        lines.clear()
        third = gtrain.launch(spec, fresh=True)
        end = gtrain.wait("runs", job_id=third.job_id, on_line=lines.append)
        assert (end.status, end.exit_code) == ("succeeded", 0)
        assert "start 0" in [x.text for x in lines], [x.text for x in lines]
        fresh = _complete(store, key)
        assert sorted(fresh) == ["step-1.pt", "step-2.pt", "step-3.pt"], fresh
        assert all(fresh[n] > after["step-6.pt"] for n in fresh)
        pulled = gtrain.pull("runs", job_id=third.job_id, to=tmp_path / "out")
        assert sorted(pulled.transferred) == ["step-1.pt", "step-2.pt", "step-3.pt"]
    finally:
        gtrain.down("runs", yes=True)


# ---- recovery order ----------------------------------------------------------------------------------

SURVIVOR_JOB = """import os, sys, time, pathlib
d = pathlib.Path(os.environ["GTRAIN_CHECKPOINT_DIR"]); d.mkdir(parents=True, exist_ok=True)
rank, attempt = int(os.environ["RANK"]), os.environ["GTRAIN_ATTEMPT"]
print(f"attempt {attempt} rank {rank} resume {os.path.basename(os.environ.get('GTRAIN_RESUME_FROM', '')) or '-'}",
      flush=True)
if attempt != "1":
    sys.exit(0)
sig = pathlib.Path(os.environ["SIGNALS"])
if rank == 0:
    (d / "step-1.pt").write_text("1")
    while not (sig / "go").exists():
        time.sleep(0.05)
    (d / "step-2.pt").write_text("2")
    (sig / "written").write_text("")
while True:
    time.sleep(1)
"""


def _agent_of(key: str, node: int) -> Callable[[bytes, bytes], bool]:
    def match(_env: bytes, cmd: bytes) -> bool:
        args = cmd.split(b"\0")
        return len(args) > 5 and args[2] == b"agent" and args[4] == key.encode() and args[5] == str(node).encode()
    return match


def test_recovery_collects_what_a_survivor_finished_before_it_restores(moto_server: str, gtrain_home: Path,
                                                                      tmp_path: Path) -> None:
    """Node 0 writes step-2.pt after its uploader's last upload (the uploader is dead: nothing takes it to the
    store on its own); node 1 is then killed. The recovery stops node 0, collects step-2.pt from it, and
    attempt 2 resumes from step-2.pt on both nodes, not from step-1.pt."""
    store = bucket(moto_server, "durable-collect")
    signals = tmp_path / "signals"
    signals.mkdir()
    spec = _spec(tmp_path, "coll", store, SURVIVOR_JOB, nodes=2, env={"SIGNALS": str(signals)}, max_restarts=1)
    key = dn.run_key(spec)
    errors: list[BaseException] = []

    def killer() -> None:
        try:
            _until(lambda: "step-1.pt" in _complete(store, key), "step-1.pt in the store")
            agents = dn.pids_where(_agent_of(key, 0))
            assert agents, "node 0's uploader not found"
            for pid in agents:  # the uploader alone (dn.kill9 would take its process group: all of node 0)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            (signals / "go").write_text("")
            _until(lambda: (signals / "written").exists(), "step-2.pt written")
            jobs = list((gtrain_home / "clusters" / "coll" / "node-1" / "jobs").glob("*/pid"))
            dn.kill9(dn.pids_where(dn.of_node(jobs[0].parent.name, 1)))
        except (AssertionError, OSError) as e:  # shown by the test
            errors.append(e)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    t.join(timeout=5)
    assert not errors, errors
    text = [x.text for x in lines]
    assert res.status == "succeeded" and len(res.recoveries) == 1, (res, text[-30:])
    assert "step-2.pt" in _complete(store, key), [x for x in text if "collect" in x or "node" in x][-30:]
    resumed = sorted(x for x in text if x.startswith("attempt 2 "))
    assert resumed == ["attempt 2 rank 0 resume step-2.pt", "attempt 2 rank 1 resume step-2.pt"], text[-30:]


# ---- never delete the only copy -------------------------------------------------------------------------

REWRITER_JOB = """import os, time, pathlib
d = pathlib.Path(os.environ["GTRAIN_CHECKPOINT_DIR"]); d.mkdir(parents=True, exist_ok=True)
sig = pathlib.Path(os.environ["SIGNALS"])
(sig / "started").write_text("")
while not (sig / "go").exists():
    time.sleep(0.05)
for step in range(1, 4):  # nanoGPT-style: one fixed name, rewritten
    (d / "ckpt.pt.tmp").write_text(f"step {step}\\n")
    os.replace(d / "ckpt.pt.tmp", d / "ckpt.pt")
    time.sleep(0.3)
print("trained", flush=True)
"""


def _refuse_writes_once_started(store_bucket: str, signals: Path) -> threading.Thread:
    """Once the job runs: the store's bucket is emptied and deleted (S3 then refuses every write and listing
    with NoSuchBucket), then the job writes its checkpoints."""
    import boto3

    def run() -> None:
        _until(lambda: (signals / "started").exists(), "the job to start")
        s3 = boto3.client("s3")
        for o in s3.list_objects_v2(Bucket=store_bucket).get("Contents", []):
            s3.delete_object(Bucket=store_bucket, Key=o["Key"])
        s3.delete_bucket(Bucket=store_bucket)
        (signals / "go").write_text("")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_run_with_a_store_that_refuses_writes_leaves_the_newest_checkpoint_locally(
        moto_server: str, gtrain_home: Path, tmp_path: Path) -> None:
    store = bucket(moto_server, "durable-refuse")
    signals = tmp_path / "signals"
    signals.mkdir()
    spec = _spec(tmp_path, "refuse", store, REWRITER_JOB, env={"SIGNALS": str(signals)})
    t = _refuse_writes_once_started("durable-refuse", signals)
    res = gtrain.run(spec, to=tmp_path / "out")
    t.join(timeout=5)
    assert res.status == "succeeded" and res.exit_code == 0, res
    assert (tmp_path / "out" / "ckpt.pt").read_text() == "step 3\n"
    assert res.down is not None and not (gtrain_home / "clusters" / "refuse" / "node-0").exists()


def test_down_keeps_the_nodes_when_the_only_copy_cannot_be_pulled(moto_server: str, gtrain_home: Path,
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`down --yes` pulls what is only on the nodes to ./<cluster>-<checkpoint_dir> first; when that pull fails it
    deletes nothing (JobConflict), and once it can, it pulls and deletes."""
    store = bucket(moto_server, "durable-keep")
    signals = tmp_path / "signals"
    signals.mkdir()
    spec = _spec(tmp_path, "keep", store, REWRITER_JOB, env={"SIGNALS": str(signals)})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    gtrain.up(spec)
    try:
        t = _refuse_writes_once_started("durable-keep", signals)
        job = gtrain.launch(spec)
        assert gtrain.wait("keep", job_id=job.job_id).status == "succeeded"
        t.join(timeout=5)
        (cwd / "keep-ckpt").write_text("in the way")  # the destination cannot be a folder
        with pytest.raises(JobConflict, match="only on the nodes"):
            gtrain.down("keep", yes=True)
        node = gtrain_home / "clusters" / "keep" / "node-0"
        assert (node / "workdir" / "ckpt" / "ckpt.pt").read_text() == "step 3\n"
        (cwd / "keep-ckpt").unlink()
        res = gtrain.down("keep", yes=True)
        assert any("pulled to" in w for w in res.warnings), res.warnings
        assert (cwd / "keep-ckpt" / "ckpt.pt").read_text() == "step 3\n" and not node.exists()
    finally:
        shutil.rmtree(cwd / "keep-ckpt", ignore_errors=True)
        if os.path.isdir(gtrain_home / "clusters" / "keep" / "node-0"):
            gtrain.down("keep", yes=True)
