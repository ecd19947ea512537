"""The shared state's conditional writes on GCS (fake-gcs-server, which enforces generation preconditions) and
Azure Blob (Azurite, which enforces ETag conditions), through ``gtrain.sync.condput``; then two homes on one
``gs://`` / ``az://`` state: what one records the other reads, and a name the other takes is refused."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import ConfigError
from gtrain.sharedstate import open_store
from gtrain.sync.condput import AzureCond, CondStore, Conflict, GCSCond
from gtrain.sync.model import RemoteURL


def _gcs(request: pytest.FixtureRequest) -> tuple[str, CondStore]:
    endpoint = request.getfixturevalue("gcs_emulator")
    name = f"state-{uuid.uuid4().hex[:12]}"
    req = urllib.request.Request(f"{endpoint}/storage/v1/b?project=gtrain-test", method="POST",
                                 data=json.dumps({"name": name}).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).close()
    return f"gs://{name}/team", GCSCond(RemoteURL("gs", name, "probe"))


def _az(request: pytest.FixtureRequest) -> tuple[str, CondStore]:
    request.getfixturevalue("azurite_env")
    name = f"state-{uuid.uuid4().hex[:12]}"
    store = AzureCond(RemoteURL("az", name, "probe"))
    store.wire.request("PUT", name, query={"restype": "container"}, ok=(201,))
    return f"az://{name}/team", store


@pytest.mark.parametrize("make", [_gcs, _az], ids=["gcs", "azure"])
def test_conditional_writes_and_two_homes(make: Any, request: pytest.FixtureRequest, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url, store = make(request)
    try:
        v1 = store.put("k.json", b"1", absent=True)
        with pytest.raises(Conflict):
            store.put("k.json", b"2", absent=True)
        v2 = store.put("k.json", b"3", match=v1)
        with pytest.raises(Conflict):
            store.put("k.json", b"4", match=v1)
        got = store.get("k.json")
        assert got is not None and (got.data, got.version) == (b"3", v2)
        assert store.list("") == {"k.json": v2} and store.get("none.json") is None
    finally:
        store.close()
    monkeypatch.setenv("GTRAIN_STATE", url)
    a, b = open_store(tmp_path / "a"), open_store(tmp_path / "b")
    try:
        c = a.create_cluster(name="team", provider="local", num_nodes=1, spec={"name": "team"})
        a.create_job(c.id, "team-job", {"run": "x.py"})
        seen = b.find_cluster("team")
        assert seen is not None and seen.id == c.id and [j.id for j in b.jobs(c.id)] == ["team-job"]
        b.update_job("team-job", status="succeeded", exit_code=0)  # B's refresh, A's next read sees it
        a.pull(force=True)  # type: ignore[attr-defined]
        assert a.get_job("team-job").status == "succeeded"
        with pytest.raises(ConfigError, match="already exists"):
            open_store(tmp_path / "c").create_cluster(name="team", provider="local", num_nodes=1, spec={})
    finally:
        a.close()
        b.close()
