"""Azure Blob on the compiled transfer engine: ``obstore`` (Python bindings of the Rust ``object_store`` crate,
https://developer.sourcecoop.org/obstore/), where it is installed (the ``azure`` extra brings it), as
:mod:`gtrain.sync.s3fast` does for S3.

obstore moves the bytes: List Blobs, Put Blob, Put Block + Put Block List for large files (``part_size``
blocks, ``workers`` at once, streamed from the file), GETs pinned with ``If-Match`` to the listed ETag (hashed
while streaming), ranged GETs of large blobs, deletes. gtrain keeps the rest: the account and its credential
(:func:`gtrain.sync.azwire.resolve_account`: ``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT`` with
``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_SAS_TOKEN``, else Entra ID tokens from azure-identity handed to obstore
as a credential provider), the manifest and no-change logic (the engine), ``gtrain_sha256`` metadata that
downloads are checked against, and the translation of errors (here, into :class:`azwire.AzureWireError`, then
:class:`gtrain.sync.azure.AzureBackend` makes them gtrain's).

What differs from the wire client: obstore sends no ``Content-MD5`` on Put Blob / Put Block, so Azure does not
check each body against an md5 on the way in; the sha256 of every upload is recomputed from the bytes sent
and compared with the one in the metadata (a mismatch deletes the blob), and every download is checked
against it. The wire client (:mod:`gtrain.sync.azwire`) stays where obstore is not installed (a node running
``job.data`` / the checkpoint shipper from gtrain's stdlib-only bundle), behind a proxy (``HTTPS_PROXY`` &
co., with credentials on the ``CONNECT``), and with ``GTRAIN_SYNC_ENGINE=wire``.
"""

from __future__ import annotations

import base64
import builtins
import datetime as _dt
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gtrain.errors import SyncError
from gtrain.sync import azwire
from gtrain.sync.azure import _META, AzureBackend
from gtrain.sync.model import Digests, RemoteObject, RemoteURL
from gtrain.sync.ranges import Fetch
from gtrain.sync.s3fast import _PROXY_VARS, _code, get_to_file, ranged_fetch

_META_NAME = _META.removeprefix("x-ms-meta-")


def usable() -> bool:
    """Whether obstore can serve this environment as the wire client would."""
    if os.environ.get("GTRAIN_SYNC_ENGINE", "").lower() == "wire" or any(os.environ.get(v) for v in _PROXY_VARS):
        return False
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


