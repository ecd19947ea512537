"""``gtrain sync`` against fake-gcs-server over HTTP (one emulator per run: tests/fixtures/gcs_emulator.py).

Nothing is mocked: google-cloud-storage talks HTTP to the emulator (which pages listings and enforces
generation preconditions like GCS), files are real, an interrupted sync is a real killed process.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import ConfigError, SyncError
from gtrain.sync.objstore import TMP_TAG, ProgressEvent, sync

MiB = 1024 * 1024
SMALL_CHUNKS = {"multipart_threshold": 1 * MiB, "part_size": 1 * MiB}


def new_client(session: Any = None) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="gtrain-test", credentials=AnonymousCredentials(), _http=session)


@pytest.fixture
def gcs(gcs_emulator: str) -> Any:
    return new_client()


@pytest.fixture
def bucket(gcs: Any) -> Iterator[str]:
    name = f"gt-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(name)
    yield name


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


def remote_tree(gcs: Any, bucket: str, prefix: str = "") -> dict[str, bytes]:
    return {b.name: b.download_as_bytes() for b in gcs.list_blobs(bucket, prefix=prefix or None)}


def put(gcs: Any, bucket: str, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
    blob = gcs.bucket(bucket).blob(key)
    if metadata:
        blob.metadata = metadata
    blob.upload_from_string(data)


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if TMP_TAG in p.name]


def test_upload_download_roundtrip_and_noop_resync(tmp_path: Path, gcs: Any, bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src)
    url = f"gs://{bucket}/runs/r1"

    up = sync(str(src), url)
    assert (up.direction, up.uploaded, up.skipped) == ("upload", len(files), 0)
    assert remote_tree(gcs, bucket) == {f"runs/r1/{k}": v for k, v in files.items()}
    blob = gcs.bucket(bucket).get_blob("runs/r1/nested/deeper/a.txt")
    assert blob.metadata["gtrain-sha256"] == hashlib.sha256(b"hello\n").hexdigest()

    down = sync(url, str(dst))
    assert (down.downloaded, down.skipped) == (len(files), 0)
    assert read_tree(dst) == files
    assert leftovers(dst) == []

    for r in (sync(str(src), url), sync(url, str(dst))):
        assert (r.uploaded, r.downloaded, r.deleted, r.hashed, r.skipped) == (0, 0, 0, 0, len(files))


def test_noop_resync_of_1000_files_is_one_listing_under_a_second(tmp_path: Path, bucket: str,
                                                               gcs_emulator: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(1000):
        (src / f"s{i:04d}").write_bytes(b"x" * (i % 97))
    url = f"gs://{bucket}/many"
    assert sync(str(src), url).uploaded == 1000

    times = []
    relay = counting_relay(gcs_emulator)  # every request, counted in front of the emulator
    try:
        for _ in range(2):  # the best of two fresh runs (client made inside the timing): CI machines are shared
            relay.calls.clear()
            t0 = time.monotonic()
            r = sync(str(src), url, client_factory=relay.client)
            times.append(time.monotonic() - t0)
            assert (r.uploaded, r.skipped, r.hashed) == (0, 1000, 0)
            # one listing (fake-gcs-server may hand out a token for an empty last page), no per-file request
            assert {m for m, _ in relay.calls} == {"GET"} and len(relay.calls) <= 2, relay.calls
    finally:
        relay.close()
    print(f"\nGCS no-change re-sync of 1000 files: {' / '.join(f'{t:.3f}s' for t in times)}")
    assert min(times) < 1.0


def test_noop_resync_does_not_import_google_cloud_storage(tmp_path: Path, bucket: str, gcs_emulator: str) -> None:
    """The no-change re-sync is one JSON-API listing through google-auth: google-cloud-storage (0.28 s of
    imports, more than the re-sync itself) stays out of the process."""
    src = tmp_path / "src"
    make_tree(src, n=3)
    url = f"gs://{bucket}/noimport"
    probe = textwrap.dedent(f"""
        import sys
        from gtrain.sync.objstore import sync
        r = sync({str(src)!r}, {url!r})
        print(r.uploaded, r.skipped, sorted(m for m in sys.modules if m.startswith("google.cloud")))
    """)
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "STORAGE_EMULATOR_HOST": gcs_emulator}) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert runs[0].stdout.split(" ", 2)[0] == "6"  # the upload went through the same path
    assert runs[1].stdout.strip() == "0 6 []", runs[1].stdout


def test_listing_pages_are_followed(tmp_path: Path, gcs: Any, bucket: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(1005):  # > one page of 1000
        (src / f"p{i:04d}").write_bytes(b"")
    url = f"gs://{bucket}/paged"
    assert sync(str(src), url).uploaded == 1005
    r = sync(str(src), url, delete=True)
    assert (r.skipped, r.deleted, r.uploaded) == (1005, 0, 0)


def test_changed_files_move_both_ways(tmp_path: Path, gcs: Any, bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=5)
    url = f"gs://{bucket}/p"
    sync(str(src), url)
    sync(url, str(dst))

    (src / "f0001.bin").write_bytes(b"y" * len(files["f0001.bin"]))  # same size, new content
    (src / "nested/deeper/a.txt").write_bytes(b"longer now\n")
    r = sync(str(src), url)
    assert (r.uploaded, r.skipped) == (2, len(files) - 2)
    assert sorted(a.path for a in r.actions) == ["f0001.bin", "nested/deeper/a.txt"]

    put(gcs, bucket, "p/f0002.bin", b"changed behind gtrain's back")
    r = sync(url, str(dst))
    assert r.downloaded == 3
    assert read_tree(dst) == read_tree(src) | {"f0002.bin": b"changed behind gtrain's back"}


def test_delete_mirrors_within_the_prefix_only(tmp_path: Path, gcs: Any, bucket: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, n=3)
    url = f"gs://{bucket}/run1"
    sync(str(src), url)
    for key in ("run1/stale.bin", "run1/old/deep.bin", "run10/sibling.bin", "other.bin"):
        put(gcs, bucket, key, b"z")

    assert sync(str(src), url).deleted == 0
    r = sync(str(src), url, delete=True)
    assert r.deleted == 2
    keys = set(remote_tree(gcs, bucket))
    assert {"run10/sibling.bin", "other.bin"} <= keys
    assert not any(k.startswith(("run1/stale", "run1/old/")) for k in keys)

    sync(url, str(dst))
    (dst / "extra").mkdir()
    (dst / "extra/local-only.txt").write_bytes(b"l")
    r = sync(url, str(dst), delete=True)
    assert r.deleted == 1 and not (dst / "extra").exists()
    assert read_tree(dst) == read_tree(src)


def test_dry_run_changes_nothing(tmp_path: Path, gcs: Any, bucket: str, gtrain_home: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=4)
    url = f"gs://{bucket}/d"
    r = sync(str(src), url, dry_run=True, delete=True)
    assert r.uploaded == len(files) and {a.kind for a in r.actions} == {"upload"}
    assert remote_tree(gcs, bucket) == {}
    assert not (gtrain_home / "sync").exists()

    sync(str(src), url)
    put(gcs, bucket, "d/remote-only", b"r")
    (src / "f0000.bin").write_bytes(b"changed")
    before = remote_tree(gcs, bucket)
    r = sync(str(src), url, delete=True, dry_run=True)
    assert [(a.kind, a.path) for a in r.actions] == [("delete-remote", "remote-only"), ("upload", "f0000.bin")]
    assert remote_tree(gcs, bucket) == before

    r = sync(url, str(dst), dry_run=True)
    assert r.downloaded == len(files) + 1 and not dst.exists()


def test_large_file_is_one_resumable_stream(tmp_path: Path, bucket: str, gcs_emulator: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    big = os.urandom(20 * MiB + 321)
    (src / "ckpt.pt").write_bytes(big)
    relay = counting_relay(gcs_emulator)
    calls = relay.calls
    events: list[ProgressEvent] = []
    url = f"gs://{bucket}/ckpt"

    try:
        r = sync(str(src), url, on_progress=events.append, client_factory=relay.client, **SMALL_CHUNKS)
    finally:
        relay.close()
    assert r.uploaded == 1
    uploads = [(m, u) for m, u in calls if "/upload/" in u]
    # one resumable session (its PUT goes to the session URL the emulator names: its own address, past the relay)
    assert [m for m, _ in uploads] == ["POST"] and "uploadType=resumable" in uploads[0][1]
    assert events[-1].phase == "done" and events[-1].bytes_done == events[-1].bytes_total == len(big)
    blob = new_client().bucket(bucket).get_blob("ckpt/ckpt.pt")
    assert blob.size == len(big) and blob.md5_hash is not None
    assert blob.metadata["gtrain-sha256"] == hashlib.sha256(big).hexdigest()

    r = sync(url, str(dst), **SMALL_CHUNKS)
    assert r.downloaded == 1 and (dst / "ckpt.pt").read_bytes() == big
    assert leftovers(dst) == []


def test_one_request_per_small_file(tmp_path: Path, bucket: str, gcs_emulator: str) -> None:
    """Counted by a relay in front of the emulator: one upload per small file, one media GET per download."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=6)
    relay = counting_relay(gcs_emulator)
    calls = relay.calls
    url = f"gs://{bucket}/inst"
    try:
        assert sync(str(src), url, client_factory=relay.client).uploaded == len(files)
        posts = [u for m, u in calls if m == "POST"]
        assert len(posts) == len(files) and all("uploadType=multipart" in u and "ifGenerationMatch=0" in u
                                                for u in posts)
        calls.clear()
        assert sync(url, str(dst), client_factory=relay.client).downloaded == len(files)
    finally:
        relay.close()
    media = [u for m, u in calls if "/download/" in u or "alt=media" in u]
    assert len(media) == len(files) and len(calls) <= len(files) + 2, calls  # + the listing
    assert read_tree(dst) == files


