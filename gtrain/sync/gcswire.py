"""The HTTP side of the GCS backend: JSON-API requests on a urllib3 pool of our own, public APIs only.

:class:`Wire` sends requests to the JSON API (:func:`default_endpoint`, or a client's ``api_endpoint``) through
google-auth's ``AuthorizedHttp`` (its credentials applied, refreshed on a 401) over a ``urllib3.PoolManager`` sized
for the sync's workers, with the TLS settings requests would use (``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE``, else
certifi's bundle; mutual TLS through google-auth's ``configure_mtls_channel`` where
``GOOGLE_API_USE_CLIENT_CERTIFICATE=true``) and the environment's proxy (``HTTPS_PROXY`` / ``NO_PROXY``,
credentials in the URL). The credentials are google-auth's defaults, as a default ``storage.Client`` picks them
(anonymous under ``STORAGE_EMULATOR_HOST``), or those the backend is given. Connection trouble, 408, 429 and 5xx
are retried with backoff; error statuses raise google.api_core exceptions (``gtrain.sync.gcs`` translates those).
Relied on (bounds in pyproject): ``AuthorizedHttp`` / ``google.auth.default`` (google-auth 2), ``PoolManager`` /
``ProxyManager`` / ``HTTPResponse.stream`` (urllib3 2).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlencode, urlsplit

READ_CHUNK = 1024 * 1024  # download stream reads
TIMEOUT = (60.0, 60.0)  # connect, read (the library's default is 60 s)
ATTEMPTS = 6  # tries of one request; backoff 1, 2, 4, 8, 16 s (+ jitter) between them
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)


class Response:
    """What :class:`Wire` hands a ``consume`` callback: status, headers (looked up by lower-case name), the
    body as an iterable of ``bytes`` chunks."""

    def __init__(self, status: int, headers: Any, chunks: Callable[[], Iterable[bytes]]) -> None:
        self.status, self.headers, self._chunks = status, headers, chunks

    def chunks(self) -> Iterable[bytes]:
        return self._chunks()

    def read(self) -> bytes:
        return b"".join(self.chunks())


class Transient(Exception):
    """A try that failed in a way worth another (connection trouble, 408/429/5xx); ``err`` is what to raise
    once the tries are spent."""

    def __init__(self, err: Exception) -> None:
        super().__init__(str(err))
        self.err = err


class Broken(Exception):
    """The connection failed or the response broke off (kept apart from local file OSErrors)."""


DEFAULT_ENDPOINT = "https://storage.googleapis.com"
MTLS_ENDPOINT = "https://storage.mtls.googleapis.com"


def default_endpoint() -> str:
    """The JSON API's base URL as google-cloud-storage's ``Client`` picks it (client.py: the emulator's
    ``STORAGE_EMULATOR_HOST``, then ``API_ENDPOINT_OVERRIDE``, else storage.googleapis.com), without importing
    it (0.3 s: more than a no-change re-sync takes)."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        return emulator if "://" in emulator else f"http://{emulator}"
    return os.environ.get("API_ENDPOINT_OVERRIDE") or DEFAULT_ENDPOINT


