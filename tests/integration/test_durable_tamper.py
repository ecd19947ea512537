"""Issue 28 item 5: a tampered or torn checkpoint store does not block recovery. The newest checkpoint
truncated, altered (same size), or with a manifest naming ``../../etc/x``, ``/abs`` or ``..`` is refused,
the newest intact one is restored (on a node: ``restore``; and by ``pull``), and what was skipped is said."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gtrain.checkpoints import node as ckpt_node
from gtrain.checkpoints.pull import pull_from_store
from gtrain.checkpoints.store import Store


def _two(url_bucket: str, job: str, tmp: Path) -> Store:
    import boto3

    boto3.client("s3").create_bucket(Bucket=url_bucket)
    store = Store(f"s3://{url_bucket}/runs", job)
    src = tmp / "src"
    (src / "step-1").mkdir(parents=True)
    (src / "step-1" / "model.pt").write_bytes(b"weights-1")
    store.upload(0, src, "step-1", ["step-1/model.pt"])
    (src / "step-2").mkdir()
    (src / "step-2" / "a.pt").write_bytes(b"A" * 100)
    (src / "step-2" / "model.pt").write_bytes(b"weights-2")
    later = time.time() + 5
    for f in ("a.pt", "model.pt"):
        os.utime(src / "step-2" / f, (later, later))
    store.upload(0, src, "step-2", ["step-2/a.pt", "step-2/model.pt"])
    assert [c.name for c in store.checkpoints() if c.complete] == ["step-1", "step-2"]
    return store


def _put(bucket: str, key: str, body: bytes) -> None:
    import boto3

    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body)


def _manifest(bucket: str, job: str) -> dict[str, object]:
    import boto3

    obj = boto3.client("s3").get_object(Bucket=bucket, Key=f"runs/{job}/node-0/.gtrain/step-2.json")
    doc: dict[str, object] = json.loads(obj["Body"].read())
    return doc


@pytest.mark.parametrize("how", ["truncated", "altered", "../../etc/x", "/abs", ".."])
def test_a_tampered_newest_checkpoint_falls_back_to_the_newest_intact(how: str, moto_server: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bucket, job = f"tamper-{abs(hash(how)) % 10**8}", "job-t"
    store = _two(bucket, job, tmp_path)
    if how == "truncated":
        _put(bucket, f"runs/{job}/node-0/step-2/model.pt", b"weig")
    elif how == "altered":
        _put(bucket, f"runs/{job}/node-0/step-2/model.pt", b"WEIGHTS-2")
    else:
        doc = _manifest(bucket, job)
        files = doc["files"]
        assert isinstance(files, list)
        files[1]["path"] = how
        _put(bucket, f"runs/{job}/node-0/.gtrain/step-2.json", json.dumps(doc).encode())
    root, jdir = tmp_path / "node", tmp_path / "job"
    root.mkdir()
    jdir.mkdir()
    assert ckpt_node.main(["restore", f"s3://{bucket}/runs", job, "0", str(root), str(jdir)]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)  # stdout stays the one JSON document the node script parses
    assert "checkpoint step-2 refused" in out.err
    assert doc["name"] == "step-1" and doc["resume_from"] == str(root / "step-1"), doc
    skipped = doc["skipped"]
    assert isinstance(skipped, list) and [s["name"] for s in skipped] == ["step-2"]
    why = skipped[0]["why"]
    assert {"truncated": "truncated", "altered": "sha256"}.get(how, "unsafe path") in why, why
    assert (root / "step-1" / "model.pt").read_bytes() == b"weights-1"
    assert not (root / "step-2" / "a.pt").exists() and not (root / "step-2" / "model.pt").exists()  # no half
    assert not (tmp_path / "etc").exists() and json.loads((jdir / "ckpt-restored.json").read_text())["name"] == "step-1"
    dest = tmp_path / "pulled"
    res = pull_from_store(SimpleNamespace(id=job, info={"checkpoint_store": f"s3://{bucket}/runs"}),  # type: ignore[arg-type]
                          dest)
    assert (dest / "step-1" / "model.pt").read_bytes() == b"weights-1"
    assert [r["name"] for r in res.refused] == ["step-2"] and res.to_dict()["refused"][0]["name"] == "step-2"
    assert not (dest / "step-2" / "model.pt").exists()
    store.close()


def test_a_pull_from_the_store_never_writes_through_a_link_and_marks_its_folder(moto_server: str,
                                                                                tmp_path: Path) -> None:
    from gtrain.errors import SyncError
    from gtrain.sync.pull import MARKER

    bucket, job = "tamper-links", "job-l"
    _two(bucket, job, tmp_path).close()
    rec = SimpleNamespace(id=job, info={"checkpoint_store": f"s3://{bucket}/runs"})
    fresh = tmp_path / "fresh"
    res = pull_from_store(rec, fresh)  # type: ignore[arg-type]
    assert (fresh / MARKER).is_file() and (fresh / "step-2" / "model.pt").read_bytes() == b"weights-2"
    assert res.refused == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "step-2").symlink_to(elsewhere)
    with pytest.raises(SyncError) as ei:
        pull_from_store(rec, dest)  # type: ignore[arg-type]
    assert "symlink" in ei.value.message and str(dest / "step-2") in ei.value.message
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    (dest / "step-2").unlink()
    (dest / "step-2").mkdir()
    (dest / "step-2" / "model.pt").symlink_to(elsewhere / "model.pt")
    with pytest.raises(SyncError):
        pull_from_store(rec, dest)  # type: ignore[arg-type]
    assert list(elsewhere.iterdir()) == []
