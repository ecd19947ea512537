"""The HTTP side of the GCS backend: JSON-API requests over kept-alive HTTP/1.1 connections.

:class:`Wire` sends requests to the client's API base URL with the client's credentials (refreshed once on a
401), retrying connection trouble, 408, 429 and 5xx with backoff, and raising google.api_core exceptions for
error statuses (``gtrain.sync.gcs`` translates those). Where the client's session is a plain
``requests.Session`` / ``AuthorizedSession`` (no hooks, auth or proxy), it talks over :class:`Conn`: a socket
opened by the urllib3 pool that session would use (its TLS context, CA bundle, client certificate), with our
own request writing and response framing (``http.client`` parses headers with the ``email`` package: most of
the CPU per small file); otherwise through ``session.request`` as it is.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

READ_CHUNK = 1024 * 1024  # download stream reads
TIMEOUT = (60.0, 60.0)  # connect, read (the library's default is 60 s)
ATTEMPTS = 6  # tries of one request; backoff 1, 2, 4, 8, 16 s (+ jitter) between them
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


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


class Unauthorized(Exception):
    """A 401: the credentials get one refresh."""

    def __init__(self, err: Exception) -> None:
        super().__init__(str(err))
        self.err = err


class Broken(Exception):
    """The connection failed or the server broke HTTP/1.1 framing (kept apart from local file OSErrors)."""


class Stale(Broken):
    """A kept-alive connection the server had closed: nothing of the response arrived; safe to send again."""


class Conn:
    """One kept-alive HTTP/1.1 connection: the socket urllib3 opens for the pool ``session.request`` would
    use (its TLS context, CA bundle, client certificate, socket options), with our own request writing and
    response framing on top (``http.client`` parses headers with the ``email`` package: a large part of
    the CPU per small file)."""

    __slots__ = ("conn", "sock", "buf", "used", "got", "waitall")

    def __init__(self, pool: Any) -> None:
        conn = pool._new_conn()
        conn.timeout = TIMEOUT[0]
        conn.connect()
        self.conn, self.sock = conn, conn.sock
        self.waitall = 0
        try:
            if isinstance(self.sock, ssl.SSLSocket):
                raise ValueError("TLS: the ssl module's own timeout handling")
            # a blocking socket with kernel timeouts: no poll() before every send and recv (Python's timeout
            # mode), and a body read in 1 MiB pieces (MSG_WAITALL) rather than in whatever has arrived
            tv = struct.pack("ll", int(TIMEOUT[1]), 0)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            self.sock.settimeout(None)
            self.waitall = getattr(socket, "MSG_WAITALL", 0)
        except (OSError, ValueError, AttributeError, struct.error):
            self.sock.settimeout(TIMEOUT[1])
        self.buf = bytearray()  # received beyond what has been parsed
        self.used = False  # has served a response (a failure before the next one's first byte: stale)
        self.got = False  # some of the current response arrived

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    def send(self, head: bytes, body: bytes | Iterable[bytes] | None) -> None:
        self.got = False
        try:
            if body is None or isinstance(body, bytes | bytearray | memoryview):
                if body and len(body) > 65536:
                    self.sock.sendall(head)
                    self.sock.sendall(body)
                else:
                    self.sock.sendall(head + body if body else head)  # one segment for a small request
            else:
                self.sock.sendall(head)
                for chunk in body:
                    self.sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise (Stale if self.used else Broken)(f"connection lost while sending: {e}") from e
        except OSError as e:
            raise Broken(f"connection failed while sending: {e}") from e

    def _recv(self, n: int) -> bytes:
        try:
            data = self.sock.recv(n)
        except (ConnectionResetError, ConnectionAbortedError) as e:
            if self.used and not self.got:
                raise Stale(str(e)) from e
            raise Broken(f"connection lost: {e}") from e
        except OSError as e:  # a timeout among them
            raise Broken(f"connection failed: {e}") from e
        if not data:
            if self.used and not self.got:
                raise Stale("the server had closed the kept-alive connection")
            raise Broken("the server closed the connection mid-response")
        self.got = True
        return data

    def head(self) -> tuple[int, dict[str, str], bool]:
        """Status, headers (lower-case names; repeated ones joined with ", ") and whether the connection
        may serve another request, skipping 1xx interim responses."""
        buf = self.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            while end < 0:
                if len(buf) > 256 * 1024:
                    raise Broken("response headers too long")
                buf += self._recv(65536)
                end = buf.find(b"\r\n\r\n")
            lines = buf[:end].decode("latin-1").split("\r\n")
            del buf[:end + 4]
            version, _, rest = lines[0].partition(" ")
            try:
                status = int(rest[:3])
            except ValueError:
                raise Broken(f"not an HTTP response: {lines[0][:80]!r}") from None
            if not version.startswith("HTTP/"):
                raise Broken(f"not an HTTP response: {lines[0][:80]!r}")
            if 100 <= status < 200:  # 100 Continue and friends: the real response follows
                continue
            headers: dict[str, str] = {}
            name = ""
            for line in lines[1:]:
                if line[:1] in (" ", "\t") and name:  # obsolete line folding: continues the previous value
                    headers[name] = f"{headers[name]} {line.strip()}"
                    continue
                name, sep, value = line.partition(":")
                if not sep:
                    raise Broken(f"malformed response header {line[:80]!r}")
                name, value = name.strip().lower(), value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
            return status, headers, keep

    def body(self, method: str, status: int, headers: dict[str, str], state: list[bool]) -> Iterator[bytes]:
        """The response body in chunks of at most 1 MiB; ``state[0]`` becomes True once it is all read."""
        if method == "HEAD" or status in (204, 304):
            state[0] = True
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                line = self._line()
                try:
                    n = int(line.partition(b";")[0].strip(), 16)
                except ValueError:
                    raise Broken(f"bad chunk size {bytes(line[:40])!r}") from None
                if n == 0:
                    while self._line():  # trailers
                        pass
                    break
                yield from self._exactly(n)
                if self._line():
                    raise Broken("chunk not followed by CRLF")
        elif "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                raise Broken(f"bad Content-Length {headers['content-length']!r}") from None
            yield from self._exactly(n)
        else:  # delimited by the connection closing
            state[1] = False
            if self.buf:
                yield bytes(self.buf)
                self.buf.clear()
            while True:
                try:
                    data = self.sock.recv(READ_CHUNK)
                except OSError as e:
                    raise Broken(f"connection failed: {e}") from e
                if not data:
                    break
                yield data
        state[0] = True

    def _line(self) -> bytearray:
        buf = self.buf
        end = buf.find(b"\r\n")
        while end < 0:
            if len(buf) > 65536:
                raise Broken("chunked framing line too long")
            buf += self._recv(65536)
            end = buf.find(b"\r\n")
        line = buf[:end]
        del buf[:end + 2]
        return line

    def _exactly(self, n: int) -> Iterator[bytes]:
        buf = self.buf
        if buf:
            take = min(len(buf), n)
            yield bytes(buf[:take])
            del buf[:take]
            n -= take
        while n > 0:  # what each recv returns, as it is (bytes: google_crc32c takes nothing mutable)
            try:
                data = self.sock.recv(min(n, READ_CHUNK), self.waitall)
            except OSError as e:
                raise Broken(f"connection failed: {e}") from e
            if not data:
                raise Broken("the server closed the connection mid-response")
            n -= len(data)
            yield data


class Wire:
    """JSON-API requests with less per-request work than ``Blob`` (and than ``requests``/``urllib3``).

    Requests go to the client's API base URL through the client's session: on kept-alive connections that the
    session's adapter's connection pool opens (so built with the TLS / client-certificate settings requests
    would use), with the session's credentials applied, our own HTTP/1.1 framing on them, when the session is a
    plain ``requests.Session`` / ``AuthorizedSession`` without hooks, auth or proxies; through
    ``session.request`` otherwise. Only conditional or read-only requests come here, so every try may be
    retried; a kept-alive connection found closed by the server is replaced at once.
    """

    def __init__(self, client: Any) -> None:
        conn = client._connection
        self.http = client._http
        self.base = str(conn.API_BASE_URL).rstrip("/")
        parts = urlsplit(self.base)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.host = parts.netloc.rpartition("@")[2]
        self.headers: dict[str, str] = {}
        with contextlib.suppress(Exception):
            self.headers.update(conn.extra_headers or {})
        with contextlib.suppress(Exception):
            self.headers["User-Agent"] = f"gtrain {conn.user_agent}"
        self.creds = getattr(self.http, "credentials", None)
        self.auth_request = getattr(self.http, "_auth_request", None)
        if self.creds is not None and self.auth_request is None:
            from google.auth.transport.requests import Request

            self.auth_request = Request()
        self.pool = self._find_pool()
        self.idle: list[Conn] = []  # kept-alive connections not in use (list.append/pop: atomic)

    def _find_pool(self) -> Any:
        """The urllib3 pool ``session.request`` would end up in, or None where we must go through it."""
        try:
            import requests
            from google.auth.transport.requests import AuthorizedSession
            from requests.adapters import HTTPAdapter

            http = self.http
            if (type(http).request not in (requests.Session.request, AuthorizedSession.request)
                    or any(http.hooks.values()) or http.auth is not None):
                return None
            env = http.merge_environment_settings(self.base, {}, None, None, None)
            adapter = http.get_adapter(self.base)
            if env.get("proxies") or not isinstance(adapter, HTTPAdapter):
                return None
            pool = adapter.get_connection_with_tls_context(requests.Request("GET", self.base).prepare(),
                                                           env["verify"], None, env["cert"])
            if getattr(pool, "proxy", None) is not None or not callable(getattr(pool, "_new_conn", None)):
                return None
            return pool
        except Exception:  # noqa: BLE001 - an older requests, an odd session: the general path
            return None

    def close(self) -> None:
        while self.idle:
            with contextlib.suppress(IndexError):
                self.idle.pop().close()

    def url(self, path: str, query: dict[str, str]) -> str:
        return f"{self.base}{path}?{urlencode(query)}"

    def call(self, method: str, url: str, *, body: bytes | Iterable[bytes] | None = None,
             headers: dict[str, str] | None = None, consume: Callable[[Response], Any],
             attempts: int = ATTEMPTS, allow: tuple[int, ...] = ()) -> Any:
        """Send until a try is not transient and return what ``consume`` made of the response (2xx, or a
        status in ``allow``); a connection error while it reads retries the try; an error status is
        raised as the google.api_core exception for it (``Transient`` where ``attempts`` ran out on a
        transient one and the caller retries on its own: ``attempts=1``)."""
        refreshed = False
        delay = 1.0
        for attempt in range(1, attempts + 1):
            try:
                return self._once(method, url, body, headers, consume, allow)
            except Unauthorized as e:
                if refreshed or self.creds is None:
                    raise e.err from None
                refreshed = True
                self.creds.refresh(self.auth_request)
                continue
            except Transient as e:
                if attempt == attempts:
                    if attempts == 1:
                        raise
                    if isinstance(e.err, OSError):  # a socket's (not a local file's): "cannot reach"
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
        if self.pool is not None and url.startswith(self.origin + "/"):
            return self._direct(method, url, body, headers, consume, allow)
        import requests
        import urllib3

        h = {**self.headers, **(headers or {})}
        try:
            rr = self.http.request(method, url, data=body, headers=h, stream=True, timeout=TIMEOUT)
            resp = Response(rr.status_code, rr.headers, lambda: rr.raw.stream(READ_CHUNK, decode_content=False))
            ok = False
            try:
                if resp.status >= 300 and resp.status not in allow:
                    raise status_error(method, url, resp)
                out = consume(resp)
                ok = True
                return out
            finally:
                if not ok:  # a connection with unread bytes must not go back to the pool
                    rr.raw.close()
                rr.close()
        except (urllib3.exceptions.HTTPError, requests.ConnectionError, requests.Timeout, ConnectionError) as e:
            raise Transient(e) from e

    def _direct(self, method: str, url: str, body: bytes | Iterable[bytes] | None, headers: dict[str, str] | None,
                consume: Callable[[Response], Any], allow: tuple[int, ...]) -> Any:
        h = {**self.headers, **(headers or {})}
        if self.creds is not None:
            self.creds.before_request(self.auth_request, method, url, h)
        h.pop("Content-Length", None)
        h.pop("Host", None)
        n = 0 if body is None else len(body)  # type: ignore[arg-type]  # bytes, or _FileChunks (has __len__)
        fields = "".join(f"{k}: {v}\r\n" for k, v in h.items())
        if fields.count("\n") != len(h) or fields.count("\r") != len(h):
            raise ValueError("an HTTP header holds a line break")
        length = f"Content-Length: {n}\r\n" if body is not None or method in ("POST", "PUT", "PATCH") else ""
        head = f"{method} {url[len(self.origin):]} HTTP/1.1\r\nHost: {self.host}\r\n{fields}{length}\r\n"
        streamed = body is not None and not isinstance(body, bytes | bytearray | memoryview)
        fresh = streamed  # a streamed body is sent once per try: never on a connection that may be stale
        while True:
            c: Conn | None = None
            try:
                if not fresh:
                    with contextlib.suppress(IndexError):
                        c = self.idle.pop()
                if c is None:
                    c = Conn(self.pool)
                c.send(head.encode("latin-1"), body)
                status, rh, keep = c.head()
            except Stale:  # the server had closed it while it sat idle: once more on a new one
                assert c is not None
                c.close()
                fresh = True
                continue
            except Exception as e:
                if c is not None:
                    c.close()
                if isinstance(e, Broken | OSError) or is_urllib3_error(e):
                    raise Transient(e) from e
                raise
            break
        state = [False, keep]  # [body read to the end, connection reusable]
        resp = Response(status, rh, lambda: c.body(method, status, rh, state))
        try:
            if status >= 300 and status not in allow:
                raise status_error(method, url, resp)
            out = consume(resp)
        except Broken as e:
            c.close()
            raise Transient(e) from e
        except BaseException:
            c.close()
            raise
        if state[0] and state[1]:
            c.used = True
            self.idle.append(c)
        else:  # unread bytes, or the server closes it: not reusable
            c.close()
        return out


def is_urllib3_error(e: Exception) -> bool:
    import urllib3

    return isinstance(e, urllib3.exceptions.HTTPError)


def status_error(method: str, url: str, resp: Response) -> Exception:
    """The google.api_core exception for an error status, wrapped for :meth:`Wire.call` where it calls for
    another try or a credentials refresh."""
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
    if resp.status == 401:
        return Unauthorized(err)
    return err
