"""``gtrain sync`` with Azure Blob (``az://``) on Azurite (tests/fixtures/azurite.py; Shared Key checked), and
what the network does to it: a missing container, a wrong key, a body cut short, a 503 ServerBusy storm. A
clear error or a bounded retry; never a partial file, never a silent success. (The common contract:
test_sync_contract.py.)"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import ConfigError, CredentialsError, SyncError
from gtrain.sync.azwire import AzureWire, resolve_account
from gtrain.sync.objstore import sync
from tests.fixtures.azurite import ACCOUNT, KEY, Azurite
from tests.integration.test_sync_s3 import _Relay, leftovers, make_tree, read_tree

MiB = 1024 * 1024


@pytest.fixture
def container(azurite_env: Azurite) -> str:
    name = f"az-{uuid.uuid4().hex[:12]}"
    wire = AzureWire()
    wire.request("PUT", name, query={"restype": "container"}, ok=(201,))
    wire.close()
    return name


def through(relay: _Relay) -> Any:
    conn = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={relay.endpoint}/{ACCOUNT};")
    return lambda: AzureWire(resolve_account({"AZURE_STORAGE_CONNECTION_STRING": conn}), backoff=0.02)


def test_roundtrip_with_blocks_and_noop_resync(tmp_path: Path, container: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(src, n=10)
    files["big.bin"] = os.urandom(11 * MiB + 3)  # three blocks of 5 MiB
    (src / "big.bin").write_bytes(files["big.bin"])
    url = f"az://{container}/run"
    assert sync(str(src), url, multipart_threshold=5 * MiB, part_size=5 * MiB).uploaded == len(files)
    r = sync(str(src), url)
    assert (r.uploaded, r.skipped, r.hashed) == (0, len(files), 0)
    assert sync(url, str(dst), multipart_threshold=5 * MiB, part_size=5 * MiB).downloaded == len(files)
    assert read_tree(dst) == files and leftovers(dst) == []


def test_a_missing_container_is_a_config_error_naming_it(tmp_path: Path, azurite_env: Azurite) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(ConfigError, match="no-such-container") as e:
        sync(str(tmp_path / "src"), "az://no-such-container/x")
    assert e.value.field == "DST"
    with pytest.raises(ConfigError, match="no-such-container") as e:
        sync("az://no-such-container/x", str(tmp_path / "dst"))
    assert e.value.field == "SRC" and not (tmp_path / "dst").exists()


def test_a_wrong_key_or_no_account_is_a_credentials_error(tmp_path: Path, container: str, azurite: Azurite,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path / "src", n=2)
    wrong = KEY[:10] + ("A" if KEY[10] != "A" else "B") + KEY[11:]
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string.replace(KEY, wrong))
    with pytest.raises(CredentialsError, match="AuthorizationFailure|AuthenticationFailed|403"):
        sync(str(tmp_path / "src"), f"az://{container}/x")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    with pytest.raises(CredentialsError, match="AZURE_STORAGE_ACCOUNT") as e:
        sync(str(tmp_path / "src"), f"az://{container}/x")
    assert e.value.hint and "AZURE_STORAGE_KEY" in e.value.hint


@pytest.mark.parametrize("url", ["az://UPPER/x", "az://a--b/x", "az://ab/x", "az:container/x", "AZ://cont/x",
                                 "az://cont/a//b"])
def test_bad_az_urls_are_config_errors(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigError) as e:
        sync(str(tmp_path), url)
    assert e.value.field == "DST"


def test_a_body_cut_short_is_fetched_again_and_a_lasting_cut_keeps_nothing(tmp_path: Path, container: str,
                                                                           azurite_env: Azurite) -> None:
    cuts = {"victim.bin": 0, "always.bin": 0}

    def cut(h: Any, body: bytes | None, data: bytes) -> bool:
        name = h.path.split("?")[0].rpartition("/")[2]
        if not data or h.command != "GET" or name not in cuts or (name == "victim.bin" and cuts[name]):
            return False
        cuts[name] += 1
        h.wfile.write(data[: len(data) // 2])  # half the body, then the connection goes
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)
        h.close_connection = True
        return True

    wire = AzureWire()
    data = os.urandom(300_000)
    for name in ("victim.bin", "always.bin", "fine.txt"):
        wire.request("PUT", container, f"b/{name}", body=data if name != "fine.txt" else b"fine", ok=(201,),
                     headers={"x-ms-blob-type": "BlockBlob"})
    wire.close()
    relay = _Relay(azurite_env.endpoint.removeprefix("http://").partition("/")[0], cut)
    try:
        dst = tmp_path / "dst"
        with pytest.raises(SyncError, match="always.bin"):
            sync(f"az://{container}/b", str(dst), client_factory=through(relay))
        assert cuts == {"victim.bin": 1, "always.bin": 3}  # cut once then whole; cut on every one of 3 tries
        assert read_tree(dst) == {"victim.bin": data, "fine.txt": b"fine"} and leftovers(dst) == []
    finally:
        relay.close()


def test_a_server_busy_storm_is_ridden_out_then_a_lasting_one_fails(tmp_path: Path, container: str,
                                                                    azurite_env: Azurite) -> None:
    counts = {"refused": 0, "stormy": 0}
    err = (b"<?xml version='1.0'?><Error><Code>ServerBusy</Code><Message>The server is busy.</Message></Error>")

    def storm(h: Any, body: bytes | None, data: bytes) -> bool:
        if data:
            return False
        if "stormy" in h.path:
            counts["stormy"] += 1
        elif not (h.command == "PUT" and counts["refused"] < 8):
            return False
        counts["refused"] += 1
        h.send_response(503)
        h.send_header("x-ms-error-code", "ServerBusy")
        h.send_header("Content-Length", str(len(err)))
        h.end_headers()
        h.wfile.write(err)
        return True

    relay = _Relay(azurite_env.endpoint.removeprefix("http://").partition("/")[0], storm)
    try:
        src = tmp_path / "src"
        files = make_tree(src, n=6)
        assert sync(str(src), f"az://{container}/st", client_factory=through(relay)).uploaded == len(files)
        assert counts["refused"] == 8
        (src / "stormy.bin").write_bytes(b"s" * 100)
        with pytest.raises(SyncError, match="stormy.bin.*ServerBusy"):
            sync(str(src), f"az://{container}/st", client_factory=through(relay))
        assert counts["stormy"] == 5  # bounded
    finally:
        relay.close()


def test_the_node_bundle_downloads_az_with_the_stdlib_only(tmp_path: Path, container: str, azurite_env: Azurite
                                                           ) -> None:
    """What job.data runs on a node: the sync engine from gtrain's zip, ``python -S`` (no site-packages: no
    SDK, not even this checkout), downloading az:// with the account key."""
    import subprocess
    import sys

    from gtrain.jobs.data import DATA_MAIN, bundle

    wire = AzureWire()
    for i in range(3):
        wire.request("PUT", container, f"ds/part-{i}.txt", body=f"row {i}\n".encode(), ok=(201,),
                     headers={"x-ms-blob-type": "BlockBlob"})
    wire.close()
    pyz = tmp_path / "gtrain-sync.pyz"
    pyz.write_bytes(bundle())
    entries = f'[{{"src": "az://{container}/ds", "dst": "{tmp_path / "data"}", "delete": false}}]'
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "GTRAIN_HOME": str(tmp_path / "home"),
           "AZURE_STORAGE_CONNECTION_STRING": azurite_env.connection_string}
    p = subprocess.run([sys.executable, "-S", "-c", DATA_MAIN, str(pyz), entries], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr + p.stdout
    assert '"downloaded": 3' in p.stdout
    assert read_tree(tmp_path / "data") == {f"part-{i}.txt": f"row {i}\n".encode() for i in range(3)}
