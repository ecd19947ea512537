"""GCS backend of ``gtrain sync``: the JSON API through google-auth (:mod:`gtrain.sync.gcswire`).

Every request -- listing, metadata, uploads, downloads, deletes -- goes to the JSON API's endpoint as
google-cloud-storage's ``Client`` picks it (``STORAGE_EMULATOR_HOST``, anonymous credentials then; else
storage.googleapis.com with Application Default Credentials), or to a given client's ``api_endpoint``, so real GCS
and an emulator take the same paths; google-cloud-storage itself is not imported (0.28 s of a 0.4 s no-change
re-sync). google.api_core / google.auth / urllib3 errors are translated into gtrain errors here and nowhere else.

Per-file work is what limits a sync of many small files (the Python side, not the network): one request per
file through google-auth's ``AuthorizedHttp`` on a urllib3 pool of our own (public APIs only; the credentials
are those a default client uses, or the ``credentials`` given). Requests are retried on connection errors / 408 /
429 / 5xx with backoff, a 401 answered by one credentials refresh.

Why not obstore (as S3 and Azure): object_store's GCS client speaks the XML API for uploads (``PUT
/BUCKET/KEY``) and listings, which fake-gcs-server does not serve (its router, fakestorage/server.go, takes an
XML-API PUT only as a signed URL), so that path could not be tested here; the JSON API is what both serve.

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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gtrain.errors import ConfigError, CredentialsError, GtrainError, SyncError
from gtrain.sync.gcswire import ATTEMPTS, READ_CHUNK, Broken, Response, Transient, Wire
from gtrain.sync.model import (
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    DEFAULT_WORKERS,
    META_SHA256,
    Digests,
    RemoteObject,
    RemoteURL,
)

_DIRECT_MAX = 8 * 1024 * 1024  # largest single multipart upload (the library's own limit for one)
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
                 multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD, part_size: int = DEFAULT_PART_SIZE,
                 credentials: Any = None) -> None:
        self.fld = fld
        self.workers = workers
        with self._errors(None):
            self.client = client  # only its api_endpoint is used (tests put a relay there)
            base = str(client.api_endpoint) if client is not None else None
            self._wire = Wire(base, credentials=credentials, maxsize=workers + 4)
        self._boundary = f"==gtrain-{os.urandom(16).hex()}==".encode()  # per backend; replaced where it occurs
        self.threshold = multipart_threshold
        self.part_size = part_size  # unused: a large upload is one resumable stream (see the module docstring)

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
        import urllib3

        if isinstance(e, urllib3.exceptions.HTTPError | Broken):
            base = getattr(getattr(self, "_wire", None), "base", "GCS")
            return SyncError(f"cannot reach {base} for {where}: {e}",
                             hint="check the network (and STORAGE_EMULATOR_HOST if you use an emulator); re-run")
        return e

    # -- Backend

    def _object_url(self, bucket: str, key: str, query: dict[str, str]) -> str:
        return self._wire.url(f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}", query)

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        """Objects: list, every page (1,000 a page)."""
        query = {"fields": f"items({_OBJ_FIELDS}),nextPageToken", "maxResults": "1000"}
        if url.key_prefix:
            query["prefix"] = url.key_prefix
        with self._errors(url, listing=True):
            while True:
                page = self._wire.call_json("GET", self._wire.url(f"/storage/v1/b/{quote(url.bucket, safe='')}/o",
                                                                  query))
                for r in page.get("items") or ():
                    yield self._obj_from_resource(r)
                token = page.get("nextPageToken")
                if not token:
                    return
                query["pageToken"] = token

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        with self._errors(url, key):
            r = self._wire.call("GET", self._object_url(url.bucket, key, {"fields": _OBJ_FIELDS}), allow=(404,),
                                consume=lambda resp: None if resp.status == 404 else json.loads(resp.read()))
            return None if r is None else self._obj_from_resource(r)

    def _delete(self, bucket: str, key: str, query: dict[str, str] | None = None) -> None:
        """Objects: delete; one already gone is fine."""
        self._wire.call("DELETE", self._object_url(bucket, key, query or {}), allow=(404,),
                        consume=lambda resp: resp.read())

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
        from google.api_core import exceptions as gx

        target = self._wire.url(f"/upload/storage/v1/b/{quote(url.bucket, safe='')}/o", query)
        try:
            got = self._obj_from_resource(self._wire.call_json("POST", target, body=body,
                                                               headers={"Content-Type": ctype}))
        except gx.PreconditionFailed:
            # a try whose answer was lost may have made the object: a retry then fails the precondition on our
            # own write. Taken as done only where the object is, by its sha256 and crc32c, exactly what we sent.
            there = self.head(url, key)
            if there is None or there.sha256 != digests.sha256 or there.crc32c != crc:
                raise
            got = there
        progress(len(data))
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

        def finished(resp: Response) -> dict[str, Any] | int:
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

        for attempt in range(1, ATTEMPTS + 1):
            progress(offset - reported)  # back to what the session holds
            reported = offset
            crc = google_crc32c.Checksum() if offset == 0 else None
            try:
                result = wire.call("PUT", session, body=_FileChunks(path, offset, size, sent), attempts=1,
                                   allow=(308,), headers={"Content-Range": f"bytes {offset}-{size - 1}/{size}",
                                                          "Content-Length": str(size - offset)},
                                   consume=finished)
            except Transient:
                if attempt == ATTEMPTS:
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
                self._delete(url.bucket, key, {"ifGenerationMatch": got.version})
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

        def fetch(resp: Response) -> tuple[Any, Any, Any, dict[str, str]]:
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

        def one(key: str) -> None:
            with self._errors(url, key):
                self._delete(url.bucket, key)

        with ThreadPoolExecutor(max_workers=min(self.workers, len(keys) or 1)) as pool:
            list(pool.map(one, keys))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._wire.close()


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
                chunk = f.read(min(READ_CHUNK, left))
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
        while chunk := f.read(READ_CHUNK):
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
