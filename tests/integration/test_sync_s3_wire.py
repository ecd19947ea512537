"""What the network and the server do to ``gtrain sync``'s S3 client, on SeaweedFS (signatures checked): a
region from ``AWS_REGION``, a server whose clock is ten minutes ahead, a SlowDown / 429 storm, flexible
checksums that boto3 verifies, and an authenticating HTTP proxy (absolute-URI requests for http, CONNECT for
https). The misbehaving parts are real servers written here (http.server), in front of the real one."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import re
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import CredentialsError, SyncError
from gtrain.sync.objstore import sync
from gtrain.sync.s3wire import S3Wire, resolve_settings
from tests.fixtures.seaweedfs import Weed
from tests.integration.test_sync_s3 import _Relay, forward_head, leftovers, make_tree, read_tree, remote_tree

MiB = 1024 * 1024


@pytest.fixture
def s3(weed_s3: Any) -> Any:
    return weed_s3


@pytest.fixture
def bucket(weed_bucket: str) -> str:
    return weed_bucket


def via(endpoint: str, **env: str) -> Any:
    """A client factory for a sync through ``endpoint`` (a relay / proxy in front of the server)."""
    e = {**os.environ, "AWS_ENDPOINT_URL": endpoint, **env}
    return lambda: S3Wire(settings=resolve_settings(env=e), backoff=0.02)


def answer(h: Any, status: int, xml: bytes, **headers: str) -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k.replace("_", "-"), v)
    h.send_header("Content-Length", str(len(xml)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(xml)


def error_xml(code: str, extra: str = "") -> bytes:
    return f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>m</Message>{extra}</Error>".encode()


def signed_region(h: Any) -> str:
    m = re.search(r"Credential=[^/]+/\d+/([^/]+)/s3/", h.headers.get("Authorization", ""))
    return m.group(1) if m else "?"


def test_aws_region_is_the_signing_region(tmp_path: Path, bucket: str, weed_env: Weed) -> None:
    regions: list[str] = []

    def seen(h: Any, body: bytes | None, data: bytes) -> bool:
        if not data:
            regions.append(signed_region(h))
        return False

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), seen)
    try:
        make_tree(tmp_path / "src", n=2)
        factory = via(relay.endpoint, AWS_REGION="eu-central-1", AWS_DEFAULT_REGION="us-east-1")
        assert sync(str(tmp_path / "src"), f"s3://{bucket}/r", client_factory=factory).uploaded == 5
        assert regions and set(regions) == {"eu-central-1"}  # AWS_REGION wins over AWS_DEFAULT_REGION
    finally:
        relay.close()
    assert resolve_settings(env={"AWS_DEFAULT_REGION": "ap-south-1"}).region == "ap-south-1"


def test_a_server_clock_ten_minutes_ahead_is_corrected(tmp_path: Path, s3: Any, bucket: str,
                                                       weed_env: Weed) -> None:
    """The relay plays a server whose clock is 10 min ahead of ours: a request dated more than 5 min from its
    time gets RequestTimeTooSkewed with its ServerTime (as S3 answers); the client takes that clock once and
    every later request goes through (SeaweedFS itself allows 15 min)."""
    ahead = 600
    skewed: list[str] = []

    def clock(h: Any, body: bytes | None, data: bytes) -> bool:
        if data:
            return False
        signed = dt.datetime.strptime(h.headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        server_now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ahead)
        if abs((signed - server_now).total_seconds()) <= 300:
            return False
        skewed.append(h.path)
        answer(h, 403, error_xml("RequestTimeTooSkewed", f"<ServerTime>{server_now:%Y-%m-%dT%H:%M:%SZ}</ServerTime>"
                                 "<MaxAllowedSkewMilliseconds>300000</MaxAllowedSkewMilliseconds>"))
        return True

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), clock)
    try:
        files = make_tree(tmp_path / "src", n=5)
        r = sync(str(tmp_path / "src"), f"s3://{bucket}/skew", client_factory=via(relay.endpoint))
        assert r.uploaded == len(files)
        assert len(skewed) == 1  # the first request only: everything after is signed on the server's clock
        assert remote_tree(s3, bucket, "skew/") == {f"skew/{k}": v for k, v in files.items()}
    finally:
        relay.close()


@pytest.mark.parametrize("status", [503, 429])
def test_a_slowdown_storm_is_ridden_out_then_a_lasting_one_fails_clearly(tmp_path: Path, s3: Any, bucket: str,
                                                                         weed_env: Weed, status: int) -> None:
    """A storm of SlowDown (503) / 429 answers: the first eight PUTs are refused and the sync still completes;
    one key refused forever fails after a bounded number of tries (5) with an error naming it, the others land,
    and a download refused the same way leaves no file, partial or whole."""
    counts = {"refused": 0, "stormy": 0}
    code = "SlowDown" if status == 503 else "TooManyRequests"

    def storm(h: Any, body: bytes | None, data: bytes) -> bool:
        if data:
            return False
        if "stormy" in h.path:
            counts["stormy"] += 1
        elif not (h.command in ("PUT", "GET") and counts["refused"] < 8 and "list-type" not in h.path):
            return False
        counts["refused"] += 1
        answer(h, status, error_xml(code))
        return True

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), storm)
    try:
        src = tmp_path / "src"
        files = make_tree(src, n=6)
        t0 = time.monotonic()
        assert sync(str(src), f"s3://{bucket}/st", client_factory=via(relay.endpoint)).uploaded == len(files)
        assert counts["refused"] == 8

        (src / "stormy.bin").write_bytes(b"s" * 100)
        with pytest.raises(SyncError, match=f"stormy.bin.*{code}"):
            sync(str(src), f"s3://{bucket}/st", client_factory=via(relay.endpoint))
        assert counts["stormy"] == 5  # bounded: the tries, then a clear error
        assert "st/stormy.bin" not in remote_tree(s3, bucket, "st/")

        s3.put_object(Bucket=bucket, Key="down/stormy.bin", Body=b"x" * 5000)
        s3.put_object(Bucket=bucket, Key="down/fine.txt", Body=b"fine")
        dst = tmp_path / "dst"
        with pytest.raises(SyncError, match="stormy.bin"):
            sync(f"s3://{bucket}/down", str(dst), client_factory=via(relay.endpoint))
        assert read_tree(dst) == {"fine.txt": b"fine"} and leftovers(dst) == []
        assert time.monotonic() - t0 < 60
    finally:
        relay.close()


def test_flexible_sha256_checksums_are_written_and_boto3_verifies_them(tmp_path: Path, s3: Any, bucket: str,
                                                                        weed_env: Weed) -> None:
    src = tmp_path / "src"
    src.mkdir()
    small, big = os.urandom(3000), os.urandom(11 * MiB)
    (src / "small.bin").write_bytes(small)
    (src / "big.bin").write_bytes(big)
    sync(str(src), f"s3://{bucket}/ck", multipart_threshold=5 * MiB, part_size=5 * MiB)

    head = s3.head_object(Bucket=bucket, Key="ck/small.bin", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(small).digest()).decode()
    got = s3.get_object(Bucket=bucket, Key="ck/small.bin", ChecksumMode="ENABLED")  # boto3 checks the body
    assert got["Body"].read() == small
    head = s3.head_object(Bucket=bucket, Key="ck/big.bin", ChecksumMode="ENABLED")
    assert head.get("ChecksumSHA256"), head  # the composite checksum of the parts' sha256s
    assert s3.get_object(Bucket=bucket, Key="ck/big.bin")["Body"].read() == big


def test_a_flexible_checksum_written_by_another_tool_is_verified_on_download(tmp_path: Path, s3: Any, bucket: str,
                                                                            weed_env: Weed) -> None:
    """An object boto3 wrote with a sha256 checksum and no gtrain metadata; a relay flips one byte of its
    body (same length, so only a checksum can tell): the download is refused and nothing is kept."""
    data = os.urandom(4000)
    s3.put_object(Bucket=bucket, Key="other/a.bin", Body=data, ChecksumAlgorithm="SHA256")

    def flip(h: Any, body: bytes | None, got: bytes) -> bool:
        if not got or h.command != "GET" or not h.path.split("?")[0].endswith("/a.bin"):
            return False
        h.wfile.write(bytes([got[0] ^ 1]) + got[1:])
        return True

    relay = _Relay(weed_env.endpoint.removeprefix("http://"), flip)
    try:
        dst = tmp_path / "dst"
        with pytest.raises(SyncError, match="does not match"):
            sync(f"s3://{bucket}/other", str(dst), client_factory=via(relay.endpoint))
        assert not (dst / "a.bin").exists() and leftovers(dst) == []
    finally:
        relay.close()
    assert sync(f"s3://{bucket}/other", str(dst)).downloaded == 1
    assert (dst / "a.bin").read_bytes() == data


class _Proxy:
    """An HTTP proxy that wants ``Proxy-Authorization: Basic user:secret``: absolute-URI requests are
    forwarded, CONNECT opens a tunnel; ``seen`` records (method, target, authorised)."""

    def __init__(self) -> None:
        want = "Basic " + base64.b64encode(b"user:s3cr%t").decode()
        seen: list[tuple[str, str, bool]] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _auth(self) -> bool:
                ok = self.headers.get("Proxy-Authorization") == want
                seen.append((self.command, self.path, ok))
                if not ok:
                    self.send_response(407)
                    self.send_header("Proxy-Authenticate", 'Basic realm="test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                return ok

            def do_CONNECT(self) -> None:  # noqa: N802
                if not self._auth():
                    return
                host, _, port = self.path.rpartition(":")
                up = socket.create_connection((host, int(port)))
                self.send_response(200, "Connection established")
                self.end_headers()
                socks = [self.connection, up]
                while True:
                    r, _, _ = select.select(socks, [], [], 30)
                    if not r:
                        break
                    done = False
                    for s in r:
                        data = s.recv(65536)
                        if not data:
                            done = True
                            break
                        (up if s is self.connection else self.connection).sendall(data)
                    if done:
                        break
                up.close()
                self.close_connection = True

            def _forward(self) -> None:
                import urllib.parse

                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if not self._auth():
                    return
                u = urllib.parse.urlsplit(self.path)
                hdrs = {k: v for k, v in self.headers.items() if k.lower() != "proxy-authorization"}
                data = forward_head(self, u.netloc, u.path + (f"?{u.query}" if u.query else ""), body, hdrs)
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    p = _Proxy()
    yield p
    p.close()


def test_an_authenticating_proxy_for_plain_http(tmp_path: Path, bucket: str, weed_env: Weed, proxy: _Proxy,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://user:s3cr%25t@{proxy.address}")  # %-encoded in the URL
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=3)
    assert sync(str(src), f"s3://{bucket}/px").uploaded == len(files)
    assert sync(f"s3://{bucket}/px", str(dst)).downloaded == len(files)
    assert read_tree(dst) == files
    assert proxy.seen and all(ok and target.startswith(weed_env.endpoint) for _, target, ok in proxy.seen)

    monkeypatch.setenv("HTTP_PROXY", f"http://user:wrong@{proxy.address}")
    proxy.seen.clear()
    with pytest.raises(CredentialsError, match="proxy"):
        sync(str(src), f"s3://{bucket}/px2")
    assert len(proxy.seen) == 1  # a 407 is not retried


def _tls_relay(tmp_path: Path, upstream: str) -> tuple[_Relay, Path]:
    """The relay in front of the server, speaking TLS with a self-signed certificate for 127.0.0.1."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    relay = _Relay(upstream, lambda h, body, data: False)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    relay.server.socket = ctx.wrap_socket(relay.server.socket, server_side=True)
    relay.endpoint = relay.endpoint.replace("http://", "https://")
    return relay, cert


