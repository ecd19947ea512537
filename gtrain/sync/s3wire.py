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

Integrity: every body is signed by its sha256 (``x-amz-content-sha256``, which S3 checks) and carries
``Content-MD5`` (checked too); a multipart upload's final ETag is compared with the md5 of its parts' md5s.
Retries: 5 attempts with jittered exponential backoff on 5xx, throttling and broken connections; a body
is re-sent from its bytes, never from a half-read stream.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
import http.client
import random
import re
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from gtrain.sync.s3creds import Credentials, Settings, _BotocoreCredentials, resolve_settings
from gtrain.sync.s3creds import NoCredentials as NoCredentials  # re-exported: gtrain.sync.s3 catches it

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_RETRY_STATUS = {500, 502, 503, 504}
_RETRY_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "RequestTimeTooSkewed",
                "ExpiredToken", "Throttling", "ThrottlingException"}
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


# ---------------------------------------------------------------------------------------------- signing


def _quote(s: str, safe: str = _UNRESERVED) -> str:
    return urllib.parse.quote(s, safe=safe)


def canonical_query(query: dict[str, str]) -> str:
    return "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))


class Signer:
    """AWS Signature Version 4 for S3 (payload signed by its sha256, path not double-encoded)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str, str], bytes] = {}
        self._lock = threading.Lock()

    def _key(self, secret: str, date: str, region: str) -> bytes:
        k = (secret, date, region)
        with self._lock:
            got = self._keys.get(k)
        if got is None:
            got = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
            for part in (region, "s3", "aws4_request"):
                got = hmac.new(got, part.encode(), hashlib.sha256).digest()
            with self._lock:
                self._keys[k] = got
        return got

    def sign(self, creds: Credentials, region: str, method: str, host: str, path: str, query: dict[str, str],
             headers: dict[str, str], payload_sha256: str, now: _dt.datetime | None = None) -> dict[str, str]:
        """``headers`` (lower-case names) plus host, x-amz-date, x-amz-content-sha256, the session token and
        Authorization. ``path`` is already percent-encoded."""
        now = now or _dt.datetime.now(_dt.UTC)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        out = dict(headers)
        out["host"] = host
        out["x-amz-date"] = amz_date
        out["x-amz-content-sha256"] = payload_sha256
        if creds.token:
            out["x-amz-security-token"] = creds.token
        names = sorted(out)
        canonical_headers = "".join(f"{n}:{' '.join(str(out[n]).split())}\n" for n in names)
        signed = ";".join(names)
        creq = "\n".join([method, path, canonical_query(query), canonical_headers, signed, payload_sha256])
        scope = f"{date}/{region}/s3/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
        sig = hmac.new(self._key(creds.secret_key, date, region), sts.encode(), hashlib.sha256).hexdigest()
        out["authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
                                f"SignedHeaders={signed}, Signature={sig}")
        return out


# ---------------------------------------------------------------------------------------------- client


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: http.client.HTTPResponse | None = field(default=None, repr=False)


@dataclass
class _BucketRoute:
    scheme: str
    netloc: str
    base_path: str  # "" (virtual-hosted) or "/bucket" (path-style)
    region: str


class S3Wire:
    """One client per sync: thread-local keep-alive connections, per-bucket routes, a request log hook."""

    def __init__(self, profile: str | None = None, *, settings: Settings | None = None,
                 timeout: float = 60.0, on_request: Callable[[str, str], None] | None = None) -> None:
        self.settings = settings or resolve_settings(profile)
        self.timeout = timeout
        self.on_request = on_request
        self.signer = Signer()
        self._local = threading.local()
        self._routes: dict[str, _BucketRoute] = {}
        self._routes_lock = threading.Lock()
        self._creds_source: _BotocoreCredentials | None = None
        self._ssl: ssl.SSLContext | None = None
        self._botocore_client: Any = None
        self._all_conns: set[http.client.HTTPConnection] = set()
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

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self.settings.ca_bundle)
        return self._ssl

    def _conn(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        c = pool.get((scheme, netloc))
        if c is None:
            proxy = None
            proxies = urllib.request.getproxies_environment()
            host_only = netloc.rsplit(":", 1)[0] if not netloc.endswith("]") else netloc
            if proxies.get(scheme) and not urllib.request.proxy_bypass(host_only):
                proxy = urllib.parse.urlsplit(proxies[scheme])
            target = proxy.netloc if proxy is not None else netloc
            if scheme == "https":
                c = http.client.HTTPSConnection(target, timeout=self.timeout, context=self._context())
            else:
                c = http.client.HTTPConnection(target, timeout=self.timeout)
            if proxy is not None:
                c.set_tunnel(netloc)
            pool[(scheme, netloc)] = c
            with self._routes_lock:
                self._all_conns.add(c)
        return c

    def _drop(self, scheme: str, netloc: str) -> None:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        c = pool.pop((scheme, netloc), None)
        if c is not None:
            c.close()
            with self._routes_lock:
                self._all_conns.discard(c)

    def discard_thread_connections(self) -> None:
        """Close this thread's connections (one whose response was abandoned mid-body cannot be reused)."""
        for scheme, netloc in list(self._local.__dict__.get("pool", {})):
            self._drop(scheme, netloc)

    def close(self) -> None:
        """Close every connection, of every thread (call when no request is in flight)."""
        with self._routes_lock:
            conns, self._all_conns = self._all_conns, set()
        for c in conns:
            c.close()
        self._local = threading.local()

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
            if attempt:
                time.sleep(min(5.0, 0.1 * 2 ** attempt) * (0.5 + random.random()))
            route = self._route(bucket)
            path = _quote(f"{route.base_path}/{key}" if key or not route.base_path else route.base_path,
                          safe="/" + _UNRESERVED)
            if not path:
                path = "/"
            signed = self.signer.sign(self.credentials(), route.region, method, route.netloc, path, query, headers,
                                      payload)
            signed["user-agent"] = _USER_AGENT
            if body or method in ("PUT", "POST"):
                signed["content-length"] = str(len(body))
            target = path + ("?" + canonical_query(query) if query else "")
            if self.on_request is not None:
                self.on_request(method, target)
            conn = self._conn(route.scheme, route.netloc)
            try:
                conn.request(method, target, body=body or None, headers=signed)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                self._drop(route.scheme, route.netloc)
                last = S3WireError(0, type(e).__name__, f"{route.scheme}://{route.netloc}: {e}", bucket=bucket,
                                   key=key)
                continue
            rheaders = {k.lower(): v for k, v in resp.getheaders()}
            if resp.status in ok:
                if stream and method != "HEAD":
                    return Response(resp.status, rheaders, stream=resp)
                try:
                    data = resp.read()  # all of it, or IncompleteRead: a body cut short is sent for again
                except (OSError, http.client.HTTPException) as e:
                    self._drop(route.scheme, route.netloc)
                    last = S3WireError(0, type(e).__name__, f"{route.scheme}://{route.netloc}: the answer broke "
                                                            f"off: {e}", bucket=bucket, key=key)
                    continue
                if resp.will_close:
                    self._drop(route.scheme, route.netloc)
                return Response(resp.status, rheaders, data)
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                data = b""
            if resp.will_close:
                self._drop(route.scheme, route.netloc)
            err = _error(resp.status, rheaders, data, bucket, key)
            if err.bucket_region and err.bucket_region != route.region and not redirected:
                redirected = True
                self._reroute(bucket, err.bucket_region)
                continue
            if resp.status in _RETRY_STATUS or err.code in _RETRY_CODES:
                last = err
                continue
            raise err
        assert last is not None
        raise last


