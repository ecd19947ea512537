"""The checkpoint store against moto's S3: never a half-written file, manifests decide what is complete,
a restore gives every node the same checkpoint, a store that refuses writes fails the launch."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gtrain.checkpoints.node import Uploader
from gtrain.checkpoints.store import Store


def _bucket(name: str) -> str:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}/runs"


def test_a_slowly_written_checkpoint_is_uploaded_only_once_complete(moto_server: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_CHECKPOINT_SETTLE_S", "0.8")
    url = _bucket("ckpt-slow")
    root, job_dir = tmp_path / "ckpt", tmp_path / "job"
    root.mkdir()
    job_dir.mkdir()
    store = Store(url, "job-1")
    up = Uploader(store, 0, root, job_dir, 1)
    chunks = [os.urandom(64 * 1024) for _ in range(8)]
    writing = threading.Event()

    def writer() -> None:  # 8 chunks, 0.3 s apart (less than the settle time), then a pause held open, then closed
        with open(root / "step-1.pt", "wb") as f:
            writing.set()
            for c in chunks:
                f.write(c)
                f.flush()
                time.sleep(0.3)
            time.sleep(1.5)  # unchanged longer than the settle time, but still open: not complete
            with passing:  # closed between two passes, never during one (that pass may rightly take it)
                closing.set()
                f.close()

    closing, passing = threading.Event(), threading.Lock()
    t = threading.Thread(target=writer)
    t.start()
    writing.wait()
    while True:
        with passing:
            if closing.is_set():
                break
            assert up.one_pass() == 0
            assert not [c for c in store.checkpoints() if c.manifests]
        time.sleep(0.1)
    t.join()
    time.sleep(0.9)
    assert up.one_pass() == 1 and up.one_pass() == 0  # once, and not again while unchanged
    (ck,) = store.checkpoints()
    assert ck.complete and ck.manifests[0]["files"][0]["sha256"] == hashlib.sha256(b"".join(chunks)).hexdigest()
    # a marked checkpoint goes at once, settle or not
    (root / "step-2.pt").write_bytes(b"x" * 10)
    (root / "step-2.pt.done").write_text("")
    assert up.one_pass() == 1
    store.close()


def test_restore_takes_the_newest_complete_one_to_every_node(moto_server: str, tmp_path: Path) -> None:
    url = _bucket("ckpt-restore")
    store = Store(url, "job-2")
    n0 = tmp_path / "n0"
    (n0 / "step-3").mkdir(parents=True)
    (n0 / "step-3" / "model.pt").write_bytes(b"weights-3")
    store.upload(0, n0, "step-3", ["step-3/model.pt"])
    time.sleep(0.01)
    (n0 / "step-6.pt").write_bytes(b"weights-6")
    os.utime(n0 / "step-6.pt", (time.time() + 5, time.time() + 5))
    # node 1 began uploading a newer step-6 shard but has no manifest: step-6 is not complete
    import boto3

    boto3.client("s3").put_object(Bucket="ckpt-restore", Key="runs/job-2/node-1/step-6.pt", Body=b"half")
    store.upload(0, n0, "step-6.pt", ["step-6.pt"])
    assert [c.name for c in store.checkpoints() if c.complete] == ["step-3"]
    n1 = tmp_path / "n1"
    got, kept, nbytes = store.restore(store.newest_complete(), n1)  # type: ignore[arg-type]
    assert got == ["step-3/model.pt"] and kept == [] and (n1 / "step-3" / "model.pt").read_bytes() == b"weights-3"
    assert store.restore(store.newest_complete(), n1)[1] == ["step-3/model.pt"]  # type: ignore[arg-type]
    store.close()


def test_a_store_that_refuses_writes_fails_the_launch(moto_server: str, gtrain_home: Path, tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "refuse", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py",
                                        "checkpoint_store": "s3://no-such-ckpt-bucket/runs"}}))
    gt = [sys.executable, "-m", "gtrain"]
    assert subprocess.run([*gt, "up", str(spec)], capture_output=True, text=True).returncode == 0
    try:
        r = subprocess.run([*gt, "launch", str(spec)], capture_output=True, text=True, timeout=120)
        assert r.returncode in (1, 2) and "no-such-ckpt-bucket" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        st = subprocess.run([*gt, "status", "refuse", "--json"], capture_output=True, text=True)
        assert json.loads(st.stdout)["jobs"] == []  # nothing was started
    finally:
        subprocess.run([*gt, "down", "refuse", "--yes"], capture_output=True)


def test_down_says_what_is_in_the_store_and_refuses_when_the_newest_is_not(moto_server: str, gtrain_home: Path,
                                                                           tmp_path: Path) -> None:
    url = _bucket("ckpt-down")
    work = tmp_path / "w"
    work.mkdir()
    (work / "train.py").write_text("open('ckpt/step-1.pt', 'w').write('one')\nopen('ckpt/step-1.pt.done', 'w')\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "safe", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py", "checkpoint_dir": "ckpt",
                                        "checkpoint_store": url}}))
    gt = [sys.executable, "-m", "gtrain"]
    assert subprocess.run([*gt, "up", str(spec)], capture_output=True, text=True, cwd=tmp_path).returncode == 0
    r = subprocess.run([*gt, "launch", str(spec), "--wait"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    node_ckpt = gtrain_home / "clusters" / "safe" / "node-0" / "workdir" / "ckpt"
    later = node_ckpt / "step-2.pt"
    later.write_text("two")  # written after the job's final flush: on the node only
    os.utime(later, (time.time() + 10, time.time() + 10))
    r = subprocess.run([*gt, "down", "safe"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "step-2.pt" in r.stderr and "checkpoints safely in" in r.stderr, r.stderr
    assert "step-1.pt" in r.stderr  # what is safe is named
    r = subprocess.run([*gt, "down", "safe", "--yes"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_restore_takes_each_files_newest_copy_across_nodes_and_reports_conflicts(moto_server: str,
                                                                                 tmp_path: Path) -> None:
    """Two nodes hold ckpt.pt (rank 0 moved between launches): the later completed write wins, whichever node
    number it has; copies written at the same moment with different contents are reported."""
    store = Store(_bucket("ckpt-newest"), "job-3")
    now = time.time()
    for node, body, age in ((0, b"iter-200", 100.0), (1, b"iter-400", 10.0)):
        d = tmp_path / f"w{node}"
        d.mkdir()
        (d / "ckpt.pt").write_bytes(body)
        os.utime(d / "ckpt.pt", (now - age, now - age))
        (d / "same.pt").write_bytes(body)
        os.utime(d / "same.pt", (now - 50, now - 50))
        store.upload(node, d, "ckpt.pt", ["ckpt.pt"])
        store.upload(node, d, "same.pt", ["same.pt"])
    by_name = {c.name: c for c in store.checkpoints()}
    dest = tmp_path / "restored"
    got, _kept, _n = store.restore(by_name["ckpt.pt"], dest)
    assert got == ["ckpt.pt"] and (dest / "ckpt.pt").read_bytes() == b"iter-400"
    assert store.conflicts == []
    assert abs((dest / "ckpt.pt").stat().st_mtime - (now - 10)) < 1  # the write's time, not the download's
    store.restore(by_name["same.pt"], dest)
    assert (dest / "same.pt").read_bytes() == b"iter-400"  # same time: the later upload
    assert len(store.conflicts) == 1 and "same.pt" in store.conflicts[0] and "node-1" in store.conflicts[0]
    store.close()


def test_a_fixed_name_checkpoint_rewritten_every_second_goes_up_whole(moto_server: str, tmp_path: Path) -> None:
    """nanoGPT's pattern: rank 0 rewrites ckpt.pt in place every second (open, write slowly, close). With the
    default settle time it was never quiet long enough to upload; now each completed write can go up, never a
    half-written one, and the final flush after a failure uploads the last complete version."""
    store = Store(_bucket("ckpt-fixed"), "job-4")
    root, job_dir = tmp_path / "ckpt", tmp_path / "job"
    root.mkdir()
    job_dir.mkdir()
    up = Uploader(store, 0, root, job_dir, 1)
    versions = {hashlib.sha256(bytes([v]) * (256 * 1024)).hexdigest(): v for v in range(1, 9)}
    stop = threading.Event()

    def writer() -> None:
        for v in range(1, 9):
            with open(root / "ckpt.pt", "wb") as f:  # truncated in place, like torch.save
                for _ in range(4):
                    f.write(bytes([v]) * (64 * 1024))
                    f.flush()
                    time.sleep(0.1)
            time.sleep(0.6)
        stop.set()

    t = threading.Thread(target=writer)
    t.start()
    seen: list[int] = []
    while not stop.is_set():
        if up.one_pass():
            (ck,) = store.checkpoints()
            sha = ck.manifests[0]["files"][0]["sha256"]
            assert sha in versions, "a half-written ckpt.pt was uploaded"
            seen.append(versions[sha])
        time.sleep(0.2)
    t.join()
    assert seen, "no version of a file rewritten every second was uploaded while the job ran"
    assert seen == sorted(seen)
    Uploader(store, 0, root, job_dir, 1).one_pass(final=False)  # the flush after a failure (rc != 0)
    dest = tmp_path / "restored"
    (ck,) = store.checkpoints()
    store.restore(ck, dest)
    assert (dest / "ckpt.pt").read_bytes() == bytes([8]) * (256 * 1024)
    assert not (job_dir / "ckpt-snapshot").exists()
    store.close()