def test_gzip_encoded_object_arrives_as_stored(tmp_path: Path, gcs: Any, bucket: str) -> None:
    import gzip

    stored = gzip.compress(b"text " * 1000)
    blob = gcs.bucket(bucket).blob("gz/a.txt")
    blob.content_encoding = "gzip"
    blob.upload_from_string(stored)
    r = sync(f"gs://{bucket}/gz", str(tmp_path / "dst"))
    assert r.downloaded == 1 and (tmp_path / "dst/a.txt").read_bytes() == stored


KILL_AFTER = textwrap.dedent("""
    import os, sys
    from gtrain.sync.objstore import sync
    src, dst, key, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    def die(ev):
        if getattr(ev, key) >= limit:
            os._exit(17)  # a crash mid-sync: no cleanup, no manifest close
    sync(src, dst, workers=4, on_progress=die, multipart_threshold=1 << 20, part_size=1 << 20)
""")


def run_killed(repo_root: Path, src: str, dst: str, key: str, limit: int) -> None:
    p = subprocess.run([sys.executable, "-c", KILL_AFTER, src, dst, key, str(limit)], cwd=repo_root,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 17, p.stderr


def test_interrupted_upload_resumes(tmp_path: Path, gcs: Any, bucket: str, repo_root: Path) -> None:
    src = tmp_path / "src"
    files = make_tree(src, n=200)
    url = f"gs://{bucket}/resume"
    run_killed(repo_root, str(src), url, "files_done", 40)
    landed = len(remote_tree(gcs, bucket))
    assert 40 <= landed < len(files)

    r = sync(str(src), url)
    assert 0 < r.uploaded <= len(files) - 40
    assert r.uploaded + r.skipped == len(files)
    assert remote_tree(gcs, bucket) == {f"resume/{k}": v for k, v in files.items()}
    assert sync(str(src), url).uploaded == 0


def test_interrupted_download_resumes_and_cleans_temp_files(tmp_path: Path, gcs: Any, bucket: str,
                                                            repo_root: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=30)
    files["big.pt"] = os.urandom(12 * MiB)
    (src / "big.pt").write_bytes(files["big.pt"])
    url = f"gs://{bucket}/dl"
    sync(str(src), url, **SMALL_CHUNKS)

    run_killed(repo_root, url, str(dst), "bytes_done", 4 * MiB)
    for rel, data in read_tree(dst).items():
        if TMP_TAG not in rel:
            assert files[rel] == data

    r = sync(url, str(dst), **SMALL_CHUNKS)
    assert r.downloaded + r.skipped == len(files) and r.downloaded < len(files)
    assert leftovers(dst) == []
    assert read_tree(dst) == files


def test_keys_escaping_the_destination_are_refused(tmp_path: Path, gcs: Any, bucket: str) -> None:
    dst = tmp_path / "deep" / "dst"
    put(gcs, bucket, "p/ok.txt", b"ok")
    put(gcs, bucket, "p/../../evil.txt", b"evil")
    with pytest.raises(SyncError, match=r"p/\.\./\.\./evil\.txt"):
        sync(f"gs://{bucket}/p", str(dst))
    assert not dst.exists() and list(tmp_path.rglob("evil*")) == []

    gcs.bucket(bucket).blob("p/../../evil.txt").delete()
    put(gcs, bucket, "p//etc/passwd", b"evil")
    with pytest.raises(SyncError, match="outside the destination"):
        sync(f"gs://{bucket}/p", str(dst))
    assert not dst.exists()


def test_missing_bucket_is_a_config_error_naming_it(tmp_path: Path, gcs_emulator: str) -> None:
    (tmp_path / "src").mkdir()
    name = f"no-such-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigError, match=name) as e:
        sync(str(tmp_path / "src"), f"gs://{name}/x")
    assert e.value.field == "DST"
    with pytest.raises(ConfigError, match=name) as e:
        sync(f"gs://{name}/x", str(tmp_path / "dst"))
    assert e.value.field == "SRC"


@pytest.mark.parametrize("url", ["gs://", "gs://UPPER/x", "gs://b/x", "gs://bucket/a//b", "gs://bucket/./a",
                                 "gs:bucket/x", "GS://bucket/x"])
def test_bad_gcs_urls_are_config_errors(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigError) as e:
        sync(str(tmp_path), url)
    assert e.value.field == "DST"


class _Counting:
    """A relay in front of the emulator that records every request (method, path) it passes on."""

    def __init__(self, upstream: str, chunked: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.handler = type("Proxy", (_ChunkingProxy,), {"upstream": upstream.removeprefix("http://"),
                                                         "calls": self.calls, "chunked": chunked, "served": 0})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="gtrain-test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def counting_relay(upstream: str, chunked: bool = False) -> _Counting:
    return _Counting(upstream, chunked)


class _ChunkingProxy(BaseHTTPRequestHandler):
    """Relays to the emulator and answers with ``Transfer-Encoding: chunked``; every third response closes
    its connection without announcing it (what a server does to a kept-alive connection it timed out)."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    served = 0
    calls: list[tuple[str, str]] = []
    chunked = True

    def relay(self) -> None:
        type(self).calls.append((self.command, self.path))
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        skip = {"host", "content-length", "connection", "transfer-encoding"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        up = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            up.request(self.command, self.path, body=body, headers=headers)
            r = up.getresponse()
            data = r.read()
        finally:
            up.close()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in skip | {"date", "server"}:
                self.send_header(k, v)
        if not self.chunked:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(0, len(data), 1000):
            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (min(1000, len(data) - i), data[i:i + 1000]))
        self.wfile.write(b"0\r\nx-trailer: 1\r\n\r\n")
        self.wfile.flush()
        type(self).served += 1
        if type(self).served % 3 == 0:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = relay

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_chunked_responses_and_dropped_keepalive_connections(tmp_path: Path, gcs_emulator: str, bucket: str) -> None:
    """The backend's own HTTP/1.1 framing: chunked bodies (with extensions and trailers) and kept-alive
    connections the server closed unannounced, through a relay in front of the emulator."""
    relay = counting_relay(gcs_emulator, chunked=True)
    handler, client = relay.handler, relay.client
    try:
        src, dst = tmp_path / "src", tmp_path / "dst"
        files = make_tree(src, n=40, size=3000)
        files["big.bin"] = os.urandom(2 * MiB + 7)
        (src / "big.bin").write_bytes(files["big.bin"])
        url = f"gs://{bucket}/relay"
        assert sync(str(src), url, workers=4, client_factory=client, **SMALL_CHUNKS).uploaded == len(files)
        assert sync(url, str(dst), workers=4, client_factory=client, **SMALL_CHUNKS).downloaded == len(files)
        assert read_tree(dst) == files
        assert handler.served > len(files)
    finally:
        relay.close()


class _LosesFirstUploadAnswer(_ChunkingProxy):
    """Passes the first direct upload on to the emulator (the object is made) and hangs up without answering:
    the answer lost on the way back, after which the client tries again."""

    chunked = False
    lost: list[str] = []

    def relay(self) -> None:
        if self.command == "POST" and "uploadType=multipart" in self.path and not type(self).lost:
            type(self).lost.append(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "connection"}}
            up = http.client.HTTPConnection(self.upstream, timeout=60)
            try:
                up.request("POST", self.path, body=body, headers=headers)
                assert up.getresponse().status == 200
            finally:
                up.close()
            self.close_connection = True
            return
        super().relay()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = relay


def test_a_direct_upload_whose_answer_was_lost_is_not_failed_by_its_own_retry(tmp_path: Path, gcs_emulator: str,
                                                                             bucket: str) -> None:
    """The retry of a create (``ifGenerationMatch=0``) whose first try made the object fails the precondition on
    gtrain's own write: that is taken as done once the object is, by sha256 and crc32c, what was sent."""
    relay = counting_relay(gcs_emulator)
    relay.server.RequestHandlerClass = handler = type("Lossy", (_LosesFirstUploadAnswer,), {
        "upstream": gcs_emulator.removeprefix("http://"), "calls": relay.calls, "lost": []})
    try:
        src = tmp_path / "src"
        files = make_tree(src, n=1, size=3000)
        url = f"gs://{bucket}/lost"
        assert sync(str(src), url, client_factory=relay.client).uploaded == len(files)
        assert len(handler.lost) == 1
        # every file's create answered once through the relay: the lost one's by its retry
        assert len([c for c in relay.calls if c[0] == "POST" and "uploadType=multipart" in c[1]]) == len(files)
        assert sync(url, str(tmp_path / "dst")).downloaded == len(files)
        assert read_tree(tmp_path / "dst") == files
    finally:
        relay.close()


def test_a_touched_file_is_compared_by_sha256_alone_where_the_listing_shows_it(
        tmp_path: Path, gcs_emulator: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose mtime moved (same size) is hashed to be compared: against an object whose listing carries its
    sha256 (GCS's metadata) the md5, the slowest hash, is not computed, whichever way the sync goes."""
    from gtrain.sync import engine

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(2 * MiB))  # above the inline size: compared by hash_file
    url = f"gs://{bucket}/touched"
    assert sync(str(src), url).uploaded == 1
    assert sync(url, str(dst)).downloaded == 1
    asked: list[bool] = []
    real = engine.hash_file
    monkeypatch.setattr(engine, "hash_file", lambda p, md5=True: asked.append(md5) or real(p, md5=md5))
    for side in (src, dst):
        os.utime(side / "w.bin", (time.time() + 60, time.time() + 60))
    up, down = sync(str(src), url), sync(url, str(dst))
    assert (up.uploaded, up.hashed, down.downloaded, down.hashed) == (0, 1, 0, 1)
    assert asked == [False, False]