def test_an_authenticating_proxy_for_https_tunnels_with_connect(tmp_path: Path, bucket: str, weed_env: Weed,
                                                                proxy: _Proxy, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    relay, cert = _tls_relay(tmp_path, weed_env.endpoint.removeprefix("http://"))
    try:
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.setenv("HTTPS_PROXY", f"http://user:s3cr%25t@{proxy.address}")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
        files = make_tree(tmp_path / "src", n=3)
        assert sync(str(tmp_path / "src"), f"s3://{bucket}/tls").uploaded == len(files)
        assert proxy.seen and {m for m, _, ok in proxy.seen if ok} == {"CONNECT"}
        monkeypatch.setenv("HTTPS_PROXY", f"http://user:nope@{proxy.address}")
        with pytest.raises(CredentialsError, match="proxy"):
            sync(str(tmp_path / "src"), f"s3://{bucket}/tls2")
    finally:
        relay.close()


def test_multipart_parts_carry_one_sha256_and_the_composite_checksum_is_checked(tmp_path: Path, s3: Any,
                                                                                 bucket: str, weed_env: Weed) -> None:
    """Each part goes with its sha256 as the signed payload hash AND as the signed x-amz-checksum-sha256 (one
    hash), with no Content-MD5. A relay that rewrites CompleteMultipartUpload's ChecksumSHA256 (same length, so
    only the comparison can tell) fails the file clearly; the upload is aborted and the object the server
    assembled is deleted (its gtrain-sha256 would vouch for it otherwise); a re-run uploads it."""
    parts: dict[str, tuple[dict[str, str], bytes]] = {}  # by path (seen before and after the server answers)
    tamper = [False]

    def watch(h: Any, body: bytes | None, data: bytes) -> bool:
        if h.command == "PUT" and "partNumber=" in h.path:
            parts[h.path] = ({k.lower(): v for k, v in h.headers.items()}, body or b"")
        if data and tamper[0] and h.command == "POST" and "uploadId=" in h.path and b"<ChecksumSHA256>" in data:
            forged = base64.b64encode(hashlib.sha256(b"forged").digest())
            h.wfile.write(re.sub(rb"<ChecksumSHA256>[^<-]+", b"<ChecksumSHA256>" + forged, data))
            return True
        return False

    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(12 * MiB + 5)  # 3 parts of 5 MiB
    (src / "big.bin").write_bytes(big)
    mid = os.urandom(2 * MiB)  # above the engine's in-memory size, below the threshold: one PUT from upload()
    (src / "mid.bin").write_bytes(mid)
    relay = _Relay(weed_env.endpoint.removeprefix("http://"), watch)
    try:
        url = f"s3://{bucket}/mp"
        assert sync(str(src), url, client_factory=via(relay.endpoint), multipart_threshold=5 * MiB,
                    part_size=5 * MiB).uploaded == 2
        assert s3.head_object(Bucket=bucket, Key="mp/mid.bin")["ETag"].strip('"') == hashlib.md5(mid).hexdigest()
        assert len(parts) == 3
        for headers, body in parts.values():
            sha = hashlib.sha256(body).digest()
            assert "content-md5" not in headers
            assert headers["x-amz-checksum-sha256"] == base64.b64encode(sha).decode()
            assert headers["x-amz-content-sha256"] == sha.hex()
            assert "x-amz-checksum-sha256" in headers["authorization"].split("SignedHeaders=")[1].split(",")[0]
        head = s3.head_object(Bucket=bucket, Key="mp/big.bin", ChecksumMode="ENABLED")
        digests = [hashlib.sha256(big[i:i + 5 * MiB]).digest() for i in range(0, len(big), 5 * MiB)]
        assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(b"".join(digests)).digest()).decode() + "-3"

        big = os.urandom(len(big))
        (src / "big.bin").write_bytes(big)
        tamper[0] = True
        with pytest.raises(SyncError, match=r"mp/big\.bin: S3 assembled an object with composite checksum .*deleted"):
            sync(str(src), url, client_factory=via(relay.endpoint), multipart_threshold=5 * MiB, part_size=5 * MiB)
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        assert "mp/big.bin" not in remote_tree(s3, bucket)
    finally:
        relay.close()
    assert sync(str(src), url, multipart_threshold=5 * MiB, part_size=5 * MiB).uploaded == 1
    assert s3.get_object(Bucket=bucket, Key="mp/big.bin")["Body"].read() == big


