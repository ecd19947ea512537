"""A lean S3 REST client for the sync engine: Signature V4 over ``http.client``, stdlib only.

Why not boto3 for the data path: botocore spends ~3 ms of CPU per request (event hooks, endpoint rules,
serializers, parsers) and ~0.35 s to import and build a client. For 1,000 small files that is the whole
cost of a sync on a real S3 endpoint, and of a no-change re-sync. The engine needs six calls (list, head,
put, get, multipart, delete); each is a few lines of HTTP here.

What stays botocore's: anything this module does not model. Credentials are taken from the environment
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``) or from static keys of the
profile in the shared credentials / config files; every other source (SSO, assume-role, web identity,
``credential_process``, container and instance roles: what a node uses) is resolved by botocore's own
chain, imported only then, refreshed as botocore refreshes it. The endpoint is ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL`` / the profile's ``endpoint_url`` (path-style addressing, as S3-compatible servers
want) or ``https://s3.<region>.amazonaws.com`` (virtual-hosted where the bucket name allows); a profile
with settings we do not model (``services``, FIPS / dual-stack / accelerate, an ``s3`` section) gets the
URL botocore itself would use, read off a presigned URL. A bucket in another region is followed through
the ``x-amz-bucket-region`` header, as botocore's redirector does.

Integrity: every body is signed by its sha256 (``x-amz-content-sha256``, which S3 checks); object and part
bodies also carry that same sha256 as the flexible checksum ``x-amz-checksum-sha256`` (checked and stored), and
a multipart upload's composite checksum (:func:`composite_sha256`) is compared with the one S3 answers.
Retries: 5 attempts with jittered exponential backoff on 5xx and broken connections; throttling (429,
503, ``SlowDown``) backs off longer (0.5 s doubling, at most 20 s, or the server's ``Retry-After``), so a
storm costs at most ~25 s per request before it fails; a body is re-sent from its bytes, never from a
half-read stream. A clock that is off (``RequestTimeTooSkewed``) is corrected from the server's
``ServerTime`` / ``Date`` and the request re-signed, as botocore does. Proxies: ``HTTPS_PROXY`` /
``HTTP_PROXY`` / ``NO_PROXY``, with ``user:password@`` sent as ``Proxy-Authorization`` (on the ``CONNECT``
for https, on every absolute-URI request for plain http).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import email.utils
import hashlib
import http.client
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from gtrain.sync.httpconn import Response, ThreadConns, backoff, unreachable
from gtrain.sync.s3auth import (  # re-exported: the names callers and tests know
    Credentials,
    NoCredentials,
    Settings,
    Signer,
    _BotocoreCredentials,
    _quote,
    canonical_query,
    resolve_settings,
)

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_RETRY_STATUS = {429, 500, 502, 503, 504}
_THROTTLE_STATUS = {429, 503}
_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                   "ServiceUnavailable", "RequestThrottled"}
_RETRY_CODES = {"RequestTimeout", "InternalError", "ExpiredToken", *_THROTTLE_CODES}
_SKEW_CODES = {"RequestTimeTooSkewed", "RequestExpired", "InvalidSignatureException"}
_ATTEMPTS = 5
_UNRESERVED = "-_.~"
_USER_AGENT = "gtrain-sync"
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


class S3WireError(Exception):
    """An S3 error response (``code`` from its XML body, else the HTTP status) or a transport failure
    (``status`` 0). ``gtrain.sync.s3`` translates these into gtrain errors."""

    def __init__(self, status: int, code: str, message: str, *, bucket: str = "", key: str = "",
                 bucket_region: str | None = None) -> None:
        super().__init__(f"{code or status}: {message}")
        self.status, self.code, self.message = status, code, message
        self.bucket, self.key, self.bucket_region = bucket, key, bucket_region
        self.server_time: float | None = None  # epoch seconds the server said it is (ServerTime / Date)
        self.retry_after: float | None = None


# ---------------------------------------------------------------------------------------------- client


@dataclass
class _BucketRoute:
    scheme: str
    netloc: str
    base_path: str  # "" (virtual-hosted) or "/bucket" (path-style)
    region: str


class S3Wire:
    """One client per sync: thread-local keep-alive connections, per-bucket routes, a request log hook."""

    def __init__(self, profile: str | None = None, *, settings: Settings | None = None,
                 timeout: float = 60.0, on_request: Callable[[str, str], None] | None = None,
                 backoff: float = 1.0, fail_fast: bool = False) -> None:
        self.settings = settings or resolve_settings(profile)
        self.timeout = timeout
        self.fail_fast = fail_fast  # a refused / unanswered / unresolved endpoint fails at once, not retried
        self.backoff = backoff  # scales every retry's wait (tests of storms run it small)
        self.clock_offset = 0.0  # seconds to add to our clock when signing (corrected on RequestTimeTooSkewed)
        self.on_request = on_request
        self.signer = Signer()
        self.conns = ThreadConns(timeout, self.settings.ca_bundle)
        self._routes: dict[str, _BucketRoute] = {}
        self._routes_lock = threading.Lock()
        self._creds_source: _BotocoreCredentials | None = None
        self._botocore_client: Any = None
        if self.settings.needs_botocore_credentials:
            self._creds_source = _BotocoreCredentials(self.settings.profile)

    # -- routing

    def credentials(self) -> Credentials:
        if self._creds_source is not None:
            return self._creds_source.get()
        assert self.settings.static is not None
        return self.settings.static

    def _route(self, bucket: str) -> _BucketRoute:
        with self._routes_lock:
            r = self._routes.get(bucket)
        if r is not None:
            return r
        s = self.settings
        if s.needs_botocore_endpoint:
            r = self._botocore_route(bucket)
        elif s.endpoint_url:
            u = urllib.parse.urlsplit(s.endpoint_url)
            r = _BucketRoute(u.scheme or "https", u.netloc, f"{u.path.rstrip('/')}/{bucket}", s.region)
        else:
            r = self._aws_route(bucket, s.region)
        with self._routes_lock:
            self._routes[bucket] = r
        return r

    @staticmethod
    def _aws_route(bucket: str, region: str) -> _BucketRoute:
        host = f"s3.{region}.amazonaws.com" if not region.startswith("cn-") else f"s3.{region}.amazonaws.com.cn"
        if _DNS_BUCKET.match(bucket):  # no dots: the wildcard certificate covers it
            return _BucketRoute("https", f"{bucket}.{host}", "", region)
        return _BucketRoute("https", host, f"/{bucket}", region)

    def _botocore_route(self, bucket: str) -> _BucketRoute:
        if self._botocore_client is None:
            import botocore.session

            sess = botocore.session.Session(profile=self.settings.profile)
            self._botocore_client = sess.create_client("s3")
        c = self._botocore_client
        url = c.generate_presigned_url("list_objects_v2", Params={"Bucket": bucket}, ExpiresIn=60)
        u = urllib.parse.urlsplit(url)
        path = u.path.rstrip("/")
        region = c.meta.region_name or self.settings.region
        return _BucketRoute(u.scheme, u.netloc, path, region)

    def _reroute(self, bucket: str, region: str) -> None:
        """Follow a bucket to its own region (what botocore's S3RegionRedirector does)."""
        with self._routes_lock:
            old = self._routes.get(bucket)
            if old is None or old.region == region:
                return
            if self.settings.endpoint_url is None and not self.settings.needs_botocore_endpoint:
                self._routes[bucket] = self._aws_route(bucket, region)
            else:  # a custom endpoint keeps its host; only the signing region changes
                self._routes[bucket] = _BucketRoute(old.scheme, old.netloc, old.base_path, region)

    # -- connections

    def discard_thread_connections(self) -> None:
        """Close this thread's connections (one whose response was abandoned mid-body cannot be reused)."""
        self.conns.drop_thread()

    def close(self) -> None:
        """Close every connection, of every thread (call when no request is in flight)."""
        self.conns.close()

    # -- requests

    def request(self, method: str, bucket: str, key: str = "", *, query: dict[str, str] | None = None,
                headers: dict[str, str] | None = None, body: bytes = b"", body_sha256: str | None = None,
                stream: bool = False, ok: tuple[int, ...] = (200,)) -> Response:
        """One signed request, retried on 5xx / throttling / a broken connection; follows a bucket's region.
        ``stream``: the response body is left unread in ``Response.stream`` (the caller reads and closes)."""
        query = query or {}
        headers = {k.lower(): v for k, v in (headers or {}).items()}
        payload = body_sha256 or (hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256)
        last: S3WireError | None = None
        redirected = False
        for attempt in range(_ATTEMPTS):
            if attempt and last is not None:
                time.sleep(self._wait(attempt, last))
            route = self._route(bucket)
            path = _quote(f"{route.base_path}/{key}" if key or not route.base_path else route.base_path,
                          safe="/" + _UNRESERVED)
            if not path:
                path = "/"
            now = _dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=self.clock_offset)
            signed = self.signer.sign(self.credentials(), route.region, method, route.netloc, path, query, headers,
                                      payload, now=now)
            signed["user-agent"] = _USER_AGENT
            if body or method in ("PUT", "POST"):
                signed["content-length"] = str(len(body))
            target = path + ("?" + canonical_query(query) if query else "")
            if self.on_request is not None:
                self.on_request(method, target)
            proxy, proxy_auth = self.conns.proxy(route.scheme, route.netloc)
            if proxy is not None and route.scheme == "http":  # not signed: the proxy takes it off
                target = f"http://{route.netloc}{target}"
                if proxy_auth:
                    signed["proxy-authorization"] = proxy_auth
            conn = self.conns.get(route.scheme, route.netloc)
            try:
                conn.request(method, target, body=body or None, headers=signed)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                self.conns.drop(route.scheme, route.netloc)
                if proxy is not None and " 407" in str(e):  # the CONNECT was refused for want of credentials
                    raise _proxy_auth_error(proxy, bucket, key) from e
                last = S3WireError(0, type(e).__name__, f"{route.scheme}://{route.netloc}: {e}", bucket=bucket,
                                   key=key)
                if self.fail_fast and unreachable(e):
                    raise last from e
                continue
            rheaders = {k.lower(): v for k, v in resp.getheaders()}
            if resp.status in ok:
                if stream and method != "HEAD":
                    return Response(resp.status, rheaders, stream=resp)
                try:
                    data = resp.read()  # all of it, or IncompleteRead: a body cut short is sent for again
                except (OSError, http.client.HTTPException) as e:
                    self.conns.drop(route.scheme, route.netloc)
                    last = S3WireError(0, type(e).__name__, f"{route.scheme}://{route.netloc}: the answer broke "
                                                            f"off: {e}", bucket=bucket, key=key)
                    continue
                if resp.will_close:
                    self.conns.drop(route.scheme, route.netloc)
                return Response(resp.status, rheaders, data)
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                data = b""
            if resp.will_close:
                self.conns.drop(route.scheme, route.netloc)
            if resp.status == 407 and proxy is not None:
                raise _proxy_auth_error(proxy, bucket, key)
            err = _error(resp.status, rheaders, data, bucket, key)
            if err.bucket_region and err.bucket_region != route.region and not redirected:
                redirected = True
                self._reroute(bucket, err.bucket_region)
                continue
            if err.code in _SKEW_CODES and self._correct_clock(err, now):
                last = None  # re-signed at once with the server's time
                continue
            if resp.status in _RETRY_STATUS or err.code in _RETRY_CODES:
                last = err
                continue
            raise err
        assert last is not None
        raise last

    def _correct_clock(self, err: S3WireError, signed_at: _dt.datetime) -> bool:
        """Take the server's clock where ours is off by more than a minute from it; False: nothing to correct."""
        if err.server_time is None:
            return False
        skew = err.server_time - signed_at.timestamp()
        if abs(skew) < 60:
            return False
        self.clock_offset += skew
        return True

    def _wait(self, attempt: int, err: S3WireError) -> float:
        throttled = err.status in _THROTTLE_STATUS or err.code in _THROTTLE_CODES
        return backoff(attempt, throttled=throttled, retry_after=err.retry_after, scale=self.backoff)