def _error(status: int, headers: dict[str, str], body: bytes, bucket: str, key: str) -> S3WireError:
    code, message, region = "", "", headers.get("x-amz-bucket-region")
    if body:
        try:
            root = parse_xml(body)
            code = (root.findtext("Code") or "").strip()
            message = (root.findtext("Message") or "").strip()
            region = region or root.findtext("Region") or None
        except ElementTree.ParseError:
            message = body[:200].decode("utf-8", "replace")
    if not code:
        code = {301: "PermanentRedirect", 304: "NotModified", 400: "BadRequest", 403: "AccessDenied",
                404: "NotFound", 412: "PreconditionFailed"}.get(status, str(status))
    return S3WireError(status, code, message or http.client.responses.get(status, ""), bucket=bucket, key=key,
                       bucket_region=region)


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
            yield Listed(urllib.parse.unquote(c.findtext("Key") or ""), int(c.findtext("Size") or 0),
                         (c.findtext("ETag") or "").strip('"'))
        if (root.findtext("IsTruncated") or "").lower() != "true":
            return
        token = root.findtext("NextContinuationToken")
        if not token:
            return


def multipart_etag(part_md5s: list[bytes]) -> str:
    return f"{hashlib.md5(b''.join(part_md5s), usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def complete_xml(etags: list[str]) -> bytes:
    parts = "".join(f"<Part><PartNumber>{i}</PartNumber><ETag>\"{e}\"</ETag></Part>"
                    for i, e in enumerate(etags, 1))
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
