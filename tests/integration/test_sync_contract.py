"""The sync contract, one set of tests for every store (S3 on SeaweedFS, GCS on fake-gcs-server, Azure Blob on
Azurite), each run twice: once with the other side of the sync (writing what gtrain downloads, reading what
gtrain uploaded) done through gtrain's own wire clients, once through the vendors' SDKs (boto3,
google-cloud-storage, azure-storage-blob). Where our wire clients drift from what the SDKs write or read
(metadata names, checksums, listings, multipart objects), a test here fails, not a user.

Contract: upload (content and sha256 metadata as the SDK sees them), no-change re-sync (nothing read or sent),
download (of objects the other side wrote, multipart ones too), delete mirror (within the prefix only), resume
(a killed download: the re-run moves only what is missing, leaves no temp file)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gtrain.sync.objstore import TMP_TAG, sync

MiB = 1024 * 1024
PARTS = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB}


class Store:
    """One bucket / container and the other side's operations on it, through ``via`` ("wire" or "sdk")."""

    scheme = ""
    meta_key = "gtrain-sha256"
    sdk: Any
    wire: Any

    def __init__(self, via: str) -> None:
        self.via = via
        self.bucket = f"ct-{uuid.uuid4().hex[:12]}"

    def url(self, prefix: str) -> str:
        return f"{self.scheme}://{self.bucket}/{prefix}"

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def keys(self, prefix: str) -> set[str]:
        raise NotImplementedError

    def sha256_meta(self, key: str) -> str | None:
        raise NotImplementedError

    def close(self) -> None:
        self.wire.close()
        self.sdk.close()


