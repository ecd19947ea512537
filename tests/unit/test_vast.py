"""The vast provider's pieces without a network: what an offer bills (on-demand and a bid, the disk's storage in
it), which offers the caps let ``up`` take, the GPU names a spec's short name means, an instance's status (an
outbid bid is preempted), the create body against the fields and enums the fake takes from Vast's reference, the
error answers as gtrain errors (never the key), where the API key is read from, the ``vast:`` section, and the
refusals a plan makes before it asks the API anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import CapacityError, ConfigError, CredentialsError, ProviderError, QuotaError
from gtrain.providers.vast import api as vapi
from gtrain.providers.vast import offers as vo
from gtrain.providers.vast.options import vast_options
from gtrain.providers.vast.provider import VastProvider, instance_body, ssh_direct, status_of
from gtrain.providers.vast.teardown import owner
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_vast import CREATE_FIELDS, RUNTYPES, TARGET_STATES

ROWS: list[dict[str, Any]] = [
    {"id": 1, "machine_id": 11, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_base": 0.30,
     "dph_total": 0.32, "min_bid": 0.12, "reliability2": 0.99, "geolocation": "Texas, US"},
    {"id": 2, "machine_id": 12, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_base": 0.20,
     "dph_total": 0.23, "min_bid": 0.10, "reliability2": 0.80, "geolocation": "Oslo, NO"},
    {"id": 3, "machine_id": 13, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_base": 0.90,
     "dph_total": 0.95, "min_bid": 0.40, "reliability": 0.995, "geolocation": "Berlin, DE"},
    {"id": 4, "machine_id": 14, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_base": 0.30, "dph_total": 0.32,
     "min_bid": None, "reliability2": 0.999, "geolocation": "Quebec, CA"},
    {"id": "x", "dph_total": 1.0},  # not an offer: skipped
    {"id": 5, "dph_total": 0},  # no price: skipped
]


@pytest.fixture(autouse=True)
def _vast_registered() -> Any:
    from gtrain.providers import register, unregister
    from gtrain.registry import REGISTRY

    if "vast" in REGISTRY:
        yield
        return
    register("vast", "gtrain.providers.vast:VastProvider")
    try:
        yield
    finally:
        unregister("vast")


def test_what_an_offer_bills_on_demand_and_as_a_bid() -> None:
    offers = vo.parse(ROWS)
    assert [o.id for o in offers] == [1, 2, 3, 4]
    o = offers[0]
    assert (o.country, o.gpu_ram_gb, o.storage_per_hour()) == ("US", 24.0, pytest.approx(0.02))
    assert o.price(vast_options({}), spot=False) == 0.32  # dph_total: what renting it bills
    assert o.price(vast_options({}), spot=True) == pytest.approx(0.14)  # min_bid + the storage part
    assert o.price(vast_options({"bid_usd_per_hour": 0.2}), spot=True) == pytest.approx(0.22)
    assert offers[3].price(vast_options({}), spot=True) is None  # no min_bid: no bid to make
    assert offers[2].reliability == 0.995  # ``reliability`` when the offer has no ``reliability2``


def test_the_caps_skip_offers_above_them_cheapest_first() -> None:
    offers = vo.parse(ROWS)
    picks, skipped = vo.choose(offers, vast_options({}), False, 1, [], 1, None)
    assert [p.offer.id for p in picks] == [4, 1, 3]  # 2 is under min_reliability; 4 before 1: more reliable
    picks, skipped = vo.choose(offers, vast_options({"max_usd_per_hour": 0.5}), False, 1, [], 1, None)
    assert [p.offer.id for p in picks] == [4, 1] and skipped == [
        "offer 3: $0.9500/h is above vast.max_usd_per_hour $0.5"]
    picks, skipped = vo.choose(offers, vast_options({}), False, 1, ["US", "DE"], 1, 0.5)  # $0.50 of budget left
    assert [p.offer.id for p in picks] == [1] and "more than the $0.50 left of policies.max_cost_usd" in skipped[0]
    picks, _ = vo.choose(offers, vast_options({}), False, 1, [], 2, 0.63)  # two nodes: an hour of both must fit
    assert picks == []
    picks, skipped = vo.choose(offers, vast_options({"min_reliability": 0}), True, 1, [], 1, None)
    assert [p.offer.id for p in picks] == [2, 1, 3] and skipped == ["offer 4: no min_bid for an interruptible bid"]
    assert vo.choose(offers, vast_options({}), False, 2, [], 1, None)[0] == []  # no 2-GPU offer


def test_the_query_and_gpu_names() -> None:
    assert vo.gpu_names("H100") == ["H100 NVL", "H100 PCIE", "H100 SXM"]
    assert vo.gpu_names("RTX4090") == ["RTX 4090"] and vo.gpu_names("h100sxm") == ["H100 SXM"]
    assert vo.gpu_names("V100") == ["Tesla V100"] and vo.gpu_names("RTX_9999") == ["RTX 9999"]
    q = vo.query(["RTX 4090"], 1, vast_options({"max_usd_per_hour": 0.8, "min_inet_down_mbps": 500}), 50, False,
                 ["US"])
    assert q == {"rentable": {"eq": True}, "rented": {"eq": False}, "external": {"eq": False},
                 "num_gpus": {"eq": 1}, "reliability": {"gte": 0.95}, "gpu_name": {"eq": "RTX 4090"},
                 "verified": {"eq": True}, "geolocation": {"in": ["US"]}, "inet_down": {"gte": 500},
                 "dph_total": {"lte": 0.8}, "order": [["dph_total", "asc"]], "type": "on-demand", "limit": 64,
                 "allocated_storage": 50}
    bid = vo.query(["H100 SXM", "H100 PCIE"], 8, vast_options({"max_usd_per_hour": 0.8, "verified": False}), 50,
                   True, [])
    assert bid["type"] == "bid" and "dph_total" not in bid and "verified" not in bid  # a bid's price is checked here
    assert bid["gpu_name"] == {"in": ["H100 SXM", "H100 PCIE"]}


def test_status_ssh_and_owner_of_an_instance() -> None:
    base = {"id": 9, "label": "gtrain-c0ffee-0", "extra_env": [["GTRAIN_CLUSTER_ID", "c0ffee"]]}
    assert status_of({**base, "actual_status": None}) == "pending"
    assert status_of({**base, "actual_status": "running"}) == "running"
    assert status_of({**base, "actual_status": "stopped", "is_bid": True, "intended_status": "running"}) == "preempted"
    assert status_of({**base, "actual_status": "stopped", "is_bid": True, "intended_status": "stopped"}) == "stopped"
    assert status_of({**base, "actual_status": "stopped", "is_bid": False}) == "stopped"
    assert status_of({**base, "actual_status": "offline"}) == "unreachable"
    assert ssh_direct({"public_ipaddr": "198.51.100.7", "ports": {"22/tcp": [{"HostIp": "0.0.0.0",
                                                                              "HostPort": "41022"}]}}) == \
        ("198.51.100.7", 41022)
    assert ssh_direct({"public_ipaddr": "198.51.100.7", "ports": {}}) is None
    assert owner(base) == ("c0ffee", 0)
    assert owner({**base, "extra_env": [["GTRAIN_CLUSTER_ID", "other"]]}) is None  # labelled like ours: not ours
    assert owner({"label": "my-own-box"}) is None


def test_the_create_body_is_what_the_reference_allows() -> None:
    body = instance_body("c0ffee", 0, vast_options({}), 100, 0.15)
    assert set(body) <= set(CREATE_FIELDS) and body["runtype"] in RUNTYPES and body["target_state"] in TARGET_STATES
    assert body == {"image": "vastai/base-image:@vastai-automatic-tag", "label": "gtrain-c0ffee-0", "disk": 100,
                    "runtype": "ssh_direct", "target_state": "running", "env": {"GTRAIN_CLUSTER_ID": "c0ffee"},
                    "price": 0.15}
    assert "price" not in instance_body("c0ffee", 0, vast_options({}), 100, None)


def test_errors_at_the_edge_never_carry_the_key() -> None:
    e = vapi.translate(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}, "list instances")
    assert isinstance(e, CredentialsError) and "VAST_API_KEY" in (e.hint or "") and e.code == "401"
    e = vapi.translate(400, {"success": False, "error": "no_such_ask", "msg": "not available"}, "rent offer 7 (x)")
    assert isinstance(e, CapacityError)
    e = vapi.translate(400, {"error": "no_such_ask", "msg": "not available"}, "search offers")
    assert type(e) is ProviderError  # only a rent makes "taken" a capacity answer
    e = vapi.translate(400, {"success": False, "error": "insufficient_credit", "msg": "lacks credit"}, "rent offer 7")
    assert isinstance(e, QuotaError)
    e = vapi.translate(429, None, "search offers")  # plain text "API requests too frequent": no JSON body
    assert "rate limit" in e.message and e.code == "429"
    e = vapi.translate(400, {"success": False, "error": "invalid_args", "msg": "Unrecognized field: x"}, "rent")
    assert e.message == "rent: Unrecognized field: x (invalid_args) [HTTP 400]"


def test_the_key_from_the_environment_then_the_cli_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    assert vapi.key_source() is None
    with pytest.raises(vapi.NoAPIKey):
        vapi.api_key()
    (tmp_path / ".vast_api_key").write_text("legacy\n")
    assert vapi.key_source() == ("legacy", "~/.vast_api_key")
    (tmp_path / ".config" / "vastai").mkdir(parents=True)
    (tmp_path / ".config" / "vastai" / "vast_api_key").write_text("current")
    assert vapi.key_source() == ("current", "~/.config/vastai/vast_api_key")
    monkeypatch.setenv("VAST_API_KEY", " from-env ")
    assert vapi.key_source() == ("from-env", "VAST_API_KEY")
    assert vapi.VastAPI(base_url="http://x").auth_headers() == {"Authorization": "Bearer from-env"}
    assert "from-env" not in vapi.VastAPI(base_url="http://x").url("/instances/")


def test_the_section_names_the_bad_field() -> None:
    with pytest.raises(ConfigError) as e:
        vast_options({"min_reliability": 2})
    assert e.value.field == "vast.min_reliability"
    with pytest.raises(ConfigError) as e:
        vast_options({"ssh_cidr": "203.0.113.7/32"})
    assert e.value.field == "vast.ssh_cidr" and "no firewall" in e.value.message
    with pytest.raises(ConfigError) as e:
        vast_options({"max_usd_per_hr": 1})
    assert "max_usd_per_hr" in e.value.message


@pytest.mark.parametrize(("over", "field"), [
    ({"num_nodes": 2}, "num_nodes"),
    ({"resources": {"accelerators": "RTX4090:1", "instance_type": "x"}}, "resources.instance_type"),
    ({"resources": {"accelerators": "RTX4090:1", "zones": ["a"]}}, "resources.zones"),
    ({"resources": {"accelerators": "RTX4090:1", "region": "Texas"}}, "resources.region"),
    ({"resources": {}}, "resources"),
])
def test_the_plan_refuses_before_asking_the_api(over: dict[str, Any], field: str, gtrain_home: Path) -> None:
    spec = parse_spec({"name": "v", "provider": "vast", "resources": {"accelerators": "RTX4090:1"}, **over})
    store = StateStore()
    try:  # an endpoint nobody answers on: a refusal must come before any request
        p = VastProvider(store, api=vapi.VastAPI(key="k", base_url="http://127.0.0.1:9", timeout=1))
        with pytest.raises(ConfigError) as e:
            p.plan(spec)
        assert e.value.field == field, e.value
    finally:
        store.close()


def test_offline_the_plan_prices_from_the_bundled_market_snapshot(gtrain_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No key or no network: a dry run or an any_of still prices Vast, from the dated market snapshot, marked an
    estimate; a GPU the snapshot lacks is the key's error, as before."""
    monkeypatch.setenv("HOME", str(gtrain_home))
    store = StateStore()
    try:
        p = VastProvider(store, api=vapi.VastAPI(key="k", base_url="http://127.0.0.1:9", timeout=1))
        plan = p.plan(parse_spec({"name": "v", "provider": "vast", "resources": {"accelerators": "H100:8"}}))
        assert (plan.instance_type, plan.market, plan.price_per_hour) == ("8x H100 PCIE", "on-demand", 16.0)
        assert plan.notes[0].startswith("OFFLINE") and "estimate" in plan.notes[0], plan.notes
        bid = p.plan(parse_spec({"name": "v", "provider": "vast",
                                 "resources": {"accelerators": "RTX4090:1", "use_spot": True}}))
        assert (bid.market, bid.price_per_hour) == ("spot", 0.31)
        with pytest.raises(CredentialsError):
            p.plan(parse_spec({"name": "v", "provider": "vast", "resources": {"accelerators": "T4:1"}}))
    finally:
        store.close()
