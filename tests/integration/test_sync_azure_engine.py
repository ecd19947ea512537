"""The compiled Azure Blob engine (obstore, gtrain/sync/azfast.py) on Azurite (Shared Key checked): chosen by
default where installed, what it writes is what the wire client writes (``gtrain_sha256`` metadata, blocks for a
large file) and what azure-storage-blob reads, a body a relay cuts short is fetched again and a lasting cut keeps
nothing, a throttling storm is ridden out; GTRAIN_SYNC_ENGINE=wire and a proxy still select the stdlib client.
(The rest of Azure's behaviour, on whichever engine is the default: test_sync_azure.py, test_sync_contract.py.)"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import CredentialsError, SyncError
from gtrain.sync.azfast import ObstoreAzureBackend
from gtrain.sync.azure import AzureBackend
from gtrain.sync.objstore import make_backend, parse_location, sync
from tests.fixtures.azurite import ACCOUNT, KEY, Azurite
from tests.integration.test_sync_azure import container  # noqa: F401 - the fixture
from tests.integration.test_sync_s3 import _Relay, leftovers, read_tree

MiB = 1024 * 1024


def _backend(url: str) -> Any:
    loc = parse_location(url, "DST")
    assert not isinstance(loc, Path)
    b = make_backend(loc, fld="DST")
    b.close()
    return b


def test_obstore_is_the_azure_engine_and_writes_what_the_wire_writes(tmp_path: Path, container: str,  # noqa: F811
                                                                     azurite_env: Azurite) -> None:
    from azure.storage.blob import BlobServiceClient

    assert type(_backend(f"az://{container}/x")) is ObstoreAzureBackend
    src = tmp_path / "src"
    files = {f"d/f{i}.bin": os.urandom(100 + i) for i in range(12)}
    files["big.bin"] = os.urandom(3 * MiB + 11)  # blocks of 1 MiB, 4 at once
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    parts = {"multipart_threshold": 1 * MiB, "part_size": 1 * MiB}
    assert sync(str(src), f"az://{container}/x", workers=4, **parts).uploaded == len(files)
    sdk = BlobServiceClient.from_connection_string(azurite_env.connection_string).get_container_client(container)
    for rel in ("d/f7.bin", "big.bin"):
        blob = sdk.get_blob_client(f"x/{rel}")
        assert blob.get_blob_properties().metadata["gtrain_sha256"] == hashlib.sha256(files[rel]).hexdigest()
        assert blob.download_blob().readall() == files[rel]
    assert len(sdk.get_blob_client("x/big.bin").get_block_list()[0]) == 4
    assert sync(str(src), f"az://{container}/x").skipped == len(files)  # no-change: one listing
    r = sync(f"az://{container}/x", str(tmp_path / "dst"), **parts)
    assert r.downloaded == len(files) and read_tree(tmp_path / "dst") == files
    (src / "d" / "f7.bin").unlink()
    assert sync(str(src), f"az://{container}/x", delete=True).deleted == 1
    assert "x/d/f7.bin" not in {b.name for b in sdk.list_blobs(name_starts_with="x/")}


def test_wire_engine_when_asked(azurite_env: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_SYNC_ENGINE", "wire")
    assert type(_backend("az://some-container/x")) is AzureBackend
    monkeypatch.delenv("GTRAIN_SYNC_ENGINE")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # proxies stay on the wire client (CONNECT, auth)
    assert type(_backend("az://some-container/x")) is AzureBackend


def test_obstore_refetches_a_cut_body_rides_out_busy_and_keeps_nothing_partial(
        tmp_path: Path, container: str, azurite_env: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Through a relay in front of Azurite: one small GET and one ranged GET cut in half once (fetched again),
    one blob cut on every try (the sync fails naming it, nothing partial kept), the first PUTs answered 503
    ServerBusy (ridden out)."""
    cuts: dict[str, int] = {}
    busy = {"left": 4}
    err = b"<?xml version='1.0'?><Error><Code>ServerBusy</Code><Message>The server is busy.</Message></Error>"

    def intercept(h: Any, body: bytes | None, data: bytes) -> bool:
        name = h.path.split("?")[0].rpartition("/")[2]
        if not data and h.command == "PUT" and busy["left"] > 0:
            busy["left"] -= 1
            h.send_response(503)
            h.send_header("x-ms-error-code", "ServerBusy")
            h.send_header("Content-Length", str(len(err)))
            h.end_headers()
            h.wfile.write(err)
            return True
        if not data or h.command != "GET" or not name.endswith(".bin"):
            return False
        if name != "always.bin" and cuts.get(h.path + h.headers.get("x-ms-range", h.headers.get("range", ""))):
            return False
        cuts[h.path + h.headers.get("x-ms-range", h.headers.get("range", ""))] = 1
        h.wfile.write(data[: len(data) // 2])  # half the body, then the connection goes
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)
        h.close_connection = True
        return True

    relay = _Relay(azurite_env.endpoint.removeprefix("http://").partition("/")[0], intercept)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};"
                                                          f"AccountKey={KEY};BlobEndpoint={relay.endpoint}/{ACCOUNT};")
    try:
        src, dst = tmp_path / "src", tmp_path / "dst"
        src.mkdir()
        files = {"small.bin": os.urandom(300_000), "big.bin": os.urandom(2 * MiB + 5), "fine.txt": b"fine"}
        for rel, data in files.items():
            (src / rel).write_bytes(data)
        parts = {"multipart_threshold": 1 * MiB, "part_size": 1 * MiB}
        assert type(_backend(f"az://{container}/c")) is ObstoreAzureBackend
        assert sync(str(src), f"az://{container}/c", **parts).uploaded == 3 and busy["left"] == 0
        r = sync(f"az://{container}/c", str(dst), **parts)
        assert r.downloaded == 3 and read_tree(dst) == files
        assert len(cuts) >= 3  # the small GET and at least two ranged GETs were cut once each
        (src / "always.bin").write_bytes(os.urandom(200_000))
        assert sync(str(src), f"az://{container}/c", **parts).uploaded == 1
        with pytest.raises(SyncError, match="always.bin"):
            sync(f"az://{container}/c", str(dst), **parts)
        assert not (dst / "always.bin").exists() and leftovers(dst) == []
    finally:
        relay.close()


def test_a_sas_token_alone_syncs_on_obstore(tmp_path: Path, container: str, azurite: Azurite,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """AZURE_STORAGE_ACCOUNT + AZURE_STORAGE_SAS_TOKEN (a container SAS made with azure-storage-blob), no key."""
    import datetime

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(ACCOUNT, container, account_key=KEY,
                                 permission=ContainerSasPermissions(read=True, write=True, delete=True, list=True),
                                 expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", sas)
    monkeypatch.setenv("AZURE_STORAGE_BLOB_ENDPOINT", azurite.endpoint)
    assert type(_backend(f"az://{container}/sas")) is ObstoreAzureBackend
    src = tmp_path / "src"
    src.mkdir()
    files = {"a.bin": os.urandom(1000), "b.txt": b"b"}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    assert sync(str(src), f"az://{container}/sas").uploaded == 2
    assert sync(f"az://{container}/sas", str(tmp_path / "dst")).downloaded == 2
    assert read_tree(tmp_path / "dst") == files
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", sas.replace("sig=", "sig=AA"))
    with pytest.raises(CredentialsError):
        sync(str(src), f"az://{container}/sas2")
