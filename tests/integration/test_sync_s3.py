"""``gtrain sync`` against a real S3 server, SeaweedFS, over HTTP (one server per run, every signature checked:
tests/fixtures/seaweedfs.py). Nothing is mocked: boto3 talks HTTP to it, files are real, an interrupted sync
is a real killed process.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import ConfigError, CredentialsError, SyncError
from gtrain.sync.objstore import TMP_TAG, ProgressEvent, sync
from tests.fixtures.seaweedfs import Weed

MiB = 1024 * 1024
SMALL_PARTS = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB}  # S3's minimum part size


@pytest.fixture
def s3(weed_s3: Any) -> Any:
    return weed_s3


@pytest.fixture
def bucket(weed_bucket: str) -> str:
    return weed_bucket


def make_tree(root: Path, n: int = 20, size: int = 700) -> dict[str, bytes]:
    files = {f"f{i:04d}.bin": os.urandom(size + i) for i in range(n)}
    files["nested/deeper/a.txt"] = b"hello\n"
    files["nested/empty"] = b""
    files["with space/ünï.txt"] = "ünïcode".encode()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def remote_tree(s3: Any, bucket: str, prefix: str = "") -> dict[str, bytes]:
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if TMP_TAG in p.name]


def test_upload_download_roundtrip_and_noop_resync(tmp_path: Path, s3: Any, bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src)
    url = f"s3://{bucket}/runs/r1"

    up = sync(str(src), url)
    assert (up.direction, up.uploaded, up.skipped, up.deleted) == ("upload", len(files), 0, 0)
    assert up.bytes == sum(len(v) for v in files.values())
    remote = remote_tree(s3, bucket)
    assert remote == {f"runs/r1/{k}": v for k, v in files.items()}
    head = s3.head_object(Bucket=bucket, Key="runs/r1/nested/deeper/a.txt")
    assert head["Metadata"]["gtrain-sha256"] == hashlib.sha256(b"hello\n").hexdigest()

    down = sync(url + "/", str(dst))  # a trailing slash names the same prefix
    assert (down.direction, down.downloaded, down.skipped) == ("download", len(files), 0)
    assert read_tree(dst) == files
    assert leftovers(dst) == []

    again_up = sync(str(src), url)
    again_down = sync(url, str(dst))
    for r in (again_up, again_down):
        assert (r.uploaded, r.downloaded, r.deleted, r.hashed, r.skipped) == (0, 0, 0, 0, len(files))


def test_noop_resync_of_1000_files_is_one_listing_under_a_second(tmp_path: Path, bucket: str,
                                                                weed_env: Weed) -> None:
    from gtrain.sync.s3wire import S3Wire

    src = tmp_path / "src"
    src.mkdir()
    for i in range(1000):
        (src / f"s{i:04d}").write_bytes(b"x" * (i % 97))
    url = f"s3://{bucket}/many"
    assert sync(str(src), url).uploaded == 1000

    times, requests = [], []

    def client() -> Any:
        return S3Wire(on_request=lambda method, target: requests.append(method))

    for _ in range(2):  # the best of two fresh runs (client made inside the timing): CI machines are shared
        requests.clear()
        t0 = time.monotonic()
        r = sync(str(src), url, client_factory=client)
        times.append(time.monotonic() - t0)
        assert (r.uploaded, r.skipped, r.hashed) == (0, 1000, 0)
        assert requests == ["GET"]  # one ListObjectsV2 page, no per-file HEAD
    print(f"\nS3 no-change re-sync of 1000 files: {' / '.join(f'{t:.3f}s' for t in times)}")
    assert min(times) < 1.0


def test_changed_files_move_both_ways(tmp_path: Path, s3: Any, bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=5)
    url = f"s3://{bucket}/p"
    sync(str(src), url)
    sync(url, str(dst))

    (src / "f0001.bin").write_bytes(b"y" * len(files["f0001.bin"]))  # same size, new content
    (src / "nested/deeper/a.txt").write_bytes(b"longer now\n")
    r = sync(str(src), url)
    assert (r.uploaded, r.skipped) == (2, len(files) - 2)
    assert sorted(a.path for a in r.actions) == ["f0001.bin", "nested/deeper/a.txt"]
    assert all(a.reason == "changed" for a in r.actions)
    assert s3.get_object(Bucket=bucket, Key="p/f0001.bin")["Body"].read() == b"y" * len(files["f0001.bin"])

    s3.put_object(Bucket=bucket, Key="p/f0002.bin", Body=b"changed behind gtrain's back")
    r = sync(url, str(dst))
    assert r.downloaded == 3  # the two uploads and the outside change
    assert read_tree(dst) == read_tree(src) | {"f0002.bin": b"changed behind gtrain's back"}


def test_delete_mirrors_within_the_prefix_only(tmp_path: Path, s3: Any, bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, n=3)
    url = f"s3://{bucket}/run1"
    sync(str(src), url)
    for key in ("run1/stale.bin", "run1/old/deep.bin", "run10/sibling.bin", "other.bin"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"z")

    r = sync(str(src), url)  # without --delete nothing goes
    assert r.deleted == 0 and "run1/stale.bin" in remote_tree(s3, bucket)
    r = sync(str(src), url, delete=True)
    assert r.deleted == 2
    keys = set(remote_tree(s3, bucket))
    assert "run10/sibling.bin" in keys and "other.bin" in keys
    assert not any(k.startswith(("run1/stale", "run1/old/")) for k in keys)

    sync(url, str(dst))
    (dst / "extra").mkdir()
    (dst / "extra/local-only.txt").write_bytes(b"l")
    (dst / "loose.txt").write_bytes(b"l")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep")
    (dst / "link-out").symlink_to(outside)
    r = sync(url, str(dst), delete=True)
    assert r.deleted == 3
    assert not (dst / "extra").exists() and not (dst / "loose.txt").exists() and not (dst / "link-out").exists()
    assert outside.read_bytes() == b"keep"
    assert read_tree(dst) == read_tree(src)


def test_dry_run_changes_nothing(tmp_path: Path, s3: Any, bucket: str, gtrain_home: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=4)
    url = f"s3://{bucket}/d"
    r = sync(str(src), url, dry_run=True)
    assert r.dry_run and r.uploaded == len(files)
    assert sorted(a.path for a in r.actions) == sorted(files)
    assert {a.kind for a in r.actions} == {"upload"}
    assert remote_tree(s3, bucket) == {}
    assert not (gtrain_home / "sync").exists()

    sync(str(src), url)
    s3.put_object(Bucket=bucket, Key="d/remote-only", Body=b"r")
    (src / "f0000.bin").write_bytes(b"changed")
    before = remote_tree(s3, bucket)
    r = sync(str(src), url, delete=True, dry_run=True)
    assert [(a.kind, a.path) for a in r.actions] == [("delete-remote", "remote-only"), ("upload", "f0000.bin")]
    assert remote_tree(s3, bucket) == before

    r = sync(url, str(dst), dry_run=True)
    assert r.downloaded == len(files) + 1 and not dst.exists()


def test_large_file_multipart_both_ways_with_progress(tmp_path: Path, s3: Any, bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    big = os.urandom(20 * MiB + 123)
    (src / "ckpt.pt").write_bytes(big)
    (src / "small.json").write_bytes(b"{}")
    events: list[ProgressEvent] = []
    url = f"s3://{bucket}/ckpt"

    r = sync(str(src), url, on_progress=events.append, **SMALL_PARTS)
    assert r.uploaded == 2
    head = s3.head_object(Bucket=bucket, Key="ckpt/ckpt.pt")
    assert head["ETag"].strip('"').endswith("-5")  # 5 parts of 5 MiB: it went multipart
    assert head["Metadata"]["gtrain-sha256"] == hashlib.sha256(big).hexdigest()
    done = [e for e in events if e.phase == "transfer"]
    assert done and [e.bytes_done for e in done] == sorted(e.bytes_done for e in done)
    assert events[-1].phase == "done"
    assert (events[-1].bytes_done, events[-1].files_done) == (len(big) + 2, 2) == (events[-1].bytes_total,
                                                                                  events[-1].files_total)

    events.clear()
    r = sync(url, str(dst), on_progress=events.append, **SMALL_PARTS)
    assert r.downloaded == 2 and (dst / "ckpt.pt").read_bytes() == big
    assert events[-1].bytes_done == len(big) + 2
    assert leftovers(dst) == []


@pytest.mark.parametrize("size", [1000, 6 * MiB], ids=["single-get", "multipart-get"])
def test_corrupted_object_is_refused_and_not_kept(tmp_path: Path, s3: Any, bucket: str, size: int) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "good.bin").write_bytes(b"g")
    (src / "model.bin").write_bytes(os.urandom(size))
    url = f"s3://{bucket}/c"
    sync(str(src), url, **SMALL_PARTS)
    # rewritten behind gtrain's back: other bytes, the old sha256 in the metadata
    old_sha = s3.head_object(Bucket=bucket, Key="c/model.bin")["Metadata"]["gtrain-sha256"]
    s3.put_object(Bucket=bucket, Key="c/model.bin", Body=os.urandom(size), Metadata={"gtrain-sha256": old_sha})

    with pytest.raises(SyncError, match="model.bin.*does not match its gtrain-sha256"):
        sync(url, str(dst), **SMALL_PARTS)
    assert not (dst / "model.bin").exists()
    assert (dst / "good.bin").read_bytes() == b"g"  # the others still arrived
    assert leftovers(dst) == []


KILL_AFTER = textwrap.dedent("""
    import os, sys
    from gtrain.sync.objstore import sync
    src, dst, key, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    def die(ev):
        if getattr(ev, key) >= limit:
            os._exit(17)  # a crash mid-sync: no cleanup, no manifest close
    sync(src, dst, workers=4, on_progress=die, multipart_threshold=5 << 20, part_size=5 << 20)
