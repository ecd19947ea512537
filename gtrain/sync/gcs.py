"""GCS backend of ``gtrain sync`` over google-cloud-storage (imported here only, lazily).

``STORAGE_EMULATOR_HOST`` is honoured by the library itself (anonymous credentials then). google.api_core /
google.auth / resumable-media errors are translated into gtrain errors here and nowhere else.

Integrity: uploads are sent with a crc32c the library computes (``checksum="auto"``; a multipart upload
carries it for the server to check, a resumable one compares it with the server's at the end and deletes
a corrupt object), pinned with ``if_generation_match`` to the generation the listing showed (0: must not
exist), and carry ``gtrain-sha256`` metadata; the md5 GCS reports back is compared with ours. Downloads are
single-stream (the library verifies crc32c/md5 from ``x-goog-hash``; chunked downloads would not), pinned to
the listed generation, hashed while streaming, and the engine checks sha256 (else md5). Files larger than
the threshold use a chunked resumable upload (``chunk_size``, each chunk retried on its own). XML
multipart / parallel composite uploads (``transfer_manager.upload_chunks_concurrently``) are not used: they
give composite objects without an md5, and neither emulator supports them.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

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

_CHUNK_UNIT = 256 * 1024  # resumable chunk sizes must be multiples of 256 KiB
_CRED_HINT = ("run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
              "service-account key file with storage access")


def _b64_to_hex(v: str | None) -> str | None:
    return base64.b64decode(v).hex() if v else None


class GCSBackend:
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
        self.threshold = multipart_threshold
        self.chunk_size = max(_CHUNK_UNIT, part_size // _CHUNK_UNIT * _CHUNK_UNIT)

    def _widen_pool(self, workers: int) -> None:
        """requests keeps 10 connections per host by default; give every worker thread its own."""
        with contextlib.suppress(Exception):
            from requests.adapters import HTTPAdapter

            http = self.client._http  # the client's AuthorizedSession (a requests.Session)
            for prefix in ("http://", "https://"):
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

        if isinstance(e, requests.RequestException):
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
        with self._errors(url, key):
            bucket = self.client.bucket(url.bucket)
            blob = bucket.blob(key, chunk_size=self.chunk_size if size > self.threshold else None)
            blob.metadata = {META_SHA256: digests.sha256}
            generation = int(expect.version) if expect is not None else 0
            with open(path, "rb") as f:
                blob.upload_from_file(_CountingReader(f, progress), size=size, checksum="auto",
                                      if_generation_match=generation)
        got = self._obj(blob)
        if got.md5 is not None and got.md5 != digests.md5:
            raise SyncError(f"gs://{url.bucket}/{key}: GCS stored md5 {got.md5}, we sent {digests.md5}",
                            hint="the upload was corrupted; re-run")
        return got

    def download(self, url: RemoteURL, obj: RemoteObject, dest: Path, *,
                 progress: Callable[[int], None]) -> tuple[RemoteObject, Digests | None]:
        with self._errors(url, obj.key):
            blob = self.client.bucket(url.bucket).blob(obj.key)
            with open(dest, "wb") as f:
                # md5 only where there is no sha256 to check against (saves a hash pass on big files)
                w = _HashingWriter(f, progress, md5=obj.sha256 is None)
                blob.download_to_file(w, if_generation_match=int(obj.version), checksum="auto")
        if blob.generation is not None and str(blob.generation) != obj.version:  # where the precondition isn't
            raise SyncError(f"gs://{url.bucket}/{obj.key} changed during the sync (generation {blob.generation}, "
                            f"listed {obj.version})", hint="re-run to sync what is there now")
        return obj, Digests(w.sha.hexdigest(), w.md5.hexdigest() if w.md5 is not None else "")

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
            self.client.close()


class _CountingReader:
    """A read-only file wrapper reporting bytes read (negative when the library rewinds to retry)."""

    def __init__(self, f: IO[bytes], cb: Callable[[int], None]) -> None:
        self._f, self._cb = f, cb

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        if data:
            self._cb(len(data))
        return data

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        before = self._f.tell()
        after = self._f.seek(offset, whence)
        if after != before:
            self._cb(after - before)
        return after

    def seekable(self) -> bool:
        return True

    @property
    def name(self) -> str:
        return str(getattr(self._f, "name", ""))


class _HashingWriter:
    """Writes through to the temp file, hashing and counting as the bytes arrive."""

    def __init__(self, f: IO[bytes], cb: Callable[[int], None], *, md5: bool = True) -> None:
        self._f, self._cb = f, cb
        self.sha = hashlib.sha256()
        self.md5 = hashlib.md5(usedforsecurity=False) if md5 else None

    def write(self, data: bytes) -> int:
        n = self._f.write(data)
        self.sha.update(data)
        if self.md5 is not None:
            self.md5.update(data)
        self._cb(len(data))
        return n

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()