def _proxy_auth_error(proxy: str, bucket: str, key: str) -> S3WireError:
    return S3WireError(407, "ProxyAuthenticationRequired",
                       f"the proxy {proxy} asks for credentials (407): put them in the proxy URL "
                       "(HTTPS_PROXY=http://USER:PASSWORD@host:port) or set NO_PROXY for this endpoint",
                       bucket=bucket, key=key)


def _error(status: int, headers: dict[str, str], body: bytes, bucket: str, key: str) -> S3WireError:
    code, message, region, server_time = "", "", headers.get("x-amz-bucket-region"), ""
    if body:
        try:
            root = parse_xml(body)
            server_time = (root.findtext("ServerTime") or "").strip()
            code = (root.findtext("Code") or "").strip()
            message = (root.findtext("Message") or "").strip()
            region = region or root.findtext("Region") or None
        except ElementTree.ParseError:
            message = body[:200].decode("utf-8", "replace")
    if not code:
        code = {301: "PermanentRedirect", 304: "NotModified", 400: "BadRequest", 403: "AccessDenied",
                404: "NotFound", 412: "PreconditionFailed"}.get(status, str(status))
    err = S3WireError(status, code, message or http.client.responses.get(status, ""), bucket=bucket, key=key,
                      bucket_region=region)
    if server_time:
        try:
            err.server_time = _dt.datetime.fromisoformat(server_time.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    if err.server_time is None and headers.get("date"):
        with contextlib.suppress(TypeError, ValueError):
            err.server_time = email.utils.parsedate_to_datetime(headers["date"]).timestamp()
    with contextlib.suppress(ValueError):
        err.retry_after = float(headers["retry-after"]) if "retry-after" in headers else None
    return err


# ---------------------------------------------------------------------------------------------- S3 calls


@dataclass(frozen=True)
class Listed:
    key: str
    size: int
    etag: str


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def md5_b64(data: bytes) -> str:
    return b64(hashlib.md5(data, usedforsecurity=False).digest())


def list_objects(wire: S3Wire, bucket: str, prefix: str) -> Iterator[Listed]:
    """ListObjectsV2, every page, keys URL-encoded on the wire (XML cannot carry every byte a key can)."""
    token: str | None = None
    while True:
        q = {"list-type": "2", "encoding-type": "url"}
        if prefix:
            q["prefix"] = prefix
        if token:
            q["continuation-token"] = token
        r = wire.request("GET", bucket, query=q)
        root = parse_xml(r.body)
        if root.tag != "ListBucketResult":
            raise S3WireError(r.status, "MalformedResponse", f"ListObjectsV2 answered <{root.tag}>", bucket=bucket)
        for c in root.iter("Contents"):
            yield Listed(urllib.parse.unquote_plus(c.findtext("Key") or ""), int(c.findtext("Size") or 0),
                         (c.findtext("ETag") or "").strip('"'))
        if (root.findtext("IsTruncated") or "").lower() != "true":
            return
        token = root.findtext("NextContinuationToken")
        if not token:
            return


def composite_sha256(part_sha256s: list[bytes]) -> str:
    """S3's composite checksum of a multipart upload made with ``SHA256``: base64(sha256 of the parts' raw
    sha256 digests, in order) + ``-N`` (what CompleteMultipartUpload answers as ``ChecksumSHA256``)."""
    return f"{b64(hashlib.sha256(b''.join(part_sha256s)).digest())}-{len(part_sha256s)}"


def complete_xml(etags: list[str], sha256s: list[str] | None = None) -> bytes:
    """``sha256s``: each part's base64 sha256 (the parts were sent with ``x-amz-checksum-sha256``)."""
    sums = sha256s or [""] * len(etags)
    parts = "".join(f"<Part><PartNumber>{i}</PartNumber><ETag>\"{e}\"</ETag>"
                    + (f"<ChecksumSHA256>{c}</ChecksumSHA256>" if c else "") + "</Part>"
                    for i, (e, c) in enumerate(zip(etags, sums, strict=True), 1))
    return f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()


def delete_xml(keys: list[str]) -> bytes:
    from xml.sax.saxutils import escape

    objs = "".join(f"<Object><Key>{escape(k)}</Key></Object>" for k in keys)
    return f"<Delete><Quiet>true</Quiet>{objs}</Delete>".encode()


def parse_xml(body: bytes) -> ElementTree.Element:
    """The document with namespaces dropped from tag names (as botocore's parser does: S3-compatible
    servers do not all use S3's namespace, and some use none)."""
    root = ElementTree.fromstring(body)
    for el in root.iter():
        if isinstance(el.tag, str) and "}" in el.tag:
            el.tag = el.tag.rpartition("}")[2]
    return root


def file_part(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise OSError(f"{path}: expected {length} bytes at offset {offset}, read {len(data)} (file shrank?)")
    return data


__all__ = ["EMPTY_SHA256", "Credentials", "Listed", "NoCredentials", "Response", "S3Wire", "S3WireError", "Settings",
           "Signer", "b64", "canonical_query", "complete_xml", "composite_sha256", "delete_xml", "file_part",
           "list_objects", "md5_b64", "parse_xml", "resolve_settings"]