""")


def run_killed(repo_root: Path, src: str, dst: str, key: str, limit: int) -> None:
    p = subprocess.run([sys.executable, "-c", KILL_AFTER, src, dst, key, str(limit)], cwd=repo_root,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 17, p.stderr


def test_interrupted_upload_resumes(tmp_path: Path, s3: Any, bucket: str, repo_root: Path) -> None:
    src = tmp_path / "src"
    files = make_tree(src, n=200)
    url = f"s3://{bucket}/resume"
    run_killed(repo_root, str(src), url, "files_done", 40)
    landed = len(remote_tree(s3, bucket))
    assert 40 <= landed < len(files)

    r = sync(str(src), url)
    assert 0 < r.uploaded <= len(files) - 40 + 4  # only what was missing (+ what was in flight)
    assert r.uploaded + r.skipped == len(files)
    assert remote_tree(s3, bucket) == {f"resume/{k}": v for k, v in files.items()}
    assert sync(str(src), url).uploaded == 0


def test_interrupted_download_resumes_and_cleans_temp_files(tmp_path: Path, s3: Any, bucket: str,
                                                            repo_root: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=30)
    files["big.pt"] = os.urandom(12 * MiB)
    (src / "big.pt").write_bytes(files["big.pt"])
    url = f"s3://{bucket}/dl"
    sync(str(src), url, **SMALL_PARTS)

    run_killed(repo_root, url, str(dst), "bytes_done", 6 * MiB)  # dies inside the big file's parts
    partial = read_tree(dst)
    for rel, data in partial.items():  # whatever has a final name is complete
        if TMP_TAG not in rel:
            assert files[rel] == data

    r = sync(url, str(dst), **SMALL_PARTS)
    assert r.downloaded + r.skipped == len(files) and r.downloaded < len(files)
    assert leftovers(dst) == []
    assert read_tree(dst) == files


@pytest.mark.parametrize(("evil", "match"), [("p/../../evil.txt", r"p/\.\./\.\./evil\.txt"),
                                            ("p//etc/passwd", "outside the destination")])
def test_keys_escaping_the_destination_are_refused(tmp_path: Path, s3: Any, bucket: str, weed_env: Weed,
                                                   evil: str, match: str) -> None:
    """A hostile listing (a real server refuses such keys on PUT: a relay answers the ListObjectsV2 itself)
    naming a key that would land outside the destination refuses the whole download before any write."""
    from xml.sax.saxutils import escape

    from gtrain.sync.s3wire import S3Wire, resolve_settings

    def listing(h: Any, body: bytes | None, data: bytes) -> bool:
        if data or h.command != "GET" or "list-type=2" not in h.path:
            return False
        items = "".join(f"<Contents><Key>{escape(k)}</Key><Size>2</Size><ETag>&quot;{'0' * 32}&quot;</ETag>"
                        "</Contents>" for k in ("p/ok.txt", evil))
        xml = (f"<ListBucketResult><Name>{bucket}</Name><IsTruncated>false</IsTruncated>{items}"
               "</ListBucketResult>").encode()
        h.send_response(200)
        h.send_header("Content-Length", str(len(xml)))
        h.end_headers()
        h.wfile.write(xml)
        return True

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), listing)
    try:
        env = {**os.environ, "AWS_ENDPOINT_URL": relay.endpoint}
        dst = tmp_path / "deep" / "dst"
        with pytest.raises(SyncError, match=match):
            sync(f"s3://{bucket}/p", str(dst), client_factory=lambda: S3Wire(settings=resolve_settings(env=env)))
        assert not dst.exists()
        assert list(tmp_path.rglob("evil*")) == [] and list(tmp_path.rglob("passwd")) == []
    finally:
        relay.close()


def test_missing_bucket_is_a_config_error_naming_it(tmp_path: Path, weed_env: Weed) -> None:
    (tmp_path / "src").mkdir()
    name = f"no-such-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigError, match=name) as e:
        sync(str(tmp_path / "src"), f"s3://{name}/x")
    assert e.value.field == "DST"
    with pytest.raises(ConfigError, match=name) as e:
        sync(f"s3://{name}/x", str(tmp_path / "dst"))
    assert e.value.field == "SRC"
    assert not (tmp_path / "dst").exists()


def test_no_credentials_is_a_credentials_error(tmp_path: Path, weed_env: Weed,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    (tmp_path / "src").mkdir()
    with pytest.raises(CredentialsError) as e:
        sync(str(tmp_path / "src"), "s3://some-bucket/x")
    assert e.value.hint and "AWS_ACCESS_KEY_ID" in e.value.hint


@pytest.mark.parametrize(("src", "dst", "field", "match"), [
    ("LOCAL", "s3://", "DST", "no bucket"),
    ("LOCAL", "s3:///prefix", "DST", "no bucket"),
    ("LOCAL", "s3:/bucket/x", "DST", "malformed"),
    ("LOCAL", "S3://bucket/x", "DST", "lower case"),
    ("LOCAL", "gcs://bucket/x", "DST", "gs://"),
    ("LOCAL", "ftp://bucket/x", "DST", "unsupported"),
    ("LOCAL", "s3://Bad_Bucket/x", "DST", "not a valid S3 bucket"),
    ("LOCAL", "s3://ab/x", "DST", "not a valid S3 bucket"),
    ("LOCAL", "s3://bucket/a//b", "DST", "empty"),
    ("LOCAL", "s3://bucket/a/../b", "DST", r"'\.\.'"),
    ("s3://bucket/x", "s3://bucket/y", "DST", "bucket-to-bucket"),
    ("LOCAL", "LOCAL2", "DST", "neither side"),
    ("", "s3://bucket/x", "SRC", "empty"),
    ("MISSING", "s3://bucket/x", "SRC", "does not exist"),
    ("FILE", "s3://bucket/x", "SRC", "not a directory"),
    ("s3://bucket/x", "FILE", "DST", "not a directory"),
])
def test_bad_locations_are_config_errors(tmp_path: Path, src: str, dst: str, field: str, match: str) -> None:
    (tmp_path / "local").mkdir()
    (tmp_path / "file").write_bytes(b"f")
    subst = {"LOCAL": tmp_path / "local", "LOCAL2": tmp_path / "local2", "MISSING": tmp_path / "missing",
             "FILE": tmp_path / "file"}
    with pytest.raises(ConfigError) as e:
        sync(str(subst.get(src, src)), str(subst.get(dst, dst)))
    assert re.search(match, f"{e.value.message} (hint: {e.value.hint})"), e.value.message
    assert e.value.field == field


def test_signatures_are_accepted_by_a_verifying_server(tmp_path: Path, bucket: str, weed_env: Weed,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """SeaweedFS recomputes every request's SigV4 signature: each kind of call goes through, and the same
    sync with a wrong secret is refused as a CredentialsError (nothing written)."""
    access, secret = weed_env.env()["AWS_ACCESS_KEY_ID"], weed_env.env()["AWS_SECRET_ACCESS_KEY"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access)
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=3)
    files["big.bin"] = os.urandom(11 * MiB)
    (src / "big.bin").write_bytes(files["big.bin"])
    url = f"s3://{bucket}/signed"
    r = sync(str(src), url, **SMALL_PARTS)  # list, PUTs (odd keys), multipart, then
    assert r.uploaded == len(files)
    (src / "f0000.bin").unlink()
    assert sync(str(src), url, delete=True).deleted == 1  # DeleteObjects
    assert sync(url, str(dst), **SMALL_PARTS).downloaded == len(files) - 1  # GETs, HEAD, ranged GETs
    assert read_tree(dst) == {k: v for k, v in files.items() if k != "f0000.bin"}

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret[:-1] + ("x" if secret[-1] != "x" else "y"))
    with pytest.raises(CredentialsError, match="SignatureDoesNotMatch"):
        sync(str(src), url)


KILL_AT_PART_3 = textwrap.dedent("""
    import os, sys
    from gtrain.sync.objstore import sync
    from gtrain.sync.s3wire import S3Wire
    def die(method, target):
        if "partNumber=3&" in target:
            os._exit(17)  # a crash mid-upload: parts 1 and 2 are in S3
    sync(sys.argv[1], sys.argv[2], workers=1, client_factory=lambda: S3Wire(on_request=die),
         multipart_threshold=5 << 20, part_size=5 << 20)
