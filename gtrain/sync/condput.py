"""Small JSON objects written only on a condition, over the sync engine's own wire clients (``s3wire``,
``gcswire``, ``azwire``): what the shared state store (``gtrain.sharedstate``) is built on.

Each store answers four calls, keys relative to the URL's prefix:

- ``get(key) -> Obj | None`` (the body and its version: S3/Azure ETag, GCS generation);
- ``put(key, data, match=VERSION | None, absent=False) -> version``: ``absent`` creates only where nothing is
  (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure ``If-None-Match: *``); ``match`` replaces only
  that version (S3 / Azure ``If-Match``, GCS ``ifGenerationMatch``). Another writer got there first:
  :class:`Conflict` (S3 412 ``PreconditionFailed`` or 409 ``ConditionalRequestConflict``; GCS 412; Azure 412
  ``ConditionNotMet`` or 409 ``BlobAlreadyExists``);
- ``list(prefix) -> {key: version}`` (one listing, every page);
- ``delete(key)``.

References: S3 conditional writes, https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html;
GCS preconditions, https://cloud.google.com/storage/docs/request-preconditions; Azure conditional headers,
https://learn.microsoft.com/rest/api/storageservices/specifying-conditional-headers-for-blob-service-operations.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from gtrain.sync.model import RemoteURL

#: seconds one request of the shared state may wait for an answer: its objects are small, and a store that does
#: not answer (or refuses) fails the command at once instead of after the sync engine's retries
TIMEOUT_S = 5.0


class Conflict(Exception):
    """The object's version was not the one the write was conditional on: another writer won."""


@dataclass(frozen=True)
class Obj:
    data: bytes
    version: str


class CondStore(Protocol):
    url: RemoteURL

    def get(self, key: str) -> Obj | None: ...

    def put(self, key: str, data: bytes, *, match: str | None = None, absent: bool = False) -> str: ...

    def list(self, prefix: str = "") -> dict[str, str]: ...

    def delete(self, key: str) -> None: ...

    def close(self) -> None: ...


def _root(url: RemoteURL) -> str:
    return f"{url.prefix}/" if url.prefix else ""


class S3Cond:
    def __init__(self, url: RemoteURL) -> None:
        from gtrain.sync.s3wire import S3Wire

        self.url, self.root, self.wire = url, _root(url), S3Wire(timeout=TIMEOUT_S, fail_fast=True)

    def get(self, key: str) -> Obj | None:
        from gtrain.sync.s3wire import S3WireError

        try:
            r = self.wire.request("GET", self.url.bucket, self.root + key)
        except S3WireError as e:
            if e.status == 404:
                return None
            raise
        return Obj(r.body, r.headers.get("etag", "").strip('"'))

    def put(self, key: str, data: bytes, *, match: str | None = None, absent: bool = False) -> str:
        from gtrain.sync.s3wire import S3WireError, md5_b64

        h = {"content-type": "application/json", "content-md5": md5_b64(data)}
        if absent:
            h["if-none-match"] = "*"
        elif match is not None:
            h["if-match"] = f'"{match}"'
        try:
            r = self.wire.request("PUT", self.url.bucket, self.root + key, headers=h, body=data)
        except S3WireError as e:
            if e.status == 412 or (e.status == 409 and e.code == "ConditionalRequestConflict"):
                raise Conflict(key) from None
            if e.status == 404 and match is not None:  # the object went away under an If-Match
                raise Conflict(key) from None
            raise
        return r.headers.get("etag", "").strip('"')

    def list(self, prefix: str = "") -> dict[str, str]:
        from gtrain.sync.s3wire import list_objects

        n = len(self.root)
        return {o.key[n:]: o.etag for o in list_objects(self.wire, self.url.bucket, self.root + prefix)}

    def delete(self, key: str) -> None:
        self.wire.request("DELETE", self.url.bucket, self.root + key, ok=(200, 204, 404))

    def close(self) -> None:
        self.wire.close()


