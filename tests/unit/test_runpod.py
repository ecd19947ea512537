"""The runpod provider's pieces without a network: the create-pod body against RunPod's published schema, the GPU
catalog's prices and the type a spec picks, the pod's billed cost, the SSH endpoint, the errors at the edge, where
the API key is read from, the ``runpod:`` section, and the plan (an Instant Cluster for num_nodes > 1; spot refused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import CapacityError, ConfigError, CredentialsError, ProviderError, QuotaError
from gtrain.providers.cloud.errors import code_of
from gtrain.providers.runpod import api as rapi
from gtrain.providers.runpod import gpus as rg
from gtrain.providers.runpod.clusters import cluster_body, overlay_ip, rank_of
from gtrain.providers.runpod.options import DEFAULT_IMAGE, runpod_options
from gtrain.providers.runpod.provider import RunPodProvider, pod_body, pod_price, ssh_direct
from gtrain.providers.runpod.teardown import owner_of_cluster, owner_of_pod
from gtrain.spec import parse_spec
from tests.fixtures.api_rules import RUNPOD_CREATE_CLUSTER, RUNPOD_CREATE_POD, violations

CATALOG: list[dict[str, Any]] = [
    {"id": "NVIDIA H100 80GB HBM3", "name": "H100 SXM", "memory": 80, "secure": True, "community": False,
     "price": {"secure": 2.69, "community": 0.0}, "maxCount": {"secure": 8, "community": 0}},
    {"id": "NVIDIA H100 PCIe", "name": "H100 PCIe", "memory": 80, "secure": True, "community": True,
     "price": {"secure": 2.39, "community": 1.99}, "maxCount": {"secure": 8, "community": 4}},
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "memory": 24, "secure": True, "community": True,
     "price": {"secure": 0.69, "community": 0.34}, "maxCount": {"secure": 8, "community": 8}},
    {"name": "no id: skipped"},
]


@pytest.fixture(autouse=True)
def _runpod_registered() -> Any:
    """``provider: runpod`` parses whether or not gtrain/registry.py lists it yet (registered at run time if not)."""
    from gtrain.providers import register, unregister
    from gtrain.registry import REGISTRY

    if "runpod" in REGISTRY:
        yield
        return
    register("runpod", "gtrain.providers.runpod:RunPodProvider")
    try:
        yield
    finally:
        unregister("runpod")


def res(**kw: Any) -> Any:
    return parse_spec({"name": "r", "provider": "runpod", "resources": kw}).resources


def test_the_create_body_is_what_the_published_schema_allows() -> None:
    opts = runpod_options({"cloud": "COMMUNITY"})
    body = pod_body("c0ffee", 0, "NVIDIA H100 PCIe", 2, opts, "ssh-ed25519 AAAA k", 100, "US-TX-3")
    assert violations(body, RUNPOD_CREATE_POD) == []
    assert body == {"name": "gtrain-c0ffee-0", "image": DEFAULT_IMAGE, "gpu": {"id": "NVIDIA H100 PCIe", "count": 2},
                    "cloud": "COMMUNITY", "ports": ["22/tcp"], "disk": 100, "startSsh": True,
                    "env": {"PUBLIC_KEY": "ssh-ed25519 AAAA k", "GTRAIN_CLUSTER_ID": "c0ffee"},
                    "dataCenterIds": ["US-TX-3"]}
    assert "dataCenterIds" not in pod_body("c", 1, "x", 1, opts, "k", 10, None)  # RunPod's scheduler picks
    assert owner_of_pod(body | {"id": "p"}) == ("c0ffee", 0)
    assert owner_of_pod({"name": "gtrain-c0ffee-0", "env": {"GTRAIN_CLUSTER_ID": "other"}}) is None
    assert owner_of_pod({"name": "my pod", "env": {}}) is None


def test_the_instant_cluster_body_and_its_members() -> None:
    body = cluster_body("c0ffee", "NVIDIA H100 80GB HBM3", 8, 4, runpod_options(None), "ssh-ed25519 AAAA k", 200,
                        "US-TX-3")
    assert violations(body, RUNPOD_CREATE_CLUSTER) == []
    assert body["name"] == "gtrain-c0ffee" and body["type"] == "TRAINING" and "cloud" not in body
    assert body["compute"] == {"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCountPerPod": 8, "podCount": 4}
    assert body["env"] == {"PUBLIC_KEY": "ssh-ed25519 AAAA k", "GTRAIN_CLUSTER_ID": "c0ffee"}
    assert owner_of_cluster(body) == "c0ffee" and owner_of_cluster({"name": "my cluster"}) is None
    member = {"cluster": {"id": "cl_1", "rank": 3, "ip": "10.65.0.5"}}
    assert (rank_of(member), overlay_ip(member)) == (3, "10.65.0.5")
    assert rank_of({"cluster": {"id": "cl_1", "rank": None}}) is None and rank_of({}) is None


def test_catalog_prices_and_the_type_a_spec_picks() -> None:
    types = rg.parse(CATALOG)
    assert [t.id for t in types] == ["NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"]
    sxm = next(t for t in types if t.name == "H100 SXM")
    assert sxm.price("SECURE", 8) == 21.52 and sxm.price("COMMUNITY", 1) is None  # 0 / not offered: no price
    t, n = rg.choose(types, res(accelerators="H100:2"), "SECURE")
    assert (t.id, n, t.price("SECURE", n)) == ("NVIDIA H100 PCIe", 2, 4.78)  # the cheapest H100 on the cloud
    t, n = rg.choose(types, res(accelerators="H100SXM:8"), "SECURE")
    assert t.id == "NVIDIA H100 80GB HBM3"
    t, n = rg.choose(types, res(instance_type="NVIDIA GeForce RTX 4090"), "COMMUNITY")
    assert (t.name, n, t.price("COMMUNITY", n)) == ("RTX 4090", 1, 0.34)
    with pytest.raises(ConfigError) as e:
        rg.choose(types, res(accelerators="H100:8"), "COMMUNITY")
    assert e.value.field == "resources.accelerators" and "maximum 4" in e.value.message
    with pytest.raises(ConfigError) as e:
        rg.choose(types, res(accelerators="T4:1"), "SECURE")
    assert "no GPU type named 'T4'" in e.value.message
    with pytest.raises(ConfigError) as e:
        rg.choose(types, res(instance_type="NVIDIA T4"), "SECURE")
    assert e.value.field == "resources.instance_type"


def test_the_pods_billed_cost_and_ssh_endpoint() -> None:
    assert pod_price({"cost": 0.759}) == 0.759
    for bad in ({"cost": 0.0}, {"cost": True}, {"cost": "0.5"}, {}):
        assert pod_price(bad) is None, bad  # EXITED/TERMINATED pods cost 0.0: the catalog price stands
    assert ssh_direct({"ssh": {"proxy": None, "direct": {"host": "45.23.12.1", "port": 43210, "username": "root"}}}) \
        == ("45.23.12.1", 43210)
    assert ssh_direct({"ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22}, "direct": None}}) is None
    assert ssh_direct({}) is None


def test_errors_at_the_edge_carry_the_status_and_never_the_key() -> None:
    e = rapi.translate(401, {"title": "Unauthorized", "status": 401, "detail": "invalid api key"}, "list pods")
    assert isinstance(e, CredentialsError) and "RUNPOD_API_KEY" in (e.hint or "") and code_of(e) == "401"
    assert isinstance(rapi.translate(402, {"detail": "insufficient balance"}, "create pod x"), QuotaError)
    cap = rapi.translate(400, {"detail": "could not be placed"}, "create pod x (A40 in US-TX-3)")
    assert isinstance(cap, CapacityError) and "could not be placed" in cap.message
    bad = rapi.translate(422, {"detail": "Request validation failed.", "errors": ["$: additional properties 'x' "
                                                                                   "not allowed"]}, "create pod x")
    assert type(bad) is ProviderError and "additional properties 'x'" in bad.message and code_of(bad) == "422"
    assert type(rapi.translate(400, None, "get pod p")) is ProviderError
    assert rapi.is_gone(rapi.translate(404, {"detail": "pod not found"}, "get pod p"))
    assert "rate limit" in rapi.translate(429, None, "list pods").message
    api = rapi.RunPodAPI(key="rpa_secret", base_url="https://example.invalid/v2")
    assert "rpa_secret" not in api.base_url


def test_the_key_from_the_environment_then_runpodctls_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    assert rapi.key_source() is None
    with pytest.raises(rapi.NoAPIKey):
        rapi.api_key()
    (tmp_path / ".runpod").mkdir()
    cfg = tmp_path / ".runpod" / "config.toml"
    cfg.write_text("this is [not toml")
    assert rapi.key_source() is None
    cfg.write_text('apikey = "rpa_from_file"\napiurl = "https://api.runpod.io/graphql"\n')
    assert rapi.key_source() == ("rpa_from_file", "~/.runpod/config.toml")
    monkeypatch.setenv("RUNPOD_API_KEY", " rpa_env ")
    assert rapi.key_source() == ("rpa_env", "RUNPOD_API_KEY")
    monkeypatch.setenv("RUNPOD_API_URL", "https://rest.runpod.io/v1")  # runpodctl's v1 base: not gtrain's
    assert rapi.RunPodAPI(key="k").base_url == rapi.BASE_URL


def test_the_runpod_section() -> None:
    o = runpod_options(None)
    assert (o.cloud, o.ssh_user, o.image) == ("SECURE", "root", DEFAULT_IMAGE)
    assert o.idle_command[0] == "sh" and "runpodctl stop pod" in o.idle_command[-1]
    for bad, field in (({"cloud": "ALL"}, "runpod.cloud"), ({"ssh_cidr": "10.0.0.0/8"}, "runpod.ssh_cidr"),
                       ({"image": "a b"}, "runpod.image"), ({"bogus": 1}, "runpod.bogus")):
        with pytest.raises(ConfigError) as e:
            runpod_options(bad)
        assert e.value.field == field, (bad, e.value.field)


class StubAPI:
    def gpu_types(self) -> list[dict[str, Any]]:
        return CATALOG


def test_the_plan_prices_from_the_catalog_and_refuses_what_is_not_built(gtrain_home: Path) -> None:
    from gtrain.state import StateStore

    store = StateStore()
    try:
        p = RunPodProvider(store, api=StubAPI())  # type: ignore[arg-type]
        plan = p.plan(parse_spec({"name": "r", "provider": "runpod",
                                  "resources": {"accelerators": "RTX4090:2", "regions": ["EU-RO-1", "US-TX-3"]}}))
        assert (plan.instance_type, plan.gpus_per_node, plan.price_per_hour, plan.region, plan.market) == \
            ("NVIDIA GeForce RTX 4090", 2, 1.38, "EU-RO-1", "on-demand")
        assert any("next (US-TX-3)" in n for n in plan.notes), plan.notes
        two = p.plan(parse_spec({"name": "r", "provider": "runpod", "num_nodes": 2,
                                 "resources": {"accelerators": "H100:8"}}))
        assert (two.num_nodes, two.price_per_hour, two.cluster_price_per_hour) == (2, 19.12, 38.24)
        assert any("Instant Cluster" in n for n in two.notes), two.notes
        for over, field in (({"num_nodes": 2, "runpod": {"cloud": "COMMUNITY"}}, "runpod.cloud"),
                            ({"num_nodes": {"min": 2, "max": 4}}, "num_nodes"),
                            ({"resources": {"accelerators": "A40:1", "use_spot": True}}, "resources.use_spot"),
                            ({"resources": {"accelerators": "A40:1", "image_id": "ami-1"}}, "resources.image_id"),
                            ({"resources": {"accelerators": "A40:1", "zones": ["us-east-1a"]}}, "resources.zones"),
                            ({"resources": {"accelerators": "A40:1", "region": "us-east-1"}}, "resources.region")):
            with pytest.raises(ConfigError) as e:
                p.plan(parse_spec({"name": "r", "provider": "runpod", **over}))
            assert e.value.field == field, (over, e.value.field)
    finally:
        store.close()


def test_offline_the_plan_prices_from_the_bundled_list_marked_as_such(gtrain_home: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No key (or no network): a dry run / any_of still prices RunPod, from the dated bundled list, and says so;
    `up` itself still needs the live list."""
    from gtrain.providers.runpod import api as rapi
    from gtrain.providers.runpod.gpus import snapshot
    from gtrain.state import StateStore

    monkeypatch.delenv(rapi.ENV_KEY, raising=False)
    monkeypatch.setenv("HOME", str(gtrain_home))  # no ~/.runpod/config.toml
    types, date = snapshot()
    assert len(types) >= 8 and date.startswith("20")
    store = StateStore()
    try:
        p = RunPodProvider(store)
        spec = parse_spec({"name": "r", "provider": "runpod", "resources": {"accelerators": "H100:8"}})
        plan = p.plan(spec)
        assert plan.instance_type == "NVIDIA H100 PCIe" and plan.price_per_hour == 19.12
        assert any(n.startswith("OFFLINE") and date in n and "estimate" in n for n in plan.notes), plan.notes
        with pytest.raises(rapi.NoAPIKey):
            p._choose(spec, runpod_options(None))
    finally:
        store.close()