""")


def open_uploads(s3: Any, bucket: str) -> list[str]:
    return [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.mark.parametrize("then", ["same-file", "changed-file", "deleted-file"])
def test_a_killed_multipart_upload_is_resumed_or_aborted(tmp_path: Path, s3: Any, bucket: str, repo_root: Path,
                                                         then: str) -> None:
    from gtrain.sync.s3wire import S3Wire

    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(25 * MiB + 7)  # 6 parts of 5 MiB
    (src / "big.bin").write_bytes(big)
    (src / "small.txt").write_bytes(b"s")
    url = f"s3://{bucket}/mp"
    p = subprocess.run([sys.executable, "-c", KILL_AT_PART_3, str(src), url], cwd=repo_root, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 17, p.stderr  # died as it was about to send part 3
    assert open_uploads(s3, bucket) == ["mp/big.bin"]  # left unfinished (and billed) by the crash
    upload = s3.list_multipart_uploads(Bucket=bucket)["Uploads"][0]
    held = len(s3.list_parts(Bucket=bucket, Key="mp/big.bin", UploadId=upload["UploadId"]).get("Parts", []))
    assert held == 2

    if then == "changed-file":
        big = os.urandom(len(big))
        (src / "big.bin").write_bytes(big)
    elif then == "deleted-file":
        (src / "big.bin").unlink()
    parts_sent: list[str] = []

    def client() -> Any:
        return S3Wire(on_request=lambda method, target: parts_sent.append(target)
                      if method == "PUT" and "partNumber=" in target else None)

    r = sync(str(src), url, client_factory=client, **SMALL_PARTS)
    assert open_uploads(s3, bucket) == []  # resumed and completed, or aborted: nothing left behind
    if then == "deleted-file":
        assert parts_sent == [] and "mp/big.bin" not in remote_tree(s3, bucket)
        return
    assert s3.get_object(Bucket=bucket, Key="mp/big.bin")["Body"].read() == big
    head = s3.head_object(Bucket=bucket, Key="mp/big.bin")
    assert head["Metadata"]["gtrain-sha256"] == hashlib.sha256(big).hexdigest()
    if then == "same-file":
        assert len(parts_sent) == 6 - held, parts_sent  # only the parts S3 did not have
    else:
        assert len(parts_sent) == 6  # a new upload: the old parts belong to other bytes
    assert r.uploaded >= 1


def forward_head(h: Any, upstream: str, path: str, body: bytes | None, headers: dict[str, str]) -> bytes:
    """Ask ``upstream`` (host:port) the request ``h`` is handling, send its status and headers back through
    ``h`` (the body's own Content-Length) and return the body for the caller to send (or not)."""
    import http.client

    c = http.client.HTTPConnection(upstream, timeout=30)
    c.request(h.command, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    h.send_response(r.status)
    for k, v in r.getheaders():
        if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date"):
            h.send_header(k, v)
    h.send_header("Content-Length", r.getheader("Content-Length", "0") if h.command == "HEAD" else str(len(data)))
    h.end_headers()
    return bytes(data)


class _Relay:
    """A plain-HTTP relay in front of the S3 server for tests of what the network does to the client. ``intercept``
    is called with (handler, request body, b"") before the server is asked (True: the test answered it) and with
    the server's answer body once the headers went out (True: the test sent, or cut short, the body itself);
    everything else is passed through, each answer whole with its own Content-Length."""

    def __init__(self, upstream: str, intercept: Callable[[Any, bytes | None, bytes], bool]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if intercept(self, body, b""):  # answered by the test: the server never sees it
                    return
                # the Host header as the client signed it (a server checking SigV4 recomputes it with it)
                data = forward_head(self, upstream, self.path, body, dict(self.headers.items()))
                if self.command != "HEAD" and not intercept(self, body, data):
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any  # noqa: N815

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_download_stream_that_breaks_is_fetched_again(tmp_path: Path, s3: Any, bucket: str,
                                                         weed_env: Weed) -> None:
    """A relay in front of the S3 server sends half of a body and drops the connection, once for a small object's GET
    and once for a large one's first ranged GET: each is fetched again, and nothing partial is kept."""
    import socket

    from gtrain.sync.s3wire import S3Wire, resolve_settings

    broken: list[str] = []

    def cut(h: Any, body: bytes | None, data: bytes) -> bool:
        victim = h.path.endswith("/victim.bin") or (h.path.endswith("/big.bin")
                                                   and h.headers.get("Range", "").startswith("bytes=0-"))
        if not data or h.command != "GET" or not victim or h.path in broken:
            return False
        broken.append(h.path)
        h.wfile.write(data[: len(data) // 2])  # half the body, then the connection goes
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)
        h.close_connection = True
        return True

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), cut)
    try:
        data = os.urandom(300_000)
        s3.put_object(Bucket=bucket, Key="b/victim.bin", Body=data)
        s3.put_object(Bucket=bucket, Key="b/other.txt", Body=b"o")
        big = os.urandom(11 * MiB)
        s3.put_object(Bucket=bucket, Key="b/big.bin", Body=big)
        env = {**os.environ, "AWS_ENDPOINT_URL": relay.endpoint}
        dst = tmp_path / "dst"
        r = sync(f"s3://{bucket}/b", str(dst), client_factory=lambda: S3Wire(settings=resolve_settings(env=env)),
                 **SMALL_PARTS)
        assert r.downloaded == 3 and len(broken) == 2  # a whole GET and a ranged GET were cut short
        assert (dst / "victim.bin").read_bytes() == data and (dst / "big.bin").read_bytes() == big
        assert leftovers(dst) == []
    finally:
        relay.close()


def test_a_bucket_in_another_region_is_followed(tmp_path: Path, s3: Any, bucket: str, weed_env: Weed) -> None:
    """As S3 does for a bucket of another region, a relay in front of the S3 server answers 301 PermanentRedirect with
    ``x-amz-bucket-region`` to requests signed for the wrong region: the client re-signs for the bucket's own
    region (as botocore's redirector does) and the sync goes through."""
    import re

    from gtrain.sync.s3wire import S3Wire, resolve_settings

    regions: list[str] = []

    def redirect(h: Any, body: bytes | None, data: bytes) -> bool:
        if data:
            return False
        m = re.search(r"Credential=[^/]+/\d+/([^/]+)/s3/", h.headers.get("Authorization", ""))
        regions.append(m.group(1) if m else "?")
        if regions[-1] == "eu-west-1":
            return False
        err = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PermanentRedirect</Code><Message>The bucket '
               b'you are attempting to access must be addressed using the specified endpoint.</Message></Error>')
        h.send_response(301)
        h.send_header("x-amz-bucket-region", "eu-west-1")
        h.send_header("Content-Length", str(len(err)))
        h.end_headers()
        h.wfile.write(err if h.command != "HEAD" else b"")
        return True

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), redirect)
    try:
        src = tmp_path / "src"
        files = make_tree(src, n=5)
        env = {**os.environ, "AWS_ENDPOINT_URL": relay.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        r = sync(str(src), f"s3://{bucket}/far", client_factory=lambda: S3Wire(settings=resolve_settings(env=env)))
        assert r.uploaded == len(files)
        assert regions[0] == "us-east-1" and regions[1:] and set(regions[1:]) == {"eu-west-1"}  # one redirect
        assert remote_tree(s3, bucket, "far/") == {f"far/{k}": v for k, v in files.items()}
    finally:
        relay.close()
