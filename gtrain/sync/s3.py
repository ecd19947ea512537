"""S3 backend of ``gtrain sync`` over boto3 (imported here only, lazily).

The endpoint is whatever boto3 resolves (``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, profiles), exactly
as boto3 itself does it. botocore errors are translated into gtrain errors here and nowhere else.

Integrity on the wire: botocore >= 1.36 computes a CRC32 "flexible checksum" for every PutObject and
UploadPart by default (``request_checksum_calculation=when_supported``; s3transfer then also sets
``ChecksumAlgorithm=CRC32`` on multipart uploads), sent as an aws-chunked trailer that S3 verifies. On top
of that small files are sent with ``Content-MD5`` (S3 rejects a mismatch with BadDigest) and the returned
ETag is compared with our md5 (unless SSE-KMS/SSE-C, where the ETag is not the md5); every object carries
``gtrain-sha256`` metadata that downloads are verified against. ``GetObject`` responses are CRC-checked by
botocore when the object has a full-object checksum (``response_checksum_validation=when_supported``).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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

_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
_S3_MIN_PART = 5 * 1024 * 1024
_CRED_HINT = ("set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role "
              "(`aws sts get-caller-identity` shows who you are)")
_CRED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
               "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "403", "401", "Forbidden",
               "UnrecognizedClientException", "InvalidClientTokenId", "RequestExpired"}
_CHANGED_CODES = {"PreconditionFailed", "412", "NoSuchKey", "404", "NotFound", "InvalidObjectState"}
_DIGEST_CODES = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "XAmzContentChecksumMismatch",
                 "InvalidChecksum"}


def _etag(raw: str | None) -> str:
    return (raw or "").strip('"')


def _md5_of(etag: str, resp: dict[str, Any] | None = None) -> str | None:
    """The content md5 an ETag stands for, if it does: single-part, not SSE-KMS / SSE-C."""
    if not _MD5_ETAG.match(etag):
        return None
    if resp is not None and (str(resp.get("ServerSideEncryption", "")).startswith("aws:kms")
                             or resp.get("SSECustomerAlgorithm")):
        return None
    return etag


class S3Backend:
    def __init__(self, client: Any = None, *, fld: str = "DST", workers: int = DEFAULT_WORKERS,
                 multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD, part_size: int = DEFAULT_PART_SIZE) -> None:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        self.fld = fld
        self.bucket_hint = ""
        with self._errors(None):
            if client is None:
                import boto3
                from botocore.config import Config

                session = boto3.session.Session()
                # Keep timestamps as the strings S3 sends: nothing here reads LastModified, and parsing one
                # per listed object with dateutil costs ~0.1 s per 1,000 objects (awscli does the same).
                session._session.get_component("response_parser_factory").set_parser_defaults(
                    timestamp_parser=lambda value: value)
                client = session.client("s3", config=Config(
                    max_pool_connections=2 * workers + 4, retries={"mode": "standard", "max_attempts": 5}))
        self.client = client
        self.threshold = max(multipart_threshold, _S3_MIN_PART)
        self.part_size = max(part_size, _S3_MIN_PART)
        self.config = TransferConfig(multipart_threshold=self.threshold, multipart_chunksize=self.part_size,
                                     max_concurrency=workers, use_threads=True, preferred_transfer_client="classic")
        self.manager = create_transfer_manager(client, self.config)

    # -- error translation: the one place botocore exceptions become gtrain's

    @contextlib.contextmanager
    def _errors(self, url: RemoteURL | None, key: str | None = None) -> Iterator[None]:
        try:
            yield
        except GtrainError:
            raise
        except Exception as e:  # noqa: BLE001 - translated or re-raised below
            raise self._translate(e, url, key) from e

    def _translate(self, e: Exception, url: RemoteURL | None, key: str | None) -> Exception:
        from botocore import exceptions as bx

        where = f"s3://{url.bucket}/{key}" if url is not None and key else (f"{url}" if url is not None else "S3")
        if isinstance(e, bx.NoCredentialsError | bx.PartialCredentialsError | bx.CredentialRetrievalError):
            return CredentialsError(f"no usable AWS credentials for {where}: {e}", hint=_CRED_HINT)
        if isinstance(e, bx.NoRegionError):
            return ConfigError(f"no AWS region configured for {where}", hint="set AWS_DEFAULT_REGION", field=self.fld)
        if isinstance(e, bx.EndpointConnectionError | bx.ConnectionClosedError | bx.ConnectTimeoutError
                      | bx.ReadTimeoutError):
            endpoint = getattr(getattr(getattr(self, "client", None), "meta", None), "endpoint_url", "?")
            return SyncError(f"cannot reach S3 at {endpoint} for {where}: {e}",
                             hint="check the network, AWS_ENDPOINT_URL and the region; re-run to resume")
        if isinstance(e, bx.FlexibleChecksumError):
            return SyncError(f"{where}: checksum mismatch on the wire: {e}", hint="re-run; nothing corrupt was kept")
        if isinstance(e, bx.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            msg = err.get("Message") or str(e)
            if code == "NoSuchBucket":
                bucket = err.get("BucketName") or (url.bucket if url else "?")
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
        if isinstance(e, bx.BotoCoreError):
            return SyncError(f"S3 request for {where} failed: {e}")
        from boto3 import exceptions as b3x

        if isinstance(e, b3x.RetriesExceededError | b3x.S3TransferFailedError | b3x.S3UploadFailedError):
            return SyncError(f"S3 transfer of {where} failed: {e}", hint="re-run to resume")
        return e

    # -- Backend

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        with self._errors(url):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=url.key_prefix)
            for page in pages:
                for o in page.get("Contents", []):
                    etag = _etag(o.get("ETag"))
                    yield RemoteObject(o["Key"], int(o["Size"]), etag, md5=_md5_of(etag))

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        from botocore.exceptions import ClientError

        with self._errors(url, key):
            try:
                r = self.client.head_object(Bucket=url.bucket, Key=key)
            except ClientError as e:
                if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return None
                raise
            return self._from_response(key, r)

    @staticmethod
    def _from_response(key: str, r: dict[str, Any]) -> RemoteObject:
        etag = _etag(r.get("ETag"))
        meta = {k.lower(): v for k, v in (r.get("Metadata") or {}).items()}
        return RemoteObject(key, int(r.get("ContentLength", 0)), etag, md5=_md5_of(etag, r),
                            sha256=meta.get(META_SHA256))

    def upload(self, path: Path, url: RemoteURL, key: str, *, size: int, digests: Digests,
               expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        metadata = {META_SHA256: digests.sha256}
        with self._errors(url, key):
            if size < self.threshold:
                with open(path, "rb") as f:
                    r = self.client.put_object(
                        Bucket=url.bucket, Key=key, Body=f, Metadata=metadata,
                        ContentMD5=base64.b64encode(bytes.fromhex(digests.md5)).decode())
                etag = _etag(r.get("ETag"))
                if _MD5_ETAG.match(etag) and _md5_of(etag, r) is not None and etag != digests.md5:
                    raise SyncError(f"s3://{url.bucket}/{key}: S3 stored md5 {etag}, we sent {digests.md5}",
                                    hint="the upload was corrupted; re-run")
                progress(size)
                return RemoteObject(key, size, etag, md5=_md5_of(etag, r), sha256=digests.sha256)
            self.manager.upload(str(path), url.bucket, key, {"Metadata": metadata},
                                [_Progress(progress)]).result()
            head = self.head(url, key)
        if head is None or head.size != size or head.sha256 != digests.sha256:
            raise SyncError(f"s3://{url.bucket}/{key}: not as uploaded afterwards (changed concurrently?)",
                            hint="re-run")
        return head

    def download(self, url: RemoteURL, obj: RemoteObject, dest: Path, *,
                 progress: Callable[[int], None]) -> tuple[RemoteObject, Digests | None]:
        import hashlib

        with self._errors(url, obj.key):
            if obj.size < self.threshold:
                # one GET pinned to the listed ETag; hashed while streaming, metadata from the same response
                r = self.client.get_object(Bucket=url.bucket, Key=obj.key, IfMatch=f'"{obj.version}"')
                sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
                with open(dest, "wb") as f:
                    for chunk in r["Body"].iter_chunks(1 << 20):
                        f.write(chunk)
                        sha.update(chunk)
                        md5.update(chunk)
                        progress(len(chunk))
                return self._from_response(obj.key, r), Digests(sha.hexdigest(), md5.hexdigest())
            head = self.head(url, obj.key)
            if head is None or head.version != obj.version:
                raise SyncError(f"s3://{url.bucket}/{obj.key} changed or disappeared during the sync",
                                hint="re-run to sync what is there now")
            # s3transfer pins its ranged GETs to one ETag itself; the engine then checks sha256 of the whole
            self.manager.download(url.bucket, obj.key, str(dest), {}, [_Progress(progress)]).result()
            return head, None

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        with self._errors(url):
            for i in range(0, len(keys), 1000):
                batch = keys[i:i + 1000]
                r = self.client.delete_objects(Bucket=url.bucket,
                                               Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
                errs = r.get("Errors") or []
                if errs:
                    e0 = errs[0]
                    raise SyncError(f"could not delete {len(errs)} object(s) under {url}; first "
                                    f"{e0.get('Key')!r}: {e0.get('Code')} {e0.get('Message', '')}".rstrip())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.manager.shutdown()


_progress_cls: type | None = None


def _Progress(cb: Callable[[int], None]) -> Any:  # noqa: N802 - reads like the class it builds
    """An s3transfer subscriber forwarding byte counts (class made on first use: s3transfer comes with boto3)."""
    global _progress_cls
    if _progress_cls is None:
        from s3transfer.subscribers import BaseSubscriber

        class Progress(BaseSubscriber):  # type: ignore[misc]
            def __init__(self, cb: Callable[[int], None]) -> None:
                self._cb = cb

            def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
                self._cb(bytes_transferred)

        _progress_cls = Progress
    return _progress_cls(cb)
