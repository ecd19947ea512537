"""S3 backend of ``gtrain sync``, over :mod:`gtrain.sync.s3wire` (Signature V4 on ``http.client``).

The endpoint, region and credentials are resolved as boto3 resolves them (``AWS_ENDPOINT_URL`` /
``AWS_ENDPOINT_URL_S3``, profiles, botocore's chain for SSO / roles / instance metadata): see s3wire. Errors
of the wire (and of botocore's credential chain, when it is used) are translated into gtrain errors here and
nowhere else.

Integrity on the wire: every PUT and UploadPart is signed by the sha256 of the exact bytes sent
(``x-amz-content-sha256``, which S3 verifies: XAmzContentSHA256Mismatch) and carries that same sha256 as a
flexible checksum, ``x-amz-checksum-sha256`` (signed; S3 verifies it, BadDigest, and stores it: any SDK reading
with ``ChecksumMode=ENABLED`` verifies what gtrain wrote). A single PUT also carries ``Content-MD5`` and its ETag
must equal our md5 (unless SSE-KMS/SSE-C, where the ETag is not the md5). A multipart upload hashes each part
once (sha256; no md5, no Content-MD5), declares ``SHA256`` and checks S3's composite checksum (sha256 of the
parts' sha256s, ``-N``) against ours (:meth:`S3Backend._check_assembled`); an object another tool wrote with a
full-object sha256 checksum is verified against it on download. Every object carries ``gtrain-sha256``
metadata that downloads are verified against (the engine), single GETs are hashed while streaming, and every GET
is pinned with ``If-Match`` to the ETag the listing showed. Large objects move in ``part_size`` parts over a
shared pool of ``workers`` threads (memory: at most ``workers`` parts at once).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError, CredentialsError, GtrainError, SyncError
from gtrain.sync import s3wire
from gtrain.sync.httpconn import body_to_file
from gtrain.sync.manifest import Manifest, OpenUpload
from gtrain.sync.model import (
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    DEFAULT_WORKERS,
    META_SHA256,
    Digests,
    RemoteObject,
    RemoteURL,
)
from gtrain.sync.ranges import download_ranges

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
_S3_MIN_PART = 5 * 1024 * 1024
_S3_MAX_PARTS = 10_000
_META_HEADER = f"x-amz-meta-{META_SHA256}"
_CHECKSUM = "x-amz-checksum-sha256"
_READ_CHECKSUMS = {"x-amz-checksum-mode": "ENABLED"}
_CRED_HINT = ("set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role "
              "(`aws sts get-caller-identity` shows who you are)")
_CRED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
               "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "Forbidden", "InvalidClientTokenId",
               "RequestExpired"}
_CHANGED_CODES = {"PreconditionFailed", "NoSuchKey", "NotFound", "InvalidObjectState", "NoSuchUpload"}
_DIGEST_CODES = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "XAmzContentChecksumMismatch",
                 "InvalidChecksum"}


def _md5_of(etag: str, headers: dict[str, str] | None = None) -> str | None:
    """The content md5 an ETag stands for, if it does: single-part, not SSE-KMS / SSE-C."""
    if not _MD5_ETAG.match(etag):
        return None
    if headers is not None and (headers.get("x-amz-server-side-encryption", "").startswith("aws:kms")
                                or headers.get("x-amz-server-side-encryption-customer-algorithm")):
        return None
    return etag


def _holds(held: tuple[int, str, str], length: int, data: bytes, sha: bytes) -> bool:
    """A part S3 listed (size, ETag, base64 sha256 or "") holds ``data``: by its checksum where listed, else by
    its md5 (the ETag of an unencrypted part); the md5 is computed only here, for a part a resumed upload has."""
    size, etag, checksum = held
    if size != length:
        return False
    if checksum:
        return checksum == s3wire.b64(sha)
    return bool(_MD5_ETAG.match(etag)) and hashlib.md5(data, usedforsecurity=False).hexdigest() == etag


class S3Backend:
    # the engine hashes a file it hands to upload() without its md5: a multipart upload needs none (parts are
    # checked by sha256), a single PUT computes it from the bytes it sends (upload())
    upload_md5 = False

    def __init__(self, client: s3wire.S3Wire | None = None, *, fld: str = "DST", workers: int = DEFAULT_WORKERS,
                 multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD, part_size: int = DEFAULT_PART_SIZE) -> None:
        self.fld = fld
        with self._errors(None):
            self.wire = client if client is not None else s3wire.S3Wire()
        self.threshold = max(multipart_threshold, _S3_MIN_PART)
        self.part_size = max(part_size, _S3_MIN_PART)
        self.workers = workers
        self._parts: ThreadPoolExecutor | None = None
        self._parts_lock = threading.Lock()
        self.journal: Manifest | None = None
        self._open: dict[str, OpenUpload] = {}
        self._open_lock = threading.Lock()

    def _workers(self) -> ThreadPoolExecutor:
        with self._parts_lock:
            if self._parts is None:
                from concurrent.futures import ThreadPoolExecutor

                self._parts = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="gtrain-s3-part")
            return self._parts

    # -- error translation: the one place wire (and botocore credential) exceptions become gtrain's

    @contextlib.contextmanager
    def _errors(self, url: RemoteURL | None, key: str | None = None) -> Iterator[None]:
        try:
            yield
        except GtrainError:
            raise
        except Exception as e:  # noqa: BLE001 - translated or re-raised below
            raise self._translate(e, url, key) from e

    def _translate(self, e: Exception, url: RemoteURL | None, key: str | None) -> Exception:
        where = f"s3://{url.bucket}/{key}" if url is not None and key else (f"{url}" if url is not None else "S3")
        if isinstance(e, s3wire.NoCredentials):
            return CredentialsError(f"no usable AWS credentials for {where}: {e}", hint=_CRED_HINT)
        if isinstance(e, s3wire.S3WireError):
            code, status, msg = e.code, e.status, e.message
            if status == 0:
                return SyncError(f"cannot reach S3 for {where}: {msg}",
                                 hint="check the network, AWS_ENDPOINT_URL and the region; re-run to resume")
            if code == "ProxyAuthenticationRequired":
                return CredentialsError(f"cannot reach S3 for {where}: {msg}", hint="fix the proxy's credentials")
            if code == "NoSuchBucket":
                bucket = e.bucket or (url.bucket if url else "?")
                return ConfigError(f"S3 bucket {bucket!r} does not exist (or is not visible to these credentials)",
                                   hint=f"create it (`aws s3 mb s3://{bucket}`) or fix the bucket name", field=self.fld)
            if code in _CRED_CODES or status in (401, 403):
                return CredentialsError(f"access to {where} denied ({code or status}): {msg}", hint=_CRED_HINT)
            if code in _DIGEST_CODES:
                return SyncError(f"{where}: S3 rejected the upload's checksum ({code}): {msg}",
                                 hint="the data was corrupted in transit or changed while uploading; re-run")
            if code in _CHANGED_CODES or status in (404, 412):
                return SyncError(f"{where} changed or disappeared during the sync ({code or status})",
                                 hint="re-run to sync what is there now")
            return SyncError(f"S3 request for {where} failed ({code or status}): {msg}")
        if type(e).__module__.startswith("botocore"):  # its credential chain (SSO, roles, instance metadata)
            from botocore import exceptions as bx

            if isinstance(e, bx.NoCredentialsError | bx.PartialCredentialsError | bx.CredentialRetrievalError
                          | bx.ProfileNotFound | bx.SSOError | bx.TokenRetrievalError):
                return CredentialsError(f"no usable AWS credentials for {where}: {e}", hint=_CRED_HINT)
            if isinstance(e, bx.BotoCoreError):
                return SyncError(f"S3 request for {where} failed: {e}")
        if isinstance(e, OSError):
            return SyncError(f"{where}: {e.strerror or e}")
        return e

    # -- Backend

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        with self._errors(url):
            for o in s3wire.list_objects(self.wire, url.bucket, url.key_prefix):
                yield RemoteObject(o.key, o.size, o.etag, md5=_md5_of(o.etag))

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        with self._errors(url, key):
            try:
                r = self.wire.request("HEAD", url.bucket, key, headers=_READ_CHECKSUMS)
            except s3wire.S3WireError as e:
                if e.status == 404 and e.code in ("NotFound", "NoSuchKey"):
                    return None
                raise
            return self._from_headers(key, r.headers)

    @staticmethod
    def _from_headers(key: str, h: dict[str, str]) -> RemoteObject:
        etag = h.get("etag", "").strip('"')
        sha256 = h.get(_META_HEADER)
        flexible = h.get(_CHECKSUM, "")
        if sha256 is None and flexible and "-" not in flexible and h.get("x-amz-checksum-type") != "COMPOSITE":
            with contextlib.suppress(ValueError):  # a full-object checksum another tool wrote: the content's
                sha256 = base64.b64decode(flexible, validate=True).hex()
        return RemoteObject(key, int(h.get("content-length", 0)), etag, md5=_md5_of(etag, h), sha256=sha256)

    def upload(self, path: Path, url: RemoteURL, key: str, *, size: int, digests: Digests,
               expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        with self._errors(url, key):
            if size < self.threshold:
                body = s3wire.file_part(path, 0, size)
                if hashlib.sha256(body).hexdigest() != digests.sha256:
                    raise SyncError(f"{path} changed while it was being read",
                                    hint="re-run once it is no longer written")
                if not digests.md5:  # for the ETag check (upload_md5 = False)
                    digests = Digests(digests.sha256, hashlib.md5(body, usedforsecurity=False).hexdigest())
                return self._put(body, url, key, digests, progress)
            return self._upload_multipart(path, url, key, size, digests, progress)

    def upload_data(self, data: bytes, url: RemoteURL, key: str, *, digests: Digests,
                    expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        """A small file's bytes, read once by the engine (hashed from the same bytes)."""
        with self._errors(url, key):
            return self._put(data, url, key, digests, progress)

    def _put(self, body: bytes, url: RemoteURL, key: str, digests: Digests,
             progress: Callable[[int], None]) -> RemoteObject:
        # Content-MD5 from the md5 the engine (or upload()) computed for the ETag check, not hashed again: it
        # costs neither side measurably (the server computes the md5 for the ETag anyway) and a server that
        # checks neither sha256 still refuses a corrupted body before it replaces the object
        headers = {_META_HEADER: digests.sha256, _CHECKSUM: s3wire.b64(bytes.fromhex(digests.sha256)),
                   "content-type": "application/octet-stream"}
        if digests.md5:
            headers["content-md5"] = s3wire.b64(bytes.fromhex(digests.md5))
        r = self.wire.request("PUT", url.bucket, key, body=body, body_sha256=digests.sha256, headers=headers)
        etag = r.headers.get("etag", "").strip('"')
        md5 = _md5_of(etag, r.headers)
        if md5 is not None and md5 != digests.md5:
            raise SyncError(f"s3://{url.bucket}/{key}: S3 stored md5 {etag}, we sent {digests.md5}",
                            hint="the upload was corrupted; re-run")
        progress(len(body))
        return RemoteObject(key, len(body), etag, md5=md5, sha256=digests.sha256)

    def _part_size(self, size: int) -> int:
        ps = self.part_size
        while -(-size // ps) > _S3_MAX_PARTS:
            ps *= 2
        return ps

    # -- the upload journal (the manifest's): a multipart upload a killed sync left behind is resumed when the
    #    file is unchanged, aborted otherwise; nothing stays billed in the bucket after a sync that finished

    def attach_journal(self, journal: Manifest) -> None:
        self.journal = journal
        self._open = {u.key: u for u in journal.open_uploads()}

    def sweep_journal(self, url: RemoteURL) -> int:
        """Abort the uploads the journal still holds and this sync did not resume (their files changed or
        went away). Returns how many were aborted."""
        n = 0
        with self._open_lock:
            stale, self._open = list(self._open.values()), {}
        for up in stale:
            self._abort(url, up.key, up.upload_id)
            n += 1
        return n

    def _abort(self, url: RemoteURL, key: str, upload_id: str) -> None:
        with contextlib.suppress(GtrainError, s3wire.S3WireError):  # gone already is fine; else the next sync retries
            self.wire.request("DELETE", url.bucket, key, query={"uploadId": upload_id}, ok=(200, 204, 404))
            if self.journal is not None:
                self.journal.upload_ended(key, upload_id)

    def _resumable(self, url: RemoteURL, key: str, size: int, mtime_ns: int, digests: Digests
                   ) -> tuple[str, int, dict[int, tuple[int, str, str]]] | None:
        """(upload id, part size, {part number: (size, etag, base64 sha256 or "")}) of this file's unfinished
        upload, if it can go on: same size, mtime and sha256 as when it began, and S3 still has it. Otherwise it is
        aborted. S3 lists each part's ``ChecksumSHA256`` (the upload declared SHA256); servers that do not, only
        its ETag (the part's md5)."""
        with self._open_lock:
            up = self._open.pop(key, None)
        if up is None:
            return None
        if (up.size, up.mtime_ns, up.sha256) != (size, mtime_ns, digests.sha256):
            self._abort(url, key, up.upload_id)
            return None
        parts: dict[int, tuple[int, str, str]] = {}
        marker = "0"
        try:
            while True:
                r = self.wire.request("GET", url.bucket, key, query={"uploadId": up.upload_id,
                                                                      "part-number-marker": marker})
                root = s3wire.parse_xml(r.body)
                for p in root.iter("Part"):
                    parts[int(p.findtext("PartNumber") or 0)] = (int(p.findtext("Size") or 0),
                                                                 (p.findtext("ETag") or "").strip('"'),
                                                                 (p.findtext("ChecksumSHA256") or "").strip())
                if (root.findtext("IsTruncated") or "").lower() != "true":
                    break
                marker = root.findtext("NextPartNumberMarker") or ""
                if not marker:
                    break
        except s3wire.S3WireError as e:
            if e.status != 404:  # NoSuchUpload: expired or aborted elsewhere; start afresh
                raise
            if self.journal is not None:
                self.journal.upload_ended(key, up.upload_id)
            return None
        return up.upload_id, up.part_size, parts

    def _upload_multipart(self, path: Path, url: RemoteURL, key: str, size: int, digests: Digests,
                          progress: Callable[[int], None]) -> RemoteObject:
        wire, bucket = self.wire, url.bucket
        mtime_ns = os.stat(path).st_mtime_ns
        resumed = self._resumable(url, key, size, mtime_ns, digests)
        if resumed is not None:
            upload_id, ps, have = resumed
        else:
            r = wire.request("POST", bucket, key, query={"uploads": ""}, headers={
                _META_HEADER: digests.sha256, "content-type": "application/octet-stream",
                "x-amz-checksum-algorithm": "SHA256"})
            upload_id = s3wire.parse_xml(r.body).findtext("UploadId") or ""
            if not upload_id:
                raise SyncError(f"s3://{bucket}/{key}: CreateMultipartUpload returned no UploadId")
            ps, have = self._part_size(size), {}
            if self.journal is not None:  # before the first part: a kill from here on is resumable
                self.journal.upload_begun(OpenUpload(key, upload_id, size, mtime_ns, ps, digests.sha256))
        ranges = [(i + 1, off, min(ps, size - off)) for i, off in enumerate(range(0, size, ps))]

        def one(part: tuple[int, int, int]) -> tuple[str, bytes]:
            # one hash per part: its sha256 signs the body (x-amz-content-sha256) and is its checksum header
            n, off, length = part
            data = s3wire.file_part(path, off, length)
            sha = hashlib.sha256(data).digest()
            held = have.get(n)
            if held is not None and _holds(held, length, data, sha):  # S3 has exactly these bytes already
                progress(length)
                return held[1], sha
            resp = wire.request("PUT", bucket, key, query={"partNumber": str(n), "uploadId": upload_id},
                                body=data, body_sha256=sha.hex(), headers={_CHECKSUM: s3wire.b64(sha)})
            echoed = resp.headers.get(_CHECKSUM)
            if echoed and echoed != s3wire.b64(sha):
                raise SyncError(f"s3://{bucket}/{key}: part {n} stored with sha256 {echoed}, we sent "
                                f"{s3wire.b64(sha)}", hint="the upload was corrupted; re-run")
            progress(length)
            return resp.headers.get("etag", "").strip('"'), sha

        done = False
        futures: list[Future[tuple[str, bytes]]] = []
        try:
            futures = [self._workers().submit(one, p) for p in ranges]
            results = [f.result() for f in futures]
            expected = s3wire.composite_sha256([d for _, d in results])
            resp = wire.request("POST", bucket, key, query={"uploadId": upload_id}, body=s3wire.complete_xml(
                [e for e, _ in results], [s3wire.b64(d) for _, d in results]))
            root = s3wire.parse_xml(resp.body)
            if root.tag == "Error":  # CompleteMultipartUpload can fail with a 200
                raise s3wire.S3WireError(500, root.findtext("Code") or "InternalError",
                                         root.findtext("Message") or "", bucket=bucket, key=key)
            etag = (root.findtext("ETag") or "").strip('"')
            self._check_assembled(url, key, size, (root.findtext("ChecksumSHA256") or "").strip(), expected)
            done = True
            if self.journal is not None:
                self.journal.upload_ended(key, upload_id)
        except Exception:
            for f in futures:
                f.cancel()
            self._abort(url, key, upload_id)  # a failure we saw: leave no billed parts behind
            raise
        finally:
            if not done:  # KeyboardInterrupt / SystemExit: the journal keeps it for the next sync to resume
                for f in futures:
                    f.cancel()
        return RemoteObject(key, size, etag, md5=None, sha256=digests.sha256)

    def _check_assembled(self, url: RemoteURL, key: str, size: int, got: str, expected: str) -> None:
        """The object a CompleteMultipartUpload made is what we sent: its composite checksum (S3 answers it,
        ``<b64>-N``) equals the one of our parts' sha256s. A server that does not answer it: the checksum and
        size the object carries (HEAD), as far as it carries them (each part was checked on arrival against its
        signed sha256). A mismatch deletes the object (its gtrain-sha256 metadata would vouch for bytes it does
        not hold) and fails the file."""
        what = f"composite checksum {got}"
        if not got:
            head = self.wire.request("HEAD", url.bucket, key, headers=_READ_CHECKSUMS)
            got, what = head.headers.get(_CHECKSUM, ""), f"composite checksum {head.headers.get(_CHECKSUM)}"
            if int(head.headers.get("content-length", -1)) != size:
                got, what = "?", f"{head.headers.get('content-length')} bytes (we sent {size})"
        if got and got not in (expected, expected.rpartition("-")[0]):
            with contextlib.suppress(GtrainError, s3wire.S3WireError):
                self.wire.request("DELETE", url.bucket, key, ok=(200, 204, 404))
            raise SyncError(f"s3://{url.bucket}/{key}: S3 assembled an object with {what}, the parts we sent "
                            f"make {expected}; it was deleted",
                            hint="the upload was corrupted or changed concurrently; re-run")

    def download(self, url: RemoteURL, obj: RemoteObject, dest: Path, *,
                 progress: Callable[[int], None]) -> tuple[RemoteObject, Digests | None]:
        with self._errors(url, obj.key):
            if obj.size < self.threshold:
                # one GET pinned to the listed ETag; hashed while streaming, metadata from the same response;
                # a stream that breaks is fetched again from the start (the temp file truncated)
                for attempt in range(3):
                    try:
                        return self._get_small(url, obj, dest, progress)
                    except s3wire.S3WireError as e:
                        if e.code != "StreamBroken" or attempt == 2:
                            raise
                raise AssertionError("unreachable")  # pragma: no cover
            head = self.head(url, obj.key)
            if head is None or head.version != obj.version:
                raise SyncError(f"s3://{url.bucket}/{obj.key} changed or disappeared during the sync",
                                hint="re-run to sync what is there now")
            # the engine checks the digests against gtrain-sha256 (else the md5 a single-part ETag stands for)
            return head, self._download_ranges(url, head, dest, progress)

    def _get_small(self, url: RemoteURL, obj: RemoteObject, dest: Path,
                   progress: Callable[[int], None]) -> tuple[RemoteObject, Digests]:
        r = self.wire.request("GET", url.bucket, obj.key, headers={"if-match": f'"{obj.version}"', **_READ_CHECKSUMS},
                              stream=True)
        got = self._from_headers(obj.key, r.headers)  # its sha256 known: no md5 needed to check it
        return got, body_to_file(r, dest, progress, want_md5=got.sha256 is None,
                                 discard=self.wire.discard_thread_connections,
                                 broken=lambda why: s3wire.S3WireError(0, "StreamBroken", why, bucket=url.bucket,
                                                                       key=obj.key))

    def _download_ranges(self, url: RemoteURL, obj: RemoteObject, dest: Path,
                         progress: Callable[[int], None]) -> Digests:
        """Parallel ranged GETs (each pinned to the ETag) written in place, hashed in order as they arrive."""
        def fetch(first: int, last: int) -> bytes:
            return self.wire.request("GET", url.bucket, obj.key, ok=(206,), headers={
                "range": f"bytes={first}-{last}", "if-match": f'"{obj.version}"'}).body

        return download_ranges(self._workers(), dest, obj.size, self._part_size(obj.size), fetch, progress,
                               want_md5=obj.sha256 is None, where=f"s3://{url.bucket}/{obj.key}")

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        with self._errors(url):
            for i in range(0, len(keys), 1000):
                batch = keys[i:i + 1000]
                body = s3wire.delete_xml(batch)
                r = self.wire.request("POST", url.bucket, query={"delete": ""}, body=body,
                                      headers={"content-md5": s3wire.md5_b64(body)})
                errs = list(s3wire.parse_xml(r.body).iter("Error"))
                if errs:
                    e0 = errs[0]
                    raise SyncError(f"could not delete {len(errs)} object(s) under {url}; first "
                                    f"{e0.findtext('Key')!r}: {e0.findtext('Code')} "
                                    f"{e0.findtext('Message') or ''}".rstrip())

    def close(self) -> None:
        if self._parts is not None:
            self._parts.shutdown(wait=True, cancel_futures=True)
        self.wire.close()

