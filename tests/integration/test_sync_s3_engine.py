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


def test_obstore_refetches_a_cut_body_and_follows_a_bucket_region(tmp_path: Path, weed_env: Weed, weed_s3: Any,
                                                                  weed_bucket: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay in front of the server cuts one small GET and one ranged GET in half, and answers 301 with
    ``x-amz-bucket-region`` to anything signed for another region than eu-west-1: on obstore both bodies are
    fetched again, the region is followed once, and nothing partial is kept."""
    import re
    import socket

    from tests.integration.test_sync_s3 import SMALL_PARTS, MiB, _Relay, leftovers

    broken: list[str] = []
    regions: list[str] = []

    def relay_fn(h: Any, body: bytes | None, data: bytes) -> bool:
        if not data:
            m = re.search(r"Credential=[^/]+/\d+/([^/]+)/s3/", h.headers.get("Authorization", ""))
            regions.append(m.group(1) if m else "?")
            if regions[-1] == "eu-west-1":
                return False
            err = b"<Error><Code>PermanentRedirect</Code><Message>use the bucket's region</Message></Error>"
            h.send_response(301)
            h.send_header("x-amz-bucket-region", "eu-west-1")
            h.send_header("Content-Length", str(len(err)))
            h.end_headers()
            h.wfile.write(err if h.command != "HEAD" else b"")
            return True
        victim = h.path.endswith("/victim.bin") or (h.path.endswith("/big.bin")
                                                   and h.headers.get("Range", "").startswith("bytes=0-"))
        if h.command != "GET" or not victim or h.path in broken:
            return False
        broken.append(h.path)
        h.wfile.write(data[: len(data) // 2])  # half the body, then the connection goes
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)
        h.close_connection = True
        return True

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), relay_fn)
    try:
        data, big = os.urandom(300_000), os.urandom(11 * MiB)
        weed_s3.put_object(Bucket=weed_bucket, Key="b/victim.bin", Body=data)
        weed_s3.put_object(Bucket=weed_bucket, Key="b/big.bin", Body=big)
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
        assert type(_backend(f"s3://{weed_bucket}/b")) is ObstoreS3Backend
        regions.clear()
        dst = tmp_path / "dst"
        r = sync(f"s3://{weed_bucket}/b", str(dst), **SMALL_PARTS)  # type: ignore[arg-type]
        assert r.downloaded == 2 and len(broken) == 2  # a whole GET and a ranged GET were cut short
        assert (dst / "victim.bin").read_bytes() == data and (dst / "big.bin").read_bytes() == big
        assert leftovers(dst) == []
        assert regions[0] == "us-east-1" and set(regions[1:]) == {"eu-west-1"}  # one redirect, then signed right
    finally:
        relay.close()