def test_a_resumed_upload_trusts_a_listed_part_checksum_over_its_etag(tmp_path: Path, s3: Any, bucket: str,
                                                                     weed_env: Weed, repo_root: Path) -> None:
    """S3 lists each part's ChecksumSHA256 (the upload declared SHA256); SeaweedFS does not, so a relay adds it
    to ListParts: part 1's right, part 2's wrong. Resuming keeps part 1 and sends part 2 again although its ETag
    (the md5 of what it holds) matches the file: the checksum, where listed, is what decides."""
    import http.client
    import subprocess
    import sys

    from tests.integration.test_sync_s3 import KILL_AT_PART_3

    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(25 * MiB + 7)  # 6 parts of 5 MiB
    (src / "big.bin").write_bytes(big)
    url = f"s3://{bucket}/mp"
    p = subprocess.run([sys.executable, "-c", KILL_AT_PART_3, str(src), url], cwd=repo_root, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 17, p.stderr  # parts 1 and 2 are in S3
    sums = {"1": base64.b64encode(hashlib.sha256(big[:5 * MiB]).digest()).decode(),
            "2": base64.b64encode(hashlib.sha256(b"not part 2").digest()).decode()}
    upstream = weed_env.endpoint.removeprefix("http://")

    def list_parts_with_checksums(h: Any, body: bytes | None, data: bytes) -> bool:
        if data or h.command != "GET" or "uploadId=" not in h.path:
            return False
        c = http.client.HTTPConnection(upstream, timeout=30)
        c.request("GET", h.path, headers=dict(h.headers.items()))
        r = c.getresponse()
        xml = re.sub(rb"<PartNumber>(\d+)</PartNumber>", lambda m: m.group(0) + b"<ChecksumSHA256>"
                     + sums[m.group(1).decode()].encode() + b"</ChecksumSHA256>", r.read())
        c.close()
        answer(h, r.status, xml, Content_Type="application/xml")
        return True

    sent: list[str] = []
    relay = _Relay(upstream, list_parts_with_checksums)
    try:
        e = {**os.environ, "AWS_ENDPOINT_URL": relay.endpoint}
        client = lambda: S3Wire(settings=resolve_settings(env=e), on_request=lambda method, target: sent.append(  # noqa: E731
            target.split("partNumber=")[1].split("&")[0]) if method == "PUT" and "partNumber=" in target else None)
        assert sync(str(src), url, client_factory=client, multipart_threshold=5 * MiB, part_size=5 * MiB).uploaded == 1
    finally:
        relay.close()
    assert sorted(sent, key=int) == ["2", "3", "4", "5", "6"]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert s3.get_object(Bucket=bucket, Key="mp/big.bin")["Body"].read() == big
