"""GCS backend of ``gtrain sync`` over google-cloud-storage (imported here only, lazily).

``STORAGE_EMULATOR_HOST`` is honoured by the library itself (anonymous credentials then); every request
goes to ``client._connection.API_BASE_URL``, so real GCS and an emulator take the same paths. google.api_core
/ google.auth / resumable-media / urllib3 errors are translated into gtrain errors here and nowhere else.

Per-file work is what limits a sync of many small files (the Python side, not the network), so uploads and
downloads skip the ``Blob`` machinery and talk the JSON API directly (:class:`_Wire`): one request per
file, with the client's credentials, on kept-alive connections that the client's session's adapter's
connection pool opens (its TLS settings and client certificate), framed by our own small HTTP/1.1 code
(:class:`_Conn`: ``http.client``'s header parsing and urllib3's per-request bookkeeping were most of the CPU
per small file); a session instrumented with hooks, using a proxy or overriding ``request`` is used as it is
instead. Conditional requests are retried on connection errors / 408 / 429 / 5xx with backoff (a kept-alive
connection the server had closed, at once on a new one), a 401 answered by one credentials refresh.

Integrity, per path:

* small uploads (at most the threshold and 8 MiB): one ``uploadType=multipart`` POST carrying the bytes read
  once (by the engine, which hashed those same bytes: :meth:`GCSBackend.upload_data`), ``gtrain-sha256``
  metadata, the md5 and our crc32c (GCS rejects the upload when the bytes it got do not match them),
  ``ifGenerationMatch`` = the generation the listing showed (0: must not exist); the md5 and crc32c GCS
  reports back are compared with ours.
* large uploads: one resumable session (same metadata and precondition, and the crc32c of the file -- or
  the md5 where the engine computed one -- against which GCS refuses to finalize other bytes; the engine
  skips the md5 for us: ``upload_md5 = False``, it is the slowest hash) fed by ONE streaming PUT read from
  the file 1 MiB at a time, so memory stays small whatever the size (``part_size`` does not split GCS
  uploads: each extra chunk is a round trip, and fake-gcs-server's cost per chunk grows with the bytes
  already held). A broken stream or a 5xx asks the
  session what it holds and sends the rest. The crc32c of what we sent is compared with the object's (a
  mismatching object is deleted) and the md5 GCS reports back with ours where we have one.
* downloads: one single-stream GET (``Accept-Encoding: gzip``, so the stored bytes arrive untranscoded) with
  ``ifGenerationMatch`` = the listed generation, and the generation the response names checked too (where an
  emulator ignores the precondition); the bytes are hashed while streaming (crc32c, sha256, md5 where the
  object has no sha256) and compared with ``x-goog-hash``; the engine checks sha256 (else md5). A broken
  stream is retried from the start (the engine's temp file truncated).

XML multipart / parallel composite uploads (``transfer_manager.upload_chunks_concurrently``) are not used:
they give composite objects without an md5, and neither emulator supports them.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import hashlib
import json
import os
import random
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from gtrain.errors import ConfigError, CredentialsError, GtrainError, SyncError
from gtrain.sync.objstore import (
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    DEFAULT_WORKERS,
    META_SHA256,
    Digests,
    RemoteObject,
    RemoteURL,
)

_DIRECT_MAX = 8 * 1024 * 1024  # largest single multipart upload (the library's own limit for one)
_READ_CHUNK = 1024 * 1024  # download stream reads
_TIMEOUT = (60.0, 60.0)  # connect, read (the library's default is 60 s)
_ATTEMPTS = 6  # tries of one request; backoff 1, 2, 4, 8, 16 s (+ jitter) between them
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_O_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)  # open(dest, "wb"), unbuffered
_OBJ_FIELDS = "name,size,generation,md5Hash,crc32c,metadata"
_CRED_HINT = ("run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
              "service-account key file with storage access")


def _b64_to_hex(v: str | None) -> str | None:
    return base64.b64decode(v).hex() if v else None


class GCSBackend:
    upload_md5 = False
    """The engine need not compute an md5 before a large upload (a sha256 for the metadata will do): the
    resumable session is checked by GCS against the crc32c instead, ~10x cheaper to compute."""

    def __init__(self, client: Any = None, *, fld: str = "DST", workers: int = DEFAULT_WORKERS,
                 multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD, part_size: int = DEFAULT_PART_SIZE) -> None:
        self.fld = fld
        self.workers = workers
        with self._errors(None):
            if client is None:
                from google.cloud import storage  # type: ignore[attr-defined]

                client = storage.Client()
            self.client = client
            self._widen_pool(workers)
            self._wire = _Wire(client)
        self._boundary = f"==gtrain-{os.urandom(16).hex()}==".encode()  # per backend; replaced where it occurs
        self.threshold = multipart_threshold
        self.part_size = part_size  # unused: a large upload is one resumable stream (see the module docstring)

    def _widen_pool(self, workers: int) -> None:
        """requests keeps 10 connections per host by default; give every worker thread its own. Only the
        session's stock adapters are replaced (not, say, google-auth's mutual-TLS one)."""
        with contextlib.suppress(Exception):
            from requests.adapters import HTTPAdapter

            http = self.client._http  # the client's AuthorizedSession (a requests.Session)
            for prefix in ("http://", "https://"):
                if type(http.adapters.get(prefix)) is HTTPAdapter:
                    http.mount(prefix, HTTPAdapter(pool_connections=4, pool_maxsize=workers + 4))

    # -- error translation: the one place google exceptions become gtrain's

    @contextlib.contextmanager
    def _errors(self, url: RemoteURL | None, key: str | None = None, *, listing: bool = False) -> Iterator[None]:
        try:
            yield
        except GtrainError:
            raise
        except Exception as e:  # noqa: BLE001 - translated or re-raised below
            raise self._translate(e, url, key, listing) from e

    def _translate(self, e: Exception, url: RemoteURL | None, key: str | None, listing: bool) -> Exception:
        from google.api_core import exceptions as gx
        from google.auth import exceptions as ax

        where = f"gs://{url.bucket}/{key}" if url is not None and key else (f"{url}" if url is not None else "GCS")
        if isinstance(e, ax.DefaultCredentialsError | ax.RefreshError):
            return CredentialsError(f"no usable Google credentials for {where}: {e}", hint=_CRED_HINT)
        if isinstance(e, ax.TransportError):
            return SyncError(f"cannot reach Google auth for {where}: {e}", hint="check the network; re-run")
        if isinstance(e, gx.NotFound):
            if listing or key is None:
                bucket = url.bucket if url else "?"
                return ConfigError(f"GCS bucket {bucket!r} does not exist (or is not visible to these credentials)",
                                   hint=f"create it (`gcloud storage buckets create gs://{bucket}`) or fix the name",
                                   field=self.fld)
            return SyncError(f"{where} changed or disappeared during the sync", hint="re-run to sync what is there now")
        if isinstance(e, gx.Unauthorized | gx.Forbidden):
            return CredentialsError(f"access to {where} denied ({e.code}): {e.message}", hint=_CRED_HINT)
        if isinstance(e, gx.PreconditionFailed):
            return SyncError(f"{where} changed during the sync (generation precondition failed)",
                             hint="re-run to sync what is there now")
        if isinstance(e, gx.GoogleAPICallError):
            return SyncError(f"GCS request for {where} failed ({e.code}): {e.message}")
        if isinstance(e, gx.RetryError):
            return SyncError(f"GCS request for {where} kept failing: {e}", hint="re-run to resume")
        try:
            from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
        except ImportError:  # pragma: no cover - older google-cloud-storage
            from google.resumable_media.common import DataCorruption, InvalidResponse
        if isinstance(e, DataCorruption):
            return SyncError(f"{where}: checksum mismatch on the wire: {e}", hint="re-run; nothing corrupt was kept")
        if isinstance(e, InvalidResponse):
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                return CredentialsError(f"access to {where} denied ({status})", hint=_CRED_HINT)
            if status == 404 and (listing or key is None):
                return ConfigError(f"GCS bucket {url.bucket if url else '?'!r} does not exist", field=self.fld)
            if status in (404, 412):
                return SyncError(f"{where} changed or disappeared during the sync ({status})",
                                 hint="re-run to sync what is there now")
            return SyncError(f"GCS transfer of {where} failed ({status}): {e}", hint="re-run to resume")
        import requests
        import urllib3

        if isinstance(e, requests.RequestException | urllib3.exceptions.HTTPError | _Broken):
            host = getattr(getattr(self, "client", None), "_connection", None)
            base = getattr(host, "API_BASE_URL", "GCS")
            return SyncError(f"cannot reach {base} for {where}: {e}",
                             hint="check the network (and STORAGE_EMULATOR_HOST if you use an emulator); re-run")
        return e

    # -- Backend

    @staticmethod
    def _obj(blob: Any) -> RemoteObject:
        meta = blob.metadata or {}
        return RemoteObject(blob.name, int(blob.size or 0), str(blob.generation), md5=_b64_to_hex(blob.md5_hash),
                            crc32c=blob.crc32c, sha256=meta.get(META_SHA256))

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        with self._errors(url, listing=True):
            fields = "items(name,size,generation,md5Hash,crc32c,metadata),nextPageToken"
            for blob in self.client.list_blobs(url.bucket, prefix=url.key_prefix or None, fields=fields):
                yield self._obj(blob)

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        with self._errors(url, key):
            blob = self.client.bucket(url.bucket).get_blob(key)
            return None if blob is None else self._obj(blob)

    def upload(self, path: Path, url: RemoteURL, key: str, *, size: int, digests: Digests,
               expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        generation = int(expect.version) if expect is not None else 0
        with self._errors(url, key):
            if size <= min(self.threshold, _DIRECT_MAX):
                with open(path, "rb") as f:
                    data = f.read(size + 1)
                if len(data) != size:
                    raise SyncError(f"{path} changed while it was being read",
                                    hint="re-run once it is no longer written")
                got = self._upload_direct(data, url, key, digests, generation, progress)
            else:
                got = self._upload_resumable(path, url, key, size, digests, generation, progress)
        return self._check_md5(got, url, key, digests)

    def upload_data(self, data: bytes, url: RemoteURL, key: str, *, digests: Digests, expect: RemoteObject | None,
                    progress: Callable[[int], None]) -> RemoteObject:
        """:meth:`upload` of a small file the engine has read (and hashed) already: one multipart POST."""
        generation = int(expect.version) if expect is not None else 0
        with self._errors(url, key):
            got = self._upload_direct(data, url, key, digests, generation, progress)
        return self._check_md5(got, url, key, digests)

    @staticmethod
    def _check_md5(got: RemoteObject, url: RemoteURL, key: str, digests: Digests) -> RemoteObject:
        if got.md5 is not None and digests.md5 and got.md5 != digests.md5:
            raise SyncError(f"gs://{url.bucket}/{key}: GCS stored md5 {got.md5}, we sent {digests.md5}",
                            hint="the upload was corrupted; re-run")
        return got

    def _upload_direct(self, data: bytes, url: RemoteURL, key: str, digests: Digests, generation: int,
                       progress: Callable[[int], None]) -> RemoteObject:
        """One multipart POST: metadata (sha256, md5, crc32c: GCS checks the last two) + the bytes."""
        import google_crc32c

        md5 = digests.md5 or hashlib.md5(data, usedforsecurity=False).hexdigest()
        crc = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
        meta = {"name": key, "metadata": {META_SHA256: digests.sha256}, "contentType": "application/octet-stream",
                "md5Hash": base64.b64encode(bytes.fromhex(md5)).decode(), "crc32c": crc}
        b = self._boundary
        if b in data:  # the delimiter must not occur in the content
            b = f"==gtrain-{os.urandom(16).hex()}==".encode()
        body = b"".join((b"--", b, b"\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n",
                         json.dumps(meta).encode(), b"\r\n--", b,
                         b"\r\ncontent-type: application/octet-stream\r\n\r\n", data, b"\r\n--", b, b"--\r\n"))
        query = {"uploadType": "multipart", "ifGenerationMatch": str(generation), "fields": _OBJ_FIELDS}
        ctype = f'multipart/related; boundary="{b.decode()}"'
        resource = self._wire.call_json("POST", self._wire.url(f"/upload/storage/v1/b/{quote(url.bucket, safe='')}/o",
                                                               query), body=body, headers={"Content-Type": ctype})
        progress(len(data))
        got = self._obj_from_resource(resource)
        if got.crc32c is not None and got.crc32c != crc:
            raise SyncError(f"gs://{url.bucket}/{key}: GCS stored crc32c {got.crc32c}, we sent {crc}",
                            hint="the upload was corrupted; re-run")
        return self._check_md5(got, url, key, Digests(digests.sha256, md5))

    def _upload_resumable(self, path: Path, url: RemoteURL, key: str, size: int, digests: Digests, generation: int,
                          progress: Callable[[int], None]) -> RemoteObject:
        """A resumable session fed by one streaming PUT (one read buffer in memory, whatever the size); after
        a broken stream or a 5xx the session is asked what it holds and the rest is sent. The md5 (or, where
        the engine skipped it, the crc32c: ``upload_md5``) goes with the session's metadata (GCS refuses to
        finalize other bytes); the crc32c of what we sent is compared with the object's, a mismatching object
        deleted."""
        import google_crc32c

        wire = self._wire
        meta = {"name": key, "metadata": {META_SHA256: digests.sha256}, "contentType": "application/octet-stream"}
        if digests.md5:
            meta["md5Hash"] = base64.b64encode(bytes.fromhex(digests.md5)).decode()
        else:  # ~10x cheaper to compute than md5
            meta["crc32c"] = base64.b64encode(_file_crc32c(path)).decode()
        query = {"uploadType": "resumable", "ifGenerationMatch": str(generation), "fields": _OBJ_FIELDS}
        session = wire.call("POST", wire.url(f"/upload/storage/v1/b/{quote(url.bucket, safe='')}/o", query),
                            body=json.dumps(meta).encode(),
                            headers={"Content-Type": "application/json; charset=UTF-8",
                                     "X-Upload-Content-Type": "application/octet-stream",
                                     "X-Upload-Content-Length": str(size)},
                            consume=lambda resp: resp.headers["location"])

        def finished(resp: _Response) -> dict[str, Any] | int:
            """The object resource, or (308: not complete) the offset the session holds up to."""
            if resp.status == 308:
                resp.read()
                held = resp.headers.get("range")  # "bytes=0-N"
                return int(held.rpartition("-")[2]) + 1 if held else 0
            out: dict[str, Any] = json.loads(resp.read())
            return out

        offset = reported = 0
        crc: Any = None  # over what this PUT sends: the whole file where it starts at 0
        result: dict[str, Any] | int = 0

        def sent(chunk: bytes) -> None:
            nonlocal reported
            if crc is not None:
                crc.update(chunk)
            reported += len(chunk)
            progress(len(chunk))

        for attempt in range(1, _ATTEMPTS + 1):
            progress(offset - reported)  # back to what the session holds
            reported = offset
            crc = google_crc32c.Checksum() if offset == 0 else None
            try:
                result = wire.call("PUT", session, body=_FileChunks(path, offset, size, sent), attempts=1,
                                   allow=(308,), headers={"Content-Range": f"bytes {offset}-{size - 1}/{size}",
                                                          "Content-Length": str(size - offset)},
                                   consume=finished)
            except _Transient:
                if attempt == _ATTEMPTS:
                    raise
                time.sleep(2 ** (attempt - 1) * (1 + random.random() / 2))
                result = wire.call("PUT", session, body=b"", allow=(308,), consume=finished,
                                   headers={"Content-Range": f"bytes */{size}"})
            if isinstance(result, dict):
                break
            offset = result
        if not isinstance(result, dict):
            raise SyncError(f"gs://{url.bucket}/{key}: the resumable upload did not complete", hint="re-run")
        got = self._obj_from_resource(result)
        ours = base64.b64encode(crc.digest() if crc is not None else _file_crc32c(path)).decode()
        if got.crc32c is not None and got.crc32c != ours:
            with contextlib.suppress(Exception):  # do not leave a corrupt object behind
                self.client.bucket(url.bucket).delete_blob(key, if_generation_match=int(got.version))
            raise SyncError(f"gs://{url.bucket}/{key}: GCS stored crc32c {got.crc32c}, we sent {ours}",
                            hint="the upload was corrupted (the object was deleted); re-run")
        return got

    @staticmethod
    def _obj_from_resource(r: dict[str, Any]) -> RemoteObject:
        meta = r.get("metadata") or {}
        return RemoteObject(r["name"], int(r.get("size") or 0), str(r["generation"]), md5=_b64_to_hex(r.get("md5Hash")),
                            crc32c=r.get("crc32c"), sha256=meta.get(META_SHA256))

    def download(self, url: RemoteURL, obj: RemoteObject, dest: Path, *,
                 progress: Callable[[int], None]) -> tuple[RemoteObject, Digests | None]:
        """One single-stream GET pinned to the listed generation, hashed as it arrives, checked against
        ``x-goog-hash``; a stream that breaks is fetched again from the start."""
        import google_crc32c

        where = f"gs://{url.bucket}/{obj.key}"
        path = f"/download/storage/v1/b/{quote(url.bucket, safe='')}/o/{quote(obj.key, safe='')}"
        query = {"alt": "media", "ifGenerationMatch": obj.version}

        def fetch(resp: _Response) -> tuple[Any, Any, Any, dict[str, str]]:
            got_gen = resp.headers.get("x-goog-generation")
            if got_gen is not None and got_gen != obj.version:  # where the precondition isn't enforced
                raise SyncError(f"{where} changed during the sync (generation {got_gen}, listed {obj.version})",
                                hint="re-run to sync what is there now")
            wire_hashes = _parse_goog_hash(resp.headers.get("x-goog-hash"))
            crc, sha = google_crc32c.Checksum(), hashlib.sha256()
            # md5 only where there is no sha256 to check against, or where the server offers nothing else
            md5 = (hashlib.md5(usedforsecurity=False)
                   if obj.sha256 is None or "crc32c" not in wire_hashes else None)
            written = 0
            try:
                fd = os.open(dest, _O_WRITE, 0o666)
                try:
                    for chunk in resp.chunks():
                        _write_all(fd, chunk)
                        crc.update(chunk)
                        sha.update(chunk)
                        if md5 is not None:
                            md5.update(chunk)
                        written += len(chunk)
                        progress(len(chunk))
                finally:
                    os.close(fd)
            except BaseException:
                if written:
                    progress(-written)  # a retry starts over
                raise
            return crc, sha, md5, wire_hashes

        with self._errors(url, obj.key):
            crc, sha, md5, wire = self._wire.call("GET", self._wire.url(path, query),
                                                  headers={"Accept-Encoding": "gzip"}, consume=fetch)
        ours = {"crc32c": base64.b64encode(crc.digest()).decode()}
        if md5 is not None:
            ours["md5"] = base64.b64encode(md5.digest()).decode()
        for name, value in ours.items():
            if name in wire and wire[name] != value:
                raise SyncError(f"{where}: checksum mismatch on the wire ({name} {value}, the server says "
                                f"{wire[name]})", hint="re-run; nothing corrupt was kept")
        return obj, Digests(sha.hexdigest(), md5.hexdigest() if md5 is not None else "")

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        """One DELETE per object over a small pool (batch requests differ too much between GCS and emulators);
        an object already gone is fine."""
        from concurrent.futures import ThreadPoolExecutor

        from google.api_core.exceptions import NotFound

        bucket = self.client.bucket(url.bucket)

        def one(key: str) -> None:
            with self._errors(url, key), contextlib.suppress(NotFound):
                bucket.delete_blob(key)

        with ThreadPoolExecutor(max_workers=min(self.workers, len(keys) or 1)) as pool:
            list(pool.map(one, keys))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._wire.close()
        with contextlib.suppress(Exception):
            self.client.close()


class _FileChunks:
    """Bytes ``[start, size)`` of a file as an iterable of 1 MiB chunks with a length (so that neither
    urllib3 nor requests falls back to a chunked transfer encoding), read as the request sends them."""

    def __init__(self, path: Path, start: int, size: int, on_chunk: Callable[[bytes], None]) -> None:
        self.path, self.start, self.size, self.on_chunk = path, start, size, on_chunk

    def __len__(self) -> int:
        return self.size - self.start

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            left = self.size - self.start
            while left > 0:
                chunk = f.read(min(_READ_CHUNK, left))
                if not chunk:
                    raise SyncError(f"{self.path} shrank while it was being uploaded",
                                    hint="re-run once it is no longer written")
                left -= len(chunk)
                self.on_chunk(chunk)
                yield chunk


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]


def _file_crc32c(path: Path) -> bytes:
    import google_crc32c

    crc = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            crc.update(chunk)
    return bytes(crc.digest())


def _parse_goog_hash(value: str | None) -> dict[str, str]:
    """``crc32c=..,md5=..`` (one header, or several joined with commas) -> {"crc32c": b64, "md5": b64}."""
    out: dict[str, str] = {}
    for part in (value or "").split(","):
        name, sep, digest = part.strip().partition("=")
        if sep and name in ("crc32c", "md5"):
            out[name] = digest
    return out


class _Response:
    """What :class:`_Wire` hands a ``consume`` callback: status, headers (looked up by lower-case name), the
    body as an iterable of ``bytes`` chunks."""

    def __init__(self, status: int, headers: Any, chunks: Callable[[], Iterable[bytes]]) -> None:
        self.status, self.headers, self._chunks = status, headers, chunks

    def chunks(self) -> Iterable[bytes]:
        return self._chunks()

    def read(self) -> bytes:
        return b"".join(self.chunks())


class _Transient(Exception):
    """A try that failed in a way worth another (connection trouble, 408/429/5xx); ``err`` is what to raise
    once the tries are spent."""

    def __init__(self, err: Exception) -> None:
        super().__init__(str(err))
        self.err = err


class _Unauthorized(Exception):
    """A 401: the credentials get one refresh."""

    def __init__(self, err: Exception) -> None:
        super().__init__(str(err))
        self.err = err


class _Broken(Exception):
    """The connection failed or the server broke HTTP/1.1 framing (kept apart from local file OSErrors)."""


class _Stale(_Broken):
    """A kept-alive connection the server had closed: nothing of the response arrived; safe to send again."""


class _Conn:
    """One kept-alive HTTP/1.1 connection: the socket urllib3 opens for the pool ``session.request`` would
    use (its TLS context, CA bundle, client certificate, socket options), with our own request writing and
    response framing on top (``http.client`` parses headers with the ``email`` package: a large part of
    the CPU per small file)."""

    __slots__ = ("conn", "sock", "buf", "used", "got", "waitall")

    def __init__(self, pool: Any) -> None:
        conn = pool._new_conn()
        conn.timeout = _TIMEOUT[0]
        conn.connect()
        self.conn, self.sock = conn, conn.sock
        self.waitall = 0
        try:
            if isinstance(self.sock, ssl.SSLSocket):
                raise ValueError("TLS: the ssl module's own timeout handling")
            # a blocking socket with kernel timeouts: no poll() before every send and recv (Python's timeout
            # mode), and a body read in 1 MiB pieces (MSG_WAITALL) rather than in whatever has arrived
            tv = struct.pack("ll", int(_TIMEOUT[1]), 0)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            self.sock.settimeout(None)
            self.waitall = getattr(socket, "MSG_WAITALL", 0)
        except (OSError, ValueError, AttributeError, struct.error):
            self.sock.settimeout(_TIMEOUT[1])
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
            raise (_Stale if self.used else _Broken)(f"connection lost while sending: {e}") from e
        except OSError as e:
            raise _Broken(f"connection failed while sending: {e}") from e

    def _recv(self, n: int) -> bytes:
        try:
            data = self.sock.recv(n)
        except (ConnectionResetError, ConnectionAbortedError) as e:
            if self.used and not self.got:
                raise _Stale(str(e)) from e
            raise _Broken(f"connection lost: {e}") from e
        except OSError as e:  # a timeout among them
            raise _Broken(f"connection failed: {e}") from e
        if not data:
            if self.used and not self.got:
                raise _Stale("the server had closed the kept-alive connection")
            raise _Broken("the server closed the connection mid-response")
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
                    raise _Broken("response headers too long")
                buf += self._recv(65536)
                end = buf.find(b"\r\n\r\n")
            lines = buf[:end].decode("latin-1").split("\r\n")
            del buf[:end + 4]
            version, _, rest = lines[0].partition(" ")
            try:
                status = int(rest[:3])
            except ValueError:
                raise _Broken(f"not an HTTP response: {lines[0][:80]!r}") from None
            if not version.startswith("HTTP/"):
                raise _Broken(f"not an HTTP response: {lines[0][:80]!r}")
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
                    raise _Broken(f"malformed response header {line[:80]!r}")
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
                    raise _Broken(f"bad chunk size {bytes(line[:40])!r}") from None
                if n == 0:
                    while self._line():  # trailers
                        pass
                    break
                yield from self._exactly(n)
                if self._line():
                    raise _Broken("chunk not followed by CRLF")
        elif "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                raise _Broken(f"bad Content-Length {headers['content-length']!r}") from None
            yield from self._exactly(n)
        else:  # delimited by the connection closing
            state[1] = False
            if self.buf:
                yield bytes(self.buf)
                self.buf.clear()
            while True:
                try:
                    data = self.sock.recv(_READ_CHUNK)
                except OSError as e:
                    raise _Broken(f"connection failed: {e}") from e
                if not data:
                    break
                yield data
        state[0] = True

    def _line(self) -> bytearray:
        buf = self.buf
        end = buf.find(b"\r\n")
        while end < 0:
            if len(buf) > 65536:
                raise _Broken("chunked framing line too long")
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
                data = self.sock.recv(min(n, _READ_CHUNK), self.waitall)
            except OSError as e:
                raise _Broken(f"connection failed: {e}") from e
            if not data:
                raise _Broken("the server closed the connection mid-response")
            n -= len(data)
            yield data


class _Wire:
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
        self.idle: list[_Conn] = []  # kept-alive connections not in use (list.append/pop: atomic)

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
             headers: dict[str, str] | None = None, consume: Callable[[_Response], Any],
             attempts: int = _ATTEMPTS, allow: tuple[int, ...] = ()) -> Any:
        """Send until a try is not transient and return what ``consume`` made of the response (2xx, or a
        status in ``allow``); a connection error while it reads retries the try; an error status is
        raised as the google.api_core exception for it (``_Transient`` where ``attempts`` ran out on a
        transient one and the caller retries on its own: ``attempts=1``)."""
        refreshed = False
        delay = 1.0
        for attempt in range(1, attempts + 1):
            try:
                return self._once(method, url, body, headers, consume, allow)
            except _Unauthorized as e:
                if refreshed or self.creds is None:
                    raise e.err from None
                refreshed = True
                self.creds.refresh(self.auth_request)
                continue
            except _Transient as e:
                if attempt == attempts:
                    if attempts == 1:
                        raise
                    if isinstance(e.err, OSError):  # a socket's (not a local file's): "cannot reach"
                        raise _Broken(str(e.err)) from e.err
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
              consume: Callable[[_Response], Any], allow: tuple[int, ...]) -> Any:
        if self.pool is not None and url.startswith(self.origin + "/"):
            return self._direct(method, url, body, headers, consume, allow)
        import requests
        import urllib3

        h = {**self.headers, **(headers or {})}
        try:
            rr = self.http.request(method, url, data=body, headers=h, stream=True, timeout=_TIMEOUT)
            resp = _Response(rr.status_code, rr.headers, lambda: rr.raw.stream(_READ_CHUNK, decode_content=False))
            ok = False
            try:
                if resp.status >= 300 and resp.status not in allow:
                    raise _status_error(method, url, resp)
                out = consume(resp)
                ok = True
                return out
            finally:
                if not ok:  # a connection with unread bytes must not go back to the pool
                    rr.raw.close()
                rr.close()
        except (urllib3.exceptions.HTTPError, requests.ConnectionError, requests.Timeout, ConnectionError) as e:
            raise _Transient(e) from e

    def _direct(self, method: str, url: str, body: bytes | Iterable[bytes] | None, headers: dict[str, str] | None,
                consume: Callable[[_Response], Any], allow: tuple[int, ...]) -> Any:
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
            c: _Conn | None = None
            try:
                if not fresh:
                    with contextlib.suppress(IndexError):
                        c = self.idle.pop()
                if c is None:
                    c = _Conn(self.pool)
                c.send(head.encode("latin-1"), body)
                status, rh, keep = c.head()
            except _Stale:  # the server had closed it while it sat idle: once more on a new one
                assert c is not None
                c.close()
                fresh = True
                continue
            except Exception as e:
                if c is not None:
                    c.close()
                if isinstance(e, _Broken | OSError) or _is_urllib3_error(e):
                    raise _Transient(e) from e
                raise
            break
        state = [False, keep]  # [body read to the end, connection reusable]
        resp = _Response(status, rh, lambda: c.body(method, status, rh, state))
        try:
            if status >= 300 and status not in allow:
                raise _status_error(method, url, resp)
            out = consume(resp)
        except _Broken as e:
            c.close()
            raise _Transient(e) from e
        except BaseException:
            c.close()
            raise
        if state[0] and state[1]:
            c.used = True
            self.idle.append(c)
        else:  # unread bytes, or the server closes it: not reusable
            c.close()
        return out


def _is_urllib3_error(e: Exception) -> bool:
    import urllib3

    return isinstance(e, urllib3.exceptions.HTTPError)


def _status_error(method: str, url: str, resp: _Response) -> Exception:
    """The google.api_core exception for an error status, wrapped for :meth:`_Wire.call` where it calls for
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
    if resp.status in _RETRY_STATUSES:
        return _Transient(err)
    if resp.status == 401:
        return _Unauthorized(err)
    return err


def _urllib3_timeout() -> Any:
    import urllib3

    return urllib3.Timeout(connect=_TIMEOUT[0], read=_TIMEOUT[1])