class ObstoreAzureBackend(AzureBackend):
    """:class:`AzureBackend` with obstore moving the bytes (see the module docstring for what stays ours)."""

    def __init__(self, client: azwire.AzureWire | None = None, **kw: Any) -> None:
        super().__init__(client, **kw)
        self._stores: dict[str, Any] = {}
        self._stores_lock = threading.Lock()

    def _store(self, container: str) -> Any:
        with self._stores_lock:
            st = self._stores.get(container)
            if st is None:
                st = self._stores[container] = self._new_store(container)
            return st

    def _new_store(self, container: str) -> Any:
        from obstore.store import AzureStore

        acct = self.wire.account
        kw: dict[str, Any] = {"account_name": acct.name, "endpoint": acct.endpoint,
                              "client_options": {"allow_http": "true"} if acct.endpoint.startswith("http://") else {},
                              # 5 tries, bounded as the wire client bounds them (throttling, 5xx, broken connections)
                              "retry_config": {"max_retries": 4, "retry_timeout": _dt.timedelta(seconds=25)}}
        if acct.key is not None:
            kw["account_key"] = base64.b64encode(acct.key).decode()
        elif acct.sas:
            kw["sas_key"] = acct.sas
        elif acct.token_source is not None:
            tokens = acct.token_source

            def provider() -> dict[str, Any]:  # azure-identity's token, refreshed by _EntraTokens before it expires
                return {"token": tokens.get(), "expires_at": _dt.datetime.now(_dt.UTC) + _dt.timedelta(minutes=4)}

            kw["credential_provider"] = provider
        return AzureStore(container, **kw)

    def _translate(self, e: Exception, url: RemoteURL | None, key: str | None) -> Exception:
        from_obstore = type(e).__module__.startswith("obstore") or (  # its NotFound is a builtin FileNotFoundError
            isinstance(e, FileNotFoundError | PermissionError) and "Error performing" in str(e))
        if from_obstore:
            status, code = _code(e)
            text = str(e)
            msg = text.split("\n", 1)[0][:300]
            if isinstance(e, FileNotFoundError):
                status, code = 404, code or "BlobNotFound"
            elif type(e).__name__ == "PreconditionError":
                status, code = 412, "ConditionNotMet"
            elif not code:
                for c in ("ContainerNotFound", "AuthenticationFailed", "AuthorizationFailure", "ServerBusy"):
                    if c in text:
                        code = c
                        break
            e = azwire.AzureWireError(status, code or str(status), msg, container=url.bucket if url else "",
                                      blob=key or "")
        return super()._translate(e, url, key)

    # -- Backend

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        import obstore

        with self._errors(url):
            for batch in obstore.list(self._store(url.bucket), prefix=url.key_prefix or None, chunk_size=5000):
                for m in batch:
                    yield RemoteObject(m["path"], m["size"], (m["e_tag"] or "").strip('"'))

    @staticmethod
    def _from_result(key: str, r: Any) -> RemoteObject:
        return RemoteObject(key, r.meta["size"], (r.meta["e_tag"] or "").strip('"'),
                            sha256=r.attributes.get(_META_NAME))

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        import obstore

        with self._errors(url, key):
            try:
                got = self._from_result(key, obstore.get(self._store(url.bucket), key, options={"head": True}))
            except FileNotFoundError:
                return None
        if got.sha256 is None:  # another tool's blob: its Content-MD5, which obstore does not show, from the wire
            return super().head(url, key)
        return got

    def _put(self, body: bytes, url: RemoteURL, key: str, digests: Digests,
             progress: Callable[[int], None]) -> RemoteObject:
        import obstore

        r = obstore.put(self._store(url.bucket), key, body, use_multipart=False, attributes={
            _META_NAME: digests.sha256, "Content-Type": "application/octet-stream"})
        progress(len(body))
        return RemoteObject(key, len(body), (r["e_tag"] or "").strip('"'), sha256=digests.sha256)

    def _put_blocks(self, path: Path, url: RemoteURL, key: str, size: int, digests: Digests,
                    progress: Callable[[int], None]) -> RemoteObject:
        """Put Block per ``part_size`` (``workers`` in flight) + Put Block List, streamed from the file; the
        sha256 of what was sent must be the one in the metadata, else the blob is deleted."""
        import obstore

        sha = hashlib.sha256()
        sent = 0

        def chunks() -> Iterator[bytes]:
            nonlocal sent
            with open(path, "rb") as f:
                while chunk := f.read(min(self.part_size, size - sent)):
                    sha.update(chunk)
                    sent += len(chunk)
                    yield chunk
                    progress(len(chunk))
                    if sent >= size:
                        return

        store = self._store(url.bucket)
        r = obstore.put(store, key, chunks(), use_multipart=True, chunk_size=self.part_size,
                        max_concurrency=max(1, self.workers), attributes={
                            _META_NAME: digests.sha256, "Content-Type": "application/octet-stream"})
        if sent != size or sha.hexdigest() != digests.sha256:
            obstore.delete(store, key)
            raise SyncError(f"{path} changed while it was being uploaded", hint="re-run once it is no longer written")
        return RemoteObject(key, size, (r["e_tag"] or "").strip('"'), sha256=digests.sha256)

    def _ranged_fetch(self, url: RemoteURL, obj: RemoteObject) -> Fetch:
        return ranged_fetch(self._store(url.bucket), obj.key, str(obj.version))

    def _get_small(self, url: RemoteURL, obj: RemoteObject, dest: Path,
                   progress: Callable[[int], None]) -> tuple[RemoteObject, Digests]:
        r, digests = get_to_file(self._store(url.bucket), obj.key, str(obj.version), dest, progress,
                                 lambda why: azwire.AzureWireError(0, "StreamBroken", why, container=url.bucket,
                                                                   blob=obj.key), _META_NAME)
        return self._from_result(obj.key, r), digests

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        import obstore

        store = self._store(url.bucket)

        def one(key: str) -> None:
            with self._errors(url, key):
                try:
                    obstore.delete(store, key)
                except FileNotFoundError:  # already gone
                    pass

        for _ in self._workers().map(one, keys):
            pass


__all__ = ["ObstoreAzureBackend", "usable"]
