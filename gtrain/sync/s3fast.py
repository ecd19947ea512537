"""S3 on a compiled transfer engine: ``obstore`` (Python bindings of the Rust ``object_store`` crate,
https://developer.sourcecoop.org/obstore/), where it is installed (the ``aws`` extra brings it).

What moves bytes here is obstore: the listing, single PUTs, GETs (each pinned with ``If-Match`` to the ETag the
listing showed, hashed while streaming), ranged GETs of large objects and batch deletes. What stays gtrain's is
everything around it: the manifest and the no-change logic (the engine), credentials resolved as boto3 resolves
them (:mod:`gtrain.sync.s3auth`: environment, profiles, botocore's chain for SSO / roles / instance metadata,
handed to obstore as a credential provider), and errors translated here into gtrain's, with their exit codes.

Integrity is unchanged: every PUT carries ``x-amz-checksum-sha256`` (object_store's ``checksum_algorithm``; S3
verifies it and stores it), ``gtrain-sha256`` metadata, and a single-part ETag must equal our md5. Large
uploads keep the journaled, resumable multipart of :class:`gtrain.sync.s3.S3Backend` (obstore's multipart has
no resume across processes). A CA bundle (``AWS_CA_BUNDLE``) is added to the roots obstore trusts.

Falls back to the stdlib wire client (:class:`S3Backend` as it is) where obstore cannot do what the
environment asks: not installed, an endpoint only botocore can resolve
(FIPS / dual-stack / per-service profile sections), a proxy in the environment, or ``GTRAIN_SYNC_ENGINE=wire``.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gtrain.errors import SyncError
from gtrain.sync import s3wire
from gtrain.sync.model import Digests, RemoteObject, RemoteURL
from gtrain.sync.ranges import download_ranges
from gtrain.sync.s3 import S3Backend, _md5_of

_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
# obstore hands the body over in chunks of at least this (it concatenates the network's): 256 KiB measured best
# for a 200 MiB ranged download here (sys CPU 0.13-0.17 s; 1 MiB: 0.16-0.54 s, 64 KiB: 0.18-0.33 s)
_STREAM_CHUNK = 256 << 10


def usable(settings: s3wire.Settings) -> bool:
    """Whether obstore can serve this environment exactly as the wire client would."""
    if os.environ.get("GTRAIN_SYNC_ENGINE", "").lower() == "wire":
        return False
    if settings.needs_botocore_endpoint or any(os.environ.get(v) for v in _PROXY_VARS):
        return False
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def _code(e: BaseException) -> tuple[int, str]:
    """(HTTP status, S3 error code) as far as obstore's message shows them (it carries the server's body)."""
    text = str(e)
    status = 0
    marker = "Server returned non-2xx status code: "
    if marker in text:
        digits = text.split(marker, 1)[1][:3]
        status = int(digits) if digits.isdigit() else 0
    code = ""
    if "<Code>" in text:
        code = text.split("<Code>", 1)[1].split("</Code>", 1)[0]
    return status, code


def get_to_file(store: Any, key: str, version: str, dest: Path, progress: Callable[[int], None],
                broken: Callable[[str], Exception], sha_attr: str) -> tuple[Any, Digests]:
    """One GET of ``key`` pinned to ``version`` (If-Match), streamed into ``dest`` and hashed as it arrives
    (sha256; md5 too unless the object carries its sha256 in the ``sha_attr`` metadata); S3 and Azure alike.
    A body that breaks or ends short is taken back from ``progress`` and raised as ``broken(why)`` (the caller
    fetches it again from the start); a failed GET, or a write to our own file that fails, is raised as it is.
    Returns (obstore's result, digests)."""
    import obstore

    sha, md5 = hashlib.sha256(), None
    got = 0
    r = None
    try:
        r = obstore.get(store, key, options={"if_match": f'"{version}"'})
        if not r.attributes.get(sha_attr):  # then the md5 a single-part ETag stands for is what is checked
            md5 = hashlib.md5(usedforsecurity=False)
        with open(dest, "wb") as f:
            for chunk in r.stream(min_chunk_size=_STREAM_CHUNK):
                mv = memoryview(chunk)
                f.write(mv)
                sha.update(mv)
                if md5 is not None:
                    md5.update(mv)
                got += len(mv)
                progress(len(mv))
    except Exception as e:
        ours = isinstance(e, OSError) and e.filename is not None
        if r is None or ours or not (isinstance(e, OSError) or type(e).__module__.startswith("obstore")):
            raise
        progress(-got)
        raise broken(f"download broke ({type(e).__name__}): {e}") from e
    if got != r.meta["size"]:
        progress(-got)
        raise broken(f"download ended at {got} of {r.meta['size']} bytes")
    return r, Digests(sha.hexdigest(), md5.hexdigest() if md5 is not None else "")


def ranged_fetch(store: Any, key: str, version: str) -> Callable[[int, int], Iterator[memoryview]]:
    """``fetch(first, last)`` for :func:`~gtrain.sync.ranges.download_ranges`: one ranged GET pinned to
    ``version``, streamed in chunks; a body that breaks is resumed from the byte it broke at, twice (a changed
    object fails If-Match)."""
    import obstore

    def fetch(first: int, last: int) -> Iterator[memoryview]:
        pos, attempt = first, 0
        while pos <= last:
            try:
                r = obstore.get(store, key, options={"range": (pos, last + 1), "if_match": f'"{version}"'})
                for chunk in r.stream(min_chunk_size=_STREAM_CHUNK):
                    mv = memoryview(chunk)
                    pos += len(mv)
                    yield mv
                if pos <= last:
                    raise ConnectionError(f"ranged GET ended at byte {pos} of {first}-{last}")
            except Exception as e:
                broke = (isinstance(e, OSError) and not isinstance(e, FileNotFoundError | PermissionError)) or (
                    type(e).__name__ == "GenericError" and not _code(e)[0])
                attempt += 1
                if attempt == 3 or not broke:
                    raise
        return

    return fetch


class ObstoreS3Backend(S3Backend):
    """:class:`S3Backend` with obstore moving the bytes (see the module docstring for what stays ours)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(None, **kw)
        self._stores: dict[str, Any] = {}
        self._stores_lock = threading.Lock()

    # -- the store of a bucket, built once per sync

    def _store(self, bucket: str) -> Any:
        with self._stores_lock:
            st = self._stores.get(bucket)
            if st is None:
                st = self._stores[bucket] = self._new_store(bucket)
            return st

    def _new_store(self, bucket: str) -> Any:
        from obstore.store import S3Store

        s = self.wire.settings
        region = s.region
        kw: dict[str, Any] = {"checksum_algorithm": "sha256"}
        if s.endpoint_url:
            kw.update(endpoint=s.endpoint_url.rstrip("/"), virtual_hosted_style_request=False)
        # a bucket of another region: the wire follows S3's redirect (x-amz-bucket-region) once, obstore then signs
        # for that region (object_store does not follow it)
        self.wire.request("HEAD", bucket, ok=(200, 403, 404))
        region = self.wire._route(bucket).region
        opts: dict[str, Any] = {"allow_http": "true"} if (s.endpoint_url or "").startswith("http://") else {}
        if s.ca_bundle and not opts:  # added to the trusted roots (boto3 replaces them with the bundle)
            with self._errors(None):
                opts["root_certificate"] = Path(s.ca_bundle).expanduser().read_bytes()
        kw["client_options"] = opts
        if s.static is not None:
            c = s.static
            kw.update(access_key_id=c.access_key, secret_access_key=c.secret_key)
            if c.token:
                kw["token"] = c.token
        else:
            wire = self.wire

            def provider() -> dict[str, Any]:  # botocore's chain, refreshed as it refreshes
                c = wire.credentials()
                return {"access_key_id": c.access_key, "secret_access_key": c.secret_key, "token": c.token,
                        "expires_at": _dt.datetime.now(_dt.UTC) + _dt.timedelta(minutes=5)}

            kw["credential_provider"] = provider
        # throttling and 5xx: retried with back-off, bounded as the wire client bounds it (5 tries, ~25 s)
        kw["retry_config"] = {"max_retries": 4, "retry_timeout": _dt.timedelta(seconds=25)}
        return S3Store(bucket, region=region, **kw)

    def _translate(self, e: Exception, url: RemoteURL | None, key: str | None) -> Exception:
        from_obstore = type(e).__module__.startswith("obstore") or (  # its NotFound is a builtin FileNotFoundError
            isinstance(e, FileNotFoundError | PermissionError) and "Error performing" in str(e))
        if from_obstore:
            status, code = _code(e)
            msg = str(e).split("\n", 1)[0][:300]
            if isinstance(e, FileNotFoundError):
                status, code = 404, code or "NoSuchKey"
            elif type(e).__name__ == "PreconditionError":
                status, code = 412, "PreconditionFailed"
            e = s3wire.S3WireError(status, code, msg, bucket=url.bucket if url else "", key=key or "")
        return super()._translate(e, url, key)

    # -- Backend

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        import obstore

        with self._errors(url):
            for batch in obstore.list(self._store(url.bucket), prefix=url.key_prefix or None, chunk_size=1000):
                for m in batch:
                    etag = (m["e_tag"] or "").strip('"')
                    yield RemoteObject(m["path"], m["size"], etag, md5=_md5_of(etag))

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        import obstore

        with self._errors(url, key):
            try:
                r = obstore.get(self._store(url.bucket), key, options={"head": True})
            except FileNotFoundError:
                return None
            return self._from_result(key, r)

    @staticmethod
    def _from_result(key: str, r: Any) -> RemoteObject:
        etag = (r.meta["e_tag"] or "").strip('"')
        return RemoteObject(key, r.meta["size"], etag, md5=_md5_of(etag), sha256=r.attributes.get("gtrain-sha256"))

    def _put(self, body: bytes, url: RemoteURL, key: str, digests: Digests,
             progress: Callable[[int], None]) -> RemoteObject:
        import obstore

        r = obstore.put(self._store(url.bucket), key, body, use_multipart=False, attributes={
            "gtrain-sha256": digests.sha256, "Content-Type": "application/octet-stream"})
        etag = (r["e_tag"] or "").strip('"')
        md5 = _md5_of(etag)
        if md5 is not None and md5 != digests.md5:
            raise SyncError(f"s3://{url.bucket}/{key}: S3 stored md5 {etag}, we sent {digests.md5}",
                            hint="the upload was corrupted; re-run")
        progress(len(body))
        return RemoteObject(key, len(body), etag, md5=md5, sha256=digests.sha256)

    def _get_small(self, url: RemoteURL, obj: RemoteObject, dest: Path,
                   progress: Callable[[int], None]) -> tuple[RemoteObject, Digests]:
        r, digests = get_to_file(self._store(url.bucket), obj.key, str(obj.version), dest, progress,
                                 lambda why: s3wire.S3WireError(0, "StreamBroken", why, bucket=url.bucket, key=obj.key),
                                 "gtrain-sha256")
        return self._from_result(obj.key, r), digests

    def _download_ranges(self, url: RemoteURL, obj: RemoteObject, dest: Path,
                         progress: Callable[[int], None]) -> Digests:
        return download_ranges(self._workers(), dest, obj.size, self._part_size(obj.size),
                               ranged_fetch(self._store(url.bucket), obj.key, str(obj.version)), progress,
                               want_md5=obj.sha256 is None, where=f"s3://{url.bucket}/{obj.key}")

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        import obstore

        with self._errors(url):
            for i in range(0, len(keys), 1000):
                obstore.delete(self._store(url.bucket), keys[i:i + 1000])


__all__ = ["ObstoreS3Backend", "usable"]
