"""Azure Blob backend of ``gtrain sync`` (``az://CONTAINER/PREFIX``), over :mod:`gtrain.sync.azwire`.

The account comes from the environment (see azwire). Integrity: a small blob is one Put Blob with
``Content-MD5`` (Azure checks it: Md5Mismatch) and ``gtrain_sha256`` metadata (Azure metadata names are
C# identifiers: no hyphen); a large one goes up in ``part_size`` blocks, each with its ``Content-MD5``
(checked), committed by one Put Block List that records the whole file's md5 and sha256. Every GET is
pinned to the listed ETag with ``If-Match``; the engine checks what arrived against the sha256 (else the
md5) before anything is renamed into place. Uncommitted blocks of a killed upload are not resumed: Azure
drops them after a week, and they are replaced by the next sync's upload.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError, CredentialsError, GtrainError, SyncError
from gtrain.sync import azwire
from gtrain.sync.httpconn import body_to_file
from gtrain.sync.model import (
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    DEFAULT_WORKERS,
    Digests,
    RemoteObject,
    RemoteURL,
)
from gtrain.sync.ranges import Fetch, download_ranges

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

_META = "x-ms-meta-gtrain_sha256"
_CRED_HINT = ("set AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, or "
              "AZURE_STORAGE_CONNECTION_STRING, or log in (`az login`; needs azure-identity)")
_CRED_CODES = {"AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch",
               "InvalidAuthenticationInfo", "AccountIsDisabled", "InsufficientAccountPermissions",
               "ProxyAuthenticationRequired"}
_REREAD = "re-run once it is no longer written"
_MAX_BLOCKS = 50_000


class AzureBackend:
    def __init__(self, client: azwire.AzureWire | None = None, *, fld: str = "DST", workers: int = DEFAULT_WORKERS,
                 multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD, part_size: int = DEFAULT_PART_SIZE) -> None:
        self.fld = fld
        with self._errors(None):
            self.wire = client if client is not None else azwire.AzureWire()
        self.threshold, self.part_size, self.workers = multipart_threshold, part_size, workers
        self._blocks: ThreadPoolExecutor | None = None

    def _workers(self) -> ThreadPoolExecutor:
        if self._blocks is None:
            from concurrent.futures import ThreadPoolExecutor

            self._blocks = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="gtrain-az-block")
        return self._blocks

    @contextlib.contextmanager
    def _errors(self, url: RemoteURL | None, key: str | None = None) -> Iterator[None]:
        try:
            yield
        except GtrainError:
            raise
        except Exception as e:  # noqa: BLE001 - translated or re-raised below
            raise self._translate(e, url, key) from e

    def _translate(self, e: Exception, url: RemoteURL | None, key: str | None) -> Exception:
        where = f"az://{url.bucket}/{key}" if url is not None and key else (str(url) if url else "Azure Blob")
        if isinstance(e, azwire.NoCredentials):
            return CredentialsError(f"no usable Azure credentials for {where}: {e}", hint=_CRED_HINT)
        if isinstance(e, azwire.AzureWireError):
            if e.status == 0:
                return SyncError(f"cannot reach Azure Blob for {where}: {e.message}",
                                 hint="check the network and the account's endpoint; re-run to resume")
            if e.code == "ContainerNotFound":
                c = e.container or (url.bucket if url else "?")
                return ConfigError(f"Azure container {c!r} does not exist (or is not visible to these credentials)",
                                   hint=f"create it (`az storage container create -n {c}`) or fix the name",
                                   field=self.fld)
            if e.code in _CRED_CODES or e.status in (401, 403, 407):
                return CredentialsError(f"access to {where} denied ({e.code}): {e.message}", hint=_CRED_HINT)
            if e.code in ("Md5Mismatch", "InvalidMd5", "Crc64Mismatch"):
                return SyncError(f"{where}: Azure rejected the upload's checksum ({e.code})",
                                 hint="the data was corrupted in transit or changed while uploading; re-run")
            if e.code in ("BlobNotFound", "ConditionNotMet") or e.status in (404, 412):
                return SyncError(f"{where} changed or disappeared during the sync ({e.code})",
                                 hint="re-run to sync what is there now")
            return SyncError(f"Azure request for {where} failed ({e.code}): {e.message}")
        if isinstance(e, OSError):
            return SyncError(f"{where}: {e.strerror or e}")
        return e

    # -- Backend

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        with self._errors(url):
            for b in azwire.list_blobs(self.wire, url.bucket, url.key_prefix):
                yield RemoteObject(b.name, b.size, b.etag, md5=b.md5)

    @staticmethod
    def _from_headers(key: str, h: dict[str, str]) -> RemoteObject:
        return RemoteObject(key, int(h.get("content-length", 0)), h.get("etag", "").strip('"'),
                            md5=azwire.md5_hex(h.get("content-md5")), sha256=h.get(_META))

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        with self._errors(url, key):
            try:
                r = self.wire.request("HEAD", url.bucket, key)
            except azwire.AzureWireError as e:
                if e.status == 404 and e.code != "ContainerNotFound":
                    return None
                raise
            return self._from_headers(key, r.headers)

    def upload(self, path: Path, url: RemoteURL, key: str, *, size: int, digests: Digests,
               expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        with self._errors(url, key):
            if size < self.threshold:
                with open(path, "rb") as f:
                    body = f.read(size + 1)
                if len(body) != size or hashlib.sha256(body).hexdigest() != digests.sha256:
                    raise SyncError(f"{path} changed while it was being read", hint=_REREAD)
                return self._put(body, url, key, digests, progress)
            return self._put_blocks(path, url, key, size, digests, progress)

    def upload_data(self, data: bytes, url: RemoteURL, key: str, *, digests: Digests,
                    expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        with self._errors(url, key):
            return self._put(data, url, key, digests, progress)

    def _put(self, body: bytes, url: RemoteURL, key: str, digests: Digests,
             progress: Callable[[int], None]) -> RemoteObject:
        md5 = hashlib.md5(body, usedforsecurity=False)
        r = self.wire.request("PUT", url.bucket, key, body=body, ok=(201,), headers={
            "x-ms-blob-type": "BlockBlob", "content-md5": azwire.b64(md5.digest()), _META: digests.sha256,
            "x-ms-blob-content-type": "application/octet-stream"})
        progress(len(body))
        return RemoteObject(key, len(body), r.headers.get("etag", "").strip('"'), md5=md5.hexdigest(),
                            sha256=digests.sha256)

    def _put_blocks(self, path: Path, url: RemoteURL, key: str, size: int, digests: Digests,
                    progress: Callable[[int], None]) -> RemoteObject:
        ps = self.part_size
        while -(-size // ps) > _MAX_BLOCKS:
            ps *= 2
        ranges = list(enumerate(range(0, size, ps)))

        def one(part: tuple[int, int]) -> str:
            n, off = part
            with open(path, "rb") as f:
                f.seek(off)
                data = f.read(min(ps, size - off))
            if len(data) != min(ps, size - off):
                raise SyncError(f"{path} shrank while it was being uploaded", hint=_REREAD)
            bid = azwire.block_id(n)
            self.wire.request("PUT", url.bucket, key, query={"comp": "block", "blockid": bid}, body=data, ok=(201,),
                              headers={"content-md5": azwire.b64(hashlib.md5(data, usedforsecurity=False).digest())})
            progress(len(data))
            return bid

        futures = [self._workers().submit(one, p) for p in ranges]
        try:
            ids = [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
        headers = {_META: digests.sha256, "x-ms-blob-content-type": "application/octet-stream",
                   "content-type": "application/xml"}
        if digests.md5:
            headers["x-ms-blob-content-md5"] = azwire.b64(bytes.fromhex(digests.md5))
        r = self.wire.request("PUT", url.bucket, key, query={"comp": "blocklist"}, body=azwire.block_list_xml(ids),
                              ok=(201,), headers=headers)
        return RemoteObject(key, size, r.headers.get("etag", "").strip('"'), md5=digests.md5 or None,
                            sha256=digests.sha256)

    def download(self, url: RemoteURL, obj: RemoteObject, dest: Path, *,
                 progress: Callable[[int], None]) -> tuple[RemoteObject, Digests | None]:
        with self._errors(url, obj.key):
            if obj.size < self.threshold:
                for attempt in range(3):  # a stream that breaks is fetched again from the start
                    try:
                        return self._get_small(url, obj, dest, progress)
                    except azwire.AzureWireError as e:
                        if e.code != "StreamBroken" or attempt == 2:
                            raise
                raise AssertionError("unreachable")  # pragma: no cover
            head = self.head(url, obj.key)
            if head is None or head.version != obj.version:
                raise SyncError(f"az://{url.bucket}/{obj.key} changed or disappeared during the sync",
                                hint="re-run to sync what is there now")
            return head, download_ranges(self._workers(), dest, obj.size, self.part_size,
                                         self._ranged_fetch(url, obj), progress,
                                         want_md5=head.sha256 is None, where=f"az://{url.bucket}/{obj.key}")

    def _ranged_fetch(self, url: RemoteURL, obj: RemoteObject) -> Fetch:
        """``fetch(first, last)``: one ranged GET of ``obj`` pinned to its ETag."""

        def fetch(first: int, last: int) -> bytes:
            return self.wire.request("GET", url.bucket, obj.key, ok=(206,), headers={
                "x-ms-range": f"bytes={first}-{last}", "if-match": f'"{obj.version}"'}).body

        return fetch

    def _get_small(self, url: RemoteURL, obj: RemoteObject, dest: Path,
                   progress: Callable[[int], None]) -> tuple[RemoteObject, Digests]:
        r = self.wire.request("GET", url.bucket, obj.key, headers={"if-match": f'"{obj.version}"'}, stream=True)
        got = self._from_headers(obj.key, r.headers)  # its sha256 known: no md5 needed to check it
        return got, body_to_file(r, dest, progress, want_md5=got.sha256 is None,
                                 discard=self.wire.discard_thread_connections,
                                 broken=lambda why: azwire.AzureWireError(0, "StreamBroken", why, container=url.bucket,
                                                                          blob=obj.key))

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        def one(key: str) -> None:
            with self._errors(url, key):
                try:
                    self.wire.request("DELETE", url.bucket, key, ok=(202,))
                except azwire.AzureWireError as e:
                    if e.code != "BlobNotFound":
                        raise

        for _ in self._workers().map(one, keys):
            pass

    def close(self) -> None:
        if self._blocks is not None:
            self._blocks.shutdown(wait=True, cancel_futures=True)
        self.wire.close()
