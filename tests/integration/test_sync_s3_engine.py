"""The compiled S3 engine (obstore, gtrain/sync/s3fast.py) on a real SeaweedFS server: chosen by default where
installed, what it writes is what the wire client writes (gtrain-sha256 metadata, a full-object
x-amz-checksum-sha256 S3 stores and boto3 verifies), its errors are gtrain's, and GTRAIN_SYNC_ENGINE=wire
still selects the stdlib client."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import CredentialsError
from gtrain.sync.objstore import make_backend, parse_location, sync
from gtrain.sync.s3 import S3Backend
from gtrain.sync.s3fast import ObstoreS3Backend
from tests.fixtures.seaweedfs import Weed


def _backend(url: str) -> Any:
    loc = parse_location(url, "DST")
    assert not isinstance(loc, Path)
    b = make_backend(loc, fld="DST")
    b.close()
    return b


def test_obstore_is_the_s3_engine_and_writes_what_the_wire_writes(tmp_path: Path, weed_env: Weed, weed_s3: Any,
                                                                  weed_bucket: str) -> None:
    assert type(_backend(f"s3://{weed_bucket}/x")) is ObstoreS3Backend
    src = tmp_path / "src"
    files = {f"d/f{i}.bin": os.urandom(100 + i) for i in range(30)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    r = sync(str(src), f"s3://{weed_bucket}/x")
    assert r.uploaded == 30
    head = weed_s3.head_object(Bucket=weed_bucket, Key="x/d/f7.bin", ChecksumMode="ENABLED")
    digest = hashlib.sha256(files["d/f7.bin"]).digest()
    assert head["Metadata"]["gtrain-sha256"] == digest.hex()
    assert head["ChecksumSHA256"] == base64.b64encode(digest).decode()
    assert sync(str(src), f"s3://{weed_bucket}/x").skipped == 30  # no-change: one listing
    r = sync(f"s3://{weed_bucket}/x", str(tmp_path / "dst"))
    assert r.downloaded == 30
    assert {p.relative_to(tmp_path / "dst").as_posix(): p.read_bytes()
            for p in (tmp_path / "dst").rglob("*") if p.is_file()} == files
    (src / "d" / "f7.bin").unlink()  # --delete: obstore's batch delete
    r = sync(str(src), f"s3://{weed_bucket}/x", delete=True)
    assert r.deleted == 1
    assert "x/d/f7.bin" not in {o["Key"] for o in weed_s3.list_objects_v2(Bucket=weed_bucket)["Contents"]}


def test_wrong_secret_on_obstore_is_a_credentials_error(tmp_path: Path, weed_env: Weed, weed_bucket: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    assert type(_backend(f"s3://{weed_bucket}/x")) is ObstoreS3Backend
    with pytest.raises(CredentialsError) as e:
        sync(str(tmp_path / "src"), f"s3://{weed_bucket}/x")
    assert "SignatureDoesNotMatch" in str(e.value) and "not-the-secret" not in str(e.value)


def test_wire_engine_when_asked(weed_env: Weed, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_SYNC_ENGINE", "wire")
    assert type(_backend("s3://some-bucket/x")) is S3Backend
    monkeypatch.delenv("GTRAIN_SYNC_ENGINE")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # proxies stay on the wire client (CONNECT, auth)
    assert type(_backend("s3://some-bucket/x")) is S3Backend
