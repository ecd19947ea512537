"""The HTTP plumbing the stdlib wire clients share (``s3wire``, ``azwire``): keep-alive ``http.client``
connections per thread, proxies from the environment (with their credentials), and retry back-off.
Stdlib only (it runs on nodes too)."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gtrain.sync.model import Digests

if TYPE_CHECKING:
    import ssl

THROTTLE_BASE_S, THROTTLE_CAP_S = 0.5, 20.0
RETRY_BASE_S, RETRY_CAP_S = 0.1, 5.0
_READ_CHUNK = 1 << 20


@dataclass
class Response:
    """A wire client's answer: the whole body, or (``stream=True``) the open response to read it from."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: http.client.HTTPResponse | None = field(default=None, repr=False)


def proxy_for(scheme: str, netloc: str) -> tuple[str | None, str | None]:
    """(proxy host:port, ``Proxy-Authorization`` value or None) for a request to ``scheme://netloc`` as
    ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` say; (None, None): go direct."""
    if not any(k[-6:].lower() == "_proxy" for k in os.environ):  # all getproxies_environment reads: none set
        return None, None
    import urllib.parse
    import urllib.request  # here: with no proxy in the environment a sync need not import it (~3 ms)

    proxies = urllib.request.getproxies_environment()
    host_only = netloc.rsplit(":", 1)[0] if not netloc.endswith("]") else netloc
    if not proxies.get(scheme) or urllib.request.proxy_bypass(host_only):
        return None, None
    raw = proxies[scheme] if "://" in proxies[scheme] else f"http://{proxies[scheme]}"
    u = urllib.parse.urlsplit(raw)
    auth = None
    if u.username is not None:
        pair = f"{urllib.parse.unquote(u.username)}:{urllib.parse.unquote(u.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode()).decode()
    return u.netloc.rpartition("@")[2], auth


def unreachable(e: BaseException) -> bool:
    """Whether a transport error says the endpoint cannot be had now (refused, no answer within the timeout, a
    host name that does not resolve): what a caller that must not wait (``fail_fast``) gives up on at once."""
    import socket

    return isinstance(e, ConnectionRefusedError | TimeoutError | socket.gaierror)


def backoff(attempt: int, *, throttled: bool, retry_after: float | None = None, scale: float = 1.0) -> float:
    """Seconds to wait before retry ``attempt`` (1 = the first retry): jittered doubling, longer for
    throttling (429 / 503 / SlowDown / ServerBusy), at least the server's ``Retry-After`` (capped)."""
    base, cap = (THROTTLE_BASE_S, THROTTLE_CAP_S) if throttled else (RETRY_BASE_S, RETRY_CAP_S)
    wait = min(cap, base * 2 ** (attempt - 1)) * (0.5 + random.random())
    if retry_after is not None:
        wait = max(wait, min(cap, retry_after))
    return wait * scale


class ThreadConns:
    """Kept-alive connections, one per (scheme, host) per thread, through the environment's proxy where it
    names one (a CONNECT tunnel with its credentials for https; plain http goes to the proxy itself, and the
    caller sends absolute-URI requests with :meth:`proxy`'s ``Proxy-Authorization``)."""

    def __init__(self, timeout: float, ca_bundle: str | None) -> None:
        self.timeout, self.ca_bundle = timeout, ca_bundle
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: set[http.client.HTTPConnection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._proxies: dict[tuple[str, str], tuple[str | None, str | None]] = {}

    def proxy(self, scheme: str, netloc: str) -> tuple[str | None, str | None]:
        got = self._proxies.get((scheme, netloc))
        if got is None:
            got = self._proxies[(scheme, netloc)] = proxy_for(scheme, netloc)
        return got

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import ssl  # here: plain-http endpoints and a no-change re-sync need not import it

            self._ssl = ssl.create_default_context(cafile=self.ca_bundle)
        return self._ssl

    def get(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        c = pool.get((scheme, netloc))
        if c is None:
            proxy, auth = self.proxy(scheme, netloc)
            target = proxy or netloc
            if scheme == "https":
                c = http.client.HTTPSConnection(target, timeout=self.timeout, context=self._context())
                if proxy is not None:  # a CONNECT tunnel, the proxy's credentials on it
                    c.set_tunnel(netloc, headers={"Proxy-Authorization": auth} if auth else None)
            else:
                c = http.client.HTTPConnection(target, timeout=self.timeout)
            pool[(scheme, netloc)] = c
            with self._lock:
                self._all.add(c)
        return c

    def drop(self, scheme: str, netloc: str) -> None:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        c = pool.pop((scheme, netloc), None)
        if c is not None:
            c.close()
            with self._lock:
                self._all.discard(c)

    def drop_thread(self) -> None:
        """Close this thread's connections (one whose response was abandoned mid-body cannot be reused)."""
        for scheme, netloc in list(self._local.__dict__.get("pool", {})):
            self.drop(scheme, netloc)

    def close(self) -> None:
        """Close every connection, of every thread (call when no request is in flight)."""
        with self._lock:
            conns, self._all = self._all, set()
        for c in conns:
            c.close()
        self._local = threading.local()


def body_to_file(r: Response, dest: Path, progress: Callable[[int], None], *, want_md5: bool,
                 broken: Callable[[str], Exception], discard: Callable[[], None]) -> Digests:
    """A streamed GET's body (``r.stream``) written into ``dest`` and hashed as it arrives (sha256, and md5 if
    ``want_md5``). A body that breaks or ends short of its ``content-length`` is taken back from ``progress``,
    its connection ``discard``-ed and raised as ``broken(why)`` (the caller fetches it again); a write to our own
    file that fails is raised as it is. The stream is closed either way."""
    stream = r.stream
    assert stream is not None
    length = int(r.headers.get("content-length", -1))
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False) if want_md5 else None
    got = 0
    try:
        with open(dest, "wb") as f:
            while chunk := stream.read(_READ_CHUNK):
                f.write(chunk)
                sha.update(chunk)
                if md5 is not None:
                    md5.update(chunk)
                got += len(chunk)
                progress(len(chunk))
        if length >= 0 and got != length:  # http.client's read(n) ends quietly when the server closes early
            raise http.client.IncompleteRead(b"", length - got)
    except (OSError, ValueError, http.client.HTTPException) as e:
        discard()  # the rest of the body is still on that connection
        if isinstance(e, OSError) and e.filename is not None:  # our file, not the network
            raise
        progress(-got)
        raise broken(f"download broke ({type(e).__name__}): {e}") from e
    finally:
        stream.close()
    return Digests(sha.hexdigest(), md5.hexdigest() if md5 is not None else "")