class GCSCond:
    """The JSON API through ``gcswire.Wire``; the endpoint is ``STORAGE_EMULATOR_HOST`` when set."""

    def __init__(self, url: RemoteURL) -> None:
        from gtrain.sync.gcswire import Wire

        self.url, self.root = url, _root(url)
        # the endpoint: gcswire.default_endpoint() (STORAGE_EMULATOR_HOST when set)
        self.wire = Wire(maxsize=8, timeout=(TIMEOUT_S, TIMEOUT_S), fail_fast=True)
        self._b = urllib.parse.quote(url.bucket, safe="")

    def _o(self, key: str) -> str:
        return urllib.parse.quote(self.root + key, safe="")

    def get(self, key: str) -> Obj | None:
        url = self.wire.url(f"/storage/v1/b/{self._b}/o/{self._o(key)}", {"alt": "media"})
        out: Obj | None = self.wire.call("GET", url, allow=(404,), consume=lambda r: None if r.status == 404 else
                                         Obj(r.read(), str(r.headers.get("x-goog-generation", ""))))
        return out

    def put(self, key: str, data: bytes, *, match: str | None = None, absent: bool = False) -> str:
        # a multipart upload (metadata + body in one request; fake-gcs-server checks preconditions on this
        # form only, GCS on every form): https://cloud.google.com/storage/docs/uploading-objects#uploading-an-object
        q = {"uploadType": "multipart"}
        if absent:
            q["ifGenerationMatch"] = "0"
        elif match is not None:
            q["ifGenerationMatch"] = match
        boundary = f"gtrain-{uuid.uuid4().hex}"
        meta = json.dumps({"name": self.root + key, "contentType": "application/json"})
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n"
                f"--{boundary}\r\nContent-Type: application/json\r\n\r\n").encode() + data + \
            f"\r\n--{boundary}--\r\n".encode()
        url = self.wire.url(f"/upload/storage/v1/b/{self._b}/o", q)
        got: dict[str, Any] | None = self.wire.call(
            "POST", url, body=body, headers={"Content-Type": f"multipart/related; boundary={boundary}"},
            allow=(412,), consume=lambda r: None if r.status == 412 else json.loads(r.read()))
        if got is None:
            raise Conflict(key)
        return str(got["generation"])

    def list(self, prefix: str = "") -> dict[str, str]:
        out: dict[str, str] = {}
        token = ""
        n = len(self.root)
        while True:
            q = {"prefix": self.root + prefix, "fields": "items(name,generation),nextPageToken"}
            if token:
                q["pageToken"] = token
            page = self.wire.call_json("GET", self.wire.url(f"/storage/v1/b/{self._b}/o", q))
            for it in page.get("items", []):
                out[str(it["name"])[n:]] = str(it["generation"])
            token = page.get("nextPageToken") or ""
            if not token:
                return out

    def delete(self, key: str) -> None:
        url = self.wire.url(f"/storage/v1/b/{self._b}/o/{self._o(key)}", {})
        self.wire.call("DELETE", url, allow=(404,), consume=lambda r: r.read())

    def close(self) -> None:
        self.wire.close()


class AzureCond:
    def __init__(self, url: RemoteURL) -> None:
        from gtrain.sync.azwire import AzureWire

        self.url, self.root, self.wire = url, _root(url), AzureWire(timeout=TIMEOUT_S, fail_fast=True)

    def get(self, key: str) -> Obj | None:
        r = self.wire.request("GET", self.url.bucket, self.root + key, ok=(200, 404))
        if r.status == 404:
            return None
        return Obj(r.body, r.headers.get("etag", "").strip('"'))

    def put(self, key: str, data: bytes, *, match: str | None = None, absent: bool = False) -> str:
        from gtrain.sync.azwire import AzureWireError

        h = {"x-ms-blob-type": "BlockBlob", "content-type": "application/json"}
        if absent:
            h["if-none-match"] = "*"
        elif match is not None:
            h["if-match"] = f'"{match}"'
        try:
            r = self.wire.request("PUT", self.url.bucket, self.root + key, headers=h, body=data, ok=(201,))
        except AzureWireError as e:
            if e.status in (409, 412) or (e.status == 404 and match is not None):
                raise Conflict(key) from None
            raise
        return r.headers.get("etag", "").strip('"')

    def list(self, prefix: str = "") -> dict[str, str]:
        from gtrain.sync.azwire import list_blobs

        n = len(self.root)
        return {b.name[n:]: b.etag for b in list_blobs(self.wire, self.url.bucket, self.root + prefix)}

    def delete(self, key: str) -> None:
        self.wire.request("DELETE", self.url.bucket, self.root + key, ok=(202, 404))

    def close(self) -> None:
        self.wire.close()


def open_store(url: RemoteURL) -> CondStore:
    """The conditional-write client of ``url`` (s3://, gs:// or az://)."""
    if url.scheme == "s3":
        return S3Cond(url)
    if url.scheme == "gs":
        return GCSCond(url)
    return AzureCond(url)