class S3(Store):
    scheme = "s3"

    def __init__(self, via: str) -> None:
        import boto3

        from gtrain.sync.s3wire import S3Wire

        super().__init__(via)
        # not the default session: it keeps the first credentials it saw (moto's, earlier in the run)
        self.sdk = boto3.session.Session().client("s3")
        self.wire = S3Wire()
        self.sdk.create_bucket(Bucket=self.bucket)

    def put(self, key: str, data: bytes) -> None:
        if self.via == "sdk":  # upload_fileobj: multipart past the threshold, as a user's tool writes it
            import io

            from boto3.s3.transfer import TransferConfig

            cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
            self.sdk.upload_fileobj(io.BytesIO(data), self.bucket, key, Config=cfg)
        else:
            self.wire.request("PUT", self.bucket, key, body=data)

    def get(self, key: str) -> bytes:
        if self.via == "sdk":
            return bytes(self.sdk.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        return self.wire.request("GET", self.bucket, key).body

    def keys(self, prefix: str) -> set[str]:
        from gtrain.sync import s3wire

        if self.via == "sdk":
            pages = self.sdk.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            return {o["Key"] for p in pages for o in p.get("Contents", [])}
        return {o.key for o in s3wire.list_objects(self.wire, self.bucket, prefix)}

    def sha256_meta(self, key: str) -> str | None:
        if self.via == "sdk":
            return self.sdk.head_object(Bucket=self.bucket, Key=key)["Metadata"].get(self.meta_key)
        return self.wire.request("HEAD", self.bucket, key).headers.get(f"x-amz-meta-{self.meta_key}")


class GCS(Store):
    scheme = "gs"

    def __init__(self, via: str) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        from gtrain.sync.gcswire import Wire

        super().__init__(via)
        self.sdk = storage.Client(project="gtrain-test", credentials=AnonymousCredentials())
        self.wire = Wire(self.sdk.api_endpoint)
        self.sdk.create_bucket(self.bucket)

    def _o(self, key: str = "") -> str:
        return f"/storage/v1/b/{self.bucket}/o" + (f"/{quote(key, safe='')}" if key else "")

    def put(self, key: str, data: bytes) -> None:
        if self.via == "sdk":
            blob = self.sdk.bucket(self.bucket).blob(key, chunk_size=1 * MiB if len(data) > 5 * MiB else None)
            blob.upload_from_string(data)
        else:
            self.wire.call_json("POST", self.wire.url(f"/upload/storage/v1/b/{self.bucket}/o",
                                                      {"uploadType": "media", "name": key}), body=data)

    def get(self, key: str) -> bytes:
        if self.via == "sdk":
            return bytes(self.sdk.bucket(self.bucket).blob(key).download_as_bytes())
        return bytes(self.wire.call("GET", self.wire.url(self._o(key), {"alt": "media"}),
                                    consume=lambda r: r.read()))

    def keys(self, prefix: str) -> set[str]:
        if self.via == "sdk":
            return {b.name for b in self.sdk.list_blobs(self.bucket, prefix=prefix)}
        doc = self.wire.call_json("GET", self.wire.url(self._o(), {"prefix": prefix}))
        return {i["name"] for i in doc.get("items", [])}

    def sha256_meta(self, key: str) -> str | None:
        if self.via == "sdk":
            blob = self.sdk.bucket(self.bucket).get_blob(key)
            return (blob.metadata or {}).get(self.meta_key)
        return self.wire.call_json("GET", self.wire.url(self._o(key), {})).get("metadata", {}).get(self.meta_key)


class Azure(Store):
    scheme = "az"
    meta_key = "gtrain_sha256"

    def __init__(self, via: str) -> None:
        from azure.storage.blob import BlobServiceClient

        from gtrain.sync.azwire import AzureWire

        super().__init__(via)
        conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        self.sdk = BlobServiceClient.from_connection_string(conn)
        self.sdk_small_blocks = BlobServiceClient.from_connection_string(conn, max_single_put_size=5 * MiB,
                                                                         max_block_size=4 * MiB)
        self.wire = AzureWire()
        self.sdk.create_container(self.bucket)

    def close(self) -> None:
        super().close()
        self.sdk_small_blocks.close()

    def put(self, key: str, data: bytes) -> None:
        if self.via == "sdk":  # blocks past 5 MiB, as a user's tool writes a large blob
            cc = self.sdk_small_blocks.get_container_client(self.bucket)
            cc.upload_blob(key, data, overwrite=True, max_concurrency=2)
        else:
            self.wire.request("PUT", self.bucket, key, body=data, ok=(201,), headers={"x-ms-blob-type": "BlockBlob"})

    def get(self, key: str) -> bytes:
        if self.via == "sdk":
            return bytes(self.sdk.get_blob_client(self.bucket, key).download_blob().readall())
        return self.wire.request("GET", self.bucket, key).body

    def keys(self, prefix: str) -> set[str]:
        from gtrain.sync import azwire

        if self.via == "sdk":
            return set(self.sdk.get_container_client(self.bucket).list_blob_names(name_starts_with=prefix))
        return {b.name for b in azwire.list_blobs(self.wire, self.bucket, prefix)}

    def sha256_meta(self, key: str) -> str | None:
        if self.via == "sdk":
            return self.sdk.get_blob_client(self.bucket, key).get_blob_properties().metadata.get(self.meta_key)
        return self.wire.request("HEAD", self.bucket, key).headers.get(f"x-ms-meta-{self.meta_key}")


@pytest.fixture(params=["s3-wire", "s3-sdk", "gs-wire", "gs-sdk", "az-wire", "az-sdk"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    kind, via = request.param.split("-")
    request.getfixturevalue({"s3": "weed_env", "gs": "gcs_emulator", "az": "azurite_env"}[kind])
    s: Store = {"s3": S3, "gs": GCS, "az": Azure}[kind](via)
    yield s
    s.close()


def tree(root: Path, big: bool = True) -> dict[str, bytes]:
    files = {f"f{i:02d}.bin": os.urandom(500 + 37 * i) for i in range(8)}
    files["sub/deeper/ünï code.txt"] = "ünïcode\n".encode()
    files["sub/empty"] = b""
    if big:
        files["big.bin"] = os.urandom(6 * MiB + 11)  # past the 5 MiB threshold: multipart / blocks / resumable
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_upload_then_no_change_resync(tmp_path: Path, store: Store) -> None:
    files = tree(tmp_path / "src")
    r = sync(str(tmp_path / "src"), store.url("up"), **PARTS)
    assert r.uploaded == len(files)
    assert store.keys("up/") == {f"up/{k}" for k in files}
    for rel, data in files.items():
        assert store.get(f"up/{rel}") == data, rel
    assert store.sha256_meta("up/big.bin") == hashlib.sha256(files["big.bin"]).hexdigest()
    assert store.sha256_meta("up/f03.bin") == hashlib.sha256(files["f03.bin"]).hexdigest()
    again = sync(str(tmp_path / "src"), store.url("up"), **PARTS)
    assert (again.uploaded, again.skipped, again.hashed) == (0, len(files), 0)


def test_download_of_what_the_other_side_wrote(tmp_path: Path, store: Store) -> None:
    files = {"a.txt": b"alpha", "d/b.bin": os.urandom(3000), "big.bin": os.urandom(6 * MiB + 5)}
    for rel, data in files.items():
        store.put(f"down/{rel}", data)
    dst = tmp_path / "dst"
    r = sync(store.url("down"), str(dst), **PARTS)
    assert r.downloaded == len(files) and read_tree(dst) == files
    again = sync(store.url("down"), str(dst), **PARTS)
    assert (again.downloaded, again.skipped, again.hashed) == (0, len(files), 0)
    # files already there (not vouched for by a manifest): compared, not fetched again
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_bytes(b"alpha")
    r = sync(store.url("down"), str(other), **PARTS)
    assert (r.downloaded, r.hashed) == (len(files) - 1, 1) and read_tree(other) == files


def test_delete_mirrors_within_the_prefix_only(tmp_path: Path, store: Store) -> None:
    files = tree(tmp_path / "src", big=False)
    store.put("mir/stale.txt", b"stale")
    store.put("mir/sub/stale2.txt", b"stale")
    store.put("mirror-sibling/keep.txt", b"keep")  # shares the prefix's letters, not its folder
    store.put("elsewhere/keep.txt", b"keep")
    r = sync(str(tmp_path / "src"), store.url("mir"), delete=True)
    assert (r.uploaded, r.deleted) == (len(files), 2)
    assert store.keys("mir/") == {f"mir/{k}" for k in files}
    assert store.keys("mirror-sibling/") == {"mirror-sibling/keep.txt"}
    assert store.keys("elsewhere/") == {"elsewhere/keep.txt"}
    dst = tmp_path / "dst"
    sync(store.url("mir"), str(dst))
    (dst / "local-extra.txt").write_bytes(b"x")
    assert sync(store.url("mir"), str(dst), delete=True).deleted == 1 and read_tree(dst) == files


KILLED = textwrap.dedent("""
    import os, sys
    from gtrain.sync.objstore import sync
    def die(ev):
        if ev.phase == "transfer" and ev.files_done >= 3:
            os._exit(17)  # killed mid-download: three files are in place, the rest not
    sync(sys.argv[1], sys.argv[2], workers=1, on_progress=die)
""")


def test_a_killed_download_resumes(tmp_path: Path, store: Store, repo_root: Path) -> None:
    files = {f"r{i:02d}.bin": os.urandom(2000 + i) for i in range(10)}
    for rel, data in files.items():
        store.put(f"res/{rel}", data)
    dst = tmp_path / "dst"
    p = subprocess.run([sys.executable, "-c", KILLED, store.url("res"), str(dst)], cwd=repo_root,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert p.returncode == 17, p.stderr
    held = read_tree(dst)
    assert 3 <= len(held) < len(files) and all(files[k] == v for k, v in held.items())
    r = sync(store.url("res"), str(dst))
    assert r.downloaded == len(files) - len(held), json.dumps(r.to_dict()["actions"])[:500]
    assert read_tree(dst) == files and not [p for p in dst.rglob("*") if TMP_TAG in p.name]