def default_credentials() -> Any:
    """What a default ``storage.Client()`` would use: anonymous under the emulator, else google-auth's ADC."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth

    creds, _ = google.auth.default(scopes=list(_SCOPES))
    return creds


def _pool(base: str, maxsize: int, timeout: tuple[float, float] = TIMEOUT) -> Any:
    import urllib3

    from gtrain.sync.httpconn import proxy_for

    ca = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if not ca:
        try:
            import certifi

            ca = certifi.where()
        except ImportError:
            ca = None
    kw: dict[str, Any] = {"maxsize": maxsize, "block": False, "retries": False,
                          "timeout": urllib3.Timeout(connect=timeout[0], read=timeout[1])}
    if ca:
        kw["ca_certs"] = ca
    u = urlsplit(base)
    proxy, auth = proxy_for(u.scheme or "https", u.netloc)
    if proxy is not None:
        return urllib3.ProxyManager(f"http://{proxy}", proxy_headers={"Proxy-Authorization": auth} if auth else None,
                                    **kw)
    return urllib3.PoolManager(**kw)


class Wire:
    """JSON-API requests with less per-request work than ``Blob``: one ``AuthorizedHttp.urlopen`` each, the
    body streamed in 1 MiB chunks. Only conditional or read-only requests come here, so every try may be
    retried."""

    def __init__(self, base: str | None = None, *, credentials: Any = None, maxsize: int = 20,
                 timeout: tuple[float, float] = TIMEOUT, fail_fast: bool = False) -> None:
        from google.auth.transport.urllib3 import AuthorizedHttp

        self.fail_fast = fail_fast  # a refused / unanswered / unresolved endpoint fails at once, not retried
        self.base = (base or default_endpoint()).rstrip("/")
        self.headers: dict[str, str] = {"User-Agent": "gtrain"}
        self.creds = credentials if credentials is not None else default_credentials()
        mtls = base is None and os.environ.get("GOOGLE_API_USE_CLIENT_CERTIFICATE", "").lower() == "true"
        if mtls and self.base == DEFAULT_ENDPOINT:
            self.base = MTLS_ENDPOINT  # where the default client certificate is asked for, as the library does
        self.http = AuthorizedHttp(self.creds, http=_pool(self.base, maxsize, timeout))
        if mtls:
            self.http.configure_mtls_channel()  # the default client certificate, as the library would
        parts = urlsplit(self.base)
        self.origin = f"{parts.scheme}://{parts.netloc}"

    def close(self) -> None:
        self.http.http.clear()

    def url(self, path: str, query: dict[str, str]) -> str:
        return f"{self.base}{path}?{urlencode(query)}"

    def call(self, method: str, url: str, *, body: bytes | Iterable[bytes] | None = None,
             headers: dict[str, str] | None = None, consume: Callable[[Response], Any],
             attempts: int = ATTEMPTS, allow: tuple[int, ...] = ()) -> Any:
        """Send until a try is not transient and return what ``consume`` made of the response (2xx, or a
        status in ``allow``); a connection error while it reads retries the try; an error status is
        raised as the google.api_core exception for it (``Transient`` where ``attempts`` ran out on a
        transient one and the caller retries on its own: ``attempts=1``)."""
        delay = 1.0
        for attempt in range(1, attempts + 1):
            try:
                return self._once(method, url, body, headers, consume, allow)
            except Transient as e:
                if attempt == attempts:
                    if attempts == 1:
                        raise
                    if isinstance(e.err, OSError | Broken):  # the network's (not a local file's): "cannot reach"
                        raise Broken(str(e.err)) from e.err
                    raise e.err from None
            time.sleep(delay * (1 + random.random() / 2))
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def call_json(self, method: str, url: str, *, body: bytes | None = None,
                  headers: dict[str, str] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = self.call(method, url, body=body, headers=headers,
                                        consume=lambda resp: json.loads(resp.read()))
        return out

    def _once(self, method: str, url: str, body: bytes | Iterable[bytes] | None, headers: dict[str, str] | None,
              consume: Callable[[Response], Any], allow: tuple[int, ...]) -> Any:
        import urllib3

        h = {**self.headers, **(headers or {})}
        if body is not None and not any(k.lower() == "content-length" for k in h):
            h["Content-Length"] = str(len(body))  # type: ignore[arg-type]  # bytes, or _FileChunks (has __len__)
        try:
            rr = self.http.urlopen(method, url, body=body, headers=h, preload_content=False, redirect=False,
                                   retries=False, decode_content=False)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            if self.fail_fast and isinstance(e, urllib3.exceptions.TimeoutError | OSError):  # refused, no answer,
                raise Broken(f"{self.origin}: {e}") from e  # no such host (urllib3's are TimeoutErrors): no retry
            raise Transient(Broken(f"{self.origin}: {e}")) from e
        resp = Response(rr.status, rr.headers, lambda: rr.stream(READ_CHUNK, decode_content=False))
        ok = False
        try:
            if resp.status >= 300 and resp.status not in allow:
                raise status_error(method, url, resp)
            try:
                out = consume(resp)
            except urllib3.exceptions.HTTPError as e:  # the body broke off
                raise Transient(Broken(f"{self.origin}: the answer broke off: {e}")) from e
            ok = True
            return out
        finally:
            if ok and rr.isclosed() is False and rr.length_remaining:
                ok = False
            if ok:
                rr.release_conn()
            else:  # a connection with unread bytes must not go back to the pool
                rr.close()


def status_error(method: str, url: str, resp: Response) -> Exception:
    """The google.api_core exception for an error status, wrapped for :meth:`Wire.call` where it calls for
    another try (a 401 was already answered by one credentials refresh in ``AuthorizedHttp``)."""
    from google.api_core import exceptions as gx

    try:
        raw = resp.read()
    except Exception:  # noqa: BLE001 - the status alone says enough
        raw = b""
    try:
        message = str(json.loads(raw)["error"]["message"])
    except Exception:  # noqa: BLE001 - not a JSON error body
        message = raw.decode(errors="replace")[:200].strip() or "(no body)"
    err = gx.from_http_status(resp.status, f"{method} {url.partition('?')[0]}: {message}")
    if resp.status in RETRY_STATUSES:
        return Transient(err)
    return err
