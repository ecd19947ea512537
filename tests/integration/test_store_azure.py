"""`job.checkpoint_store` speaks az:// as `gtrain sync` and `job.data` do (issue 28: the docs and messages named
s3:// and gs:// only). A checkpoint goes up to Azurite (Microsoft's emulator, Shared Key checked) and is restored
from it through the same Store the nodes run; the spec and the store name all three schemes when refusing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gtrain.checkpoints.store import Store
from gtrain.errors import ConfigError, SyncError
from gtrain.spec import parse_spec
from gtrain.sync.azwire import AzureWire
from tests.fixtures.azurite import Azurite


def test_a_checkpoint_roundtrips_through_an_az_store(tmp_path: Path, azurite_env: Azurite) -> None:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    wire = AzureWire()
    wire.request("PUT", name, query={"restype": "container"}, ok=(201,))
    wire.close()
    url = f"az://{name}/runs"
    spec = parse_spec({"name": "azs", "provider": "local", "job": {"run": "t.py", "checkpoint_store": url}})
    assert spec.job is not None and spec.job.checkpoint_store == url
    src = tmp_path / "node0"
    (src / "step-10").mkdir(parents=True)
    (src / "step-10" / "model.pt").write_bytes(b"w" * 4096)
    (src / "step-10" / "opt.pt").write_bytes(b"o" * 1000)
    store = Store(url, "job-1")
    try:
        store.upload(0, src, "step-10", ["step-10/model.pt", "step-10/opt.pt"], attempt=1)
        (ck,) = store.checkpoints()
        assert ck.name == "step-10" and ck.complete
        got, _kept, nbytes = store.restore(ck, tmp_path / "restored")
    finally:
        store.close()
    assert sorted(got) == ["step-10/model.pt", "step-10/opt.pt"] and nbytes == 5096
    assert (tmp_path / "restored" / "step-10" / "model.pt").read_bytes() == b"w" * 4096


@pytest.mark.parametrize("bad", ["ftp://bucket/x", "gcs://bucket/x", "s3:/bucket"])
def test_a_bad_store_url_names_every_scheme(bad: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "azs", "provider": "local", "job": {"run": "t.py", "checkpoint_store": bad}})
    text = f"{e.value.message} {e.value.hint or ''}"
    assert "job.checkpoint_store" in text
    assert all(s in text for s in ("s3://", "gs://", "az://")), text


def test_the_store_itself_names_every_scheme(tmp_path: Path) -> None:
    with pytest.raises(SyncError) as e:
        Store(str(tmp_path), "job-1")  # a local path is not a store
    assert all(s in e.value.message for s in ("s3://", "gs://", "az://")), e.value.message
