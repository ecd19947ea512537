"""gcp: the $/h `up` freezes is the Cloud Billing Catalog's (vCPUs x core + GiB x RAM + GPUs x GPU SKUs in the
region; Spot from the Preemptible SKUs), read from a fake of that API at the wire (tests/fixtures/
fake_billing.py, on its own port); the catalog's estimate without credentials, when throttled, or without a SKU
for a part; the source shown; and the cap (maxRunDuration from max_cost_usd) computed from the live price."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from gtrain.catalog import resolve, snapshot_date
from gtrain.context import Context
from gtrain.providers.gcp import pricing
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.runs import cluster as core
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_billing import API_KEY, FakeBilling
from tests.fixtures.fake_gce import FakeGCE

REGION = "us-central1"


def _offer(spot: bool = False) -> Any:
    return resolve("gcp", "T4:1", "n1-standard-8", REGION, spot=spot)


def _skus(fake: FakeBilling, *, gpu: bool = True) -> None:
    fake.add_machine("n1", REGION, 0.031611, 0.004237)
    fake.add_machine("n1", REGION, 0.00698, 0.00094, spot=True)
    fake.add_machine("n1", "europe-west4", 0.0348, 0.0047)  # another region: not this node's
    if gpu:
        fake.add_gpu("nvidia-tesla-t4", REGION, 0.35)
        fake.add_gpu("nvidia-tesla-t4", REGION, 0.069841, spot=True)


def test_live_on_demand_and_spot_from_the_billing_catalog(fake_billing: FakeBilling) -> None:
    _skus(fake_billing)
    fake_billing.page_size_cap = 2  # a few SKUs a page: nextPageToken is followed
    o = _offer()
    od = pricing.at_launch(o, REGION, False, snapshot_date("gcp"))
    spot = pricing.at_launch(o, REGION, True, snapshot_date("gcp"))
    assert od.live and od.usd_per_hour == pytest.approx(o.vcpus * 0.031611 + o.memory_gib * 0.004237 + 0.35)
    assert spot.live and spot.usd_per_hour == pytest.approx(o.vcpus * 0.00698 + o.memory_gib * 0.00094 + 0.069841)
    assert od.label.startswith("live (gcp cloud billing catalog, us-central1, ")
    assert spot.label.startswith("live (gcp cloud billing catalog spot, us-central1, ")
    assert len(fake_billing.requests) > 3  # every page, once: the SKUs are read once per process
    asked = fake_billing.requests[0]
    assert "key" not in asked and asked["currencyCode"] == ["USD"]  # the key in its header, never the URL
    assert fake_billing.key_headers[0] == API_KEY


@pytest.mark.parametrize("broken", ["no credentials", "throttled", "no GPU SKU"])
def test_the_catalog_estimate_when_the_api_does_not_answer(fake_billing: FakeBilling,
                                                           monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    _skus(fake_billing, gpu=broken != "no GPU SKU")
    if broken == "no credentials":
        monkeypatch.delenv("GTRAIN_GCP_API_KEY")
        monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no gcloud to fall back on
    elif broken == "throttled":
        fake_billing.throttle = 1
    o = _offer()
    got = pricing.at_launch(o, REGION, False, snapshot_date("gcp"))
    assert not got.live and got.usd_per_hour == o.price_ondemand
    assert got.label == f"estimate (catalog {snapshot_date('gcp')})"
    assert {"no credentials": "GTRAIN_GCP_API_KEY", "throttled": "HTTP 429",
            "no GPU SKU": "no price"}[broken] in (got.why or ""), got.why
    assert API_KEY not in (got.why or "")


def test_the_fake_refuses_what_the_api_refuses(fake_billing: FakeBilling) -> None:
    def get(query: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"{fake_billing.url}/v1/services/6F81-5844-456A/skus?{query}") as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    assert get("")[0] == 403
    assert get("key=nope")[1]["error"]["status"] == "INVALID_ARGUMENT"
    assert "Cannot bind query parameter" in get(f"key={API_KEY}&bogus=1")[1]["error"]["message"]
    assert get(f"key={API_KEY}&pageSize=6000")[0] == 400
    assert get(f"key={API_KEY}&pageToken=forged")[0] == 400
    assert get(f"key={API_KEY}&currencyCode=XYZ")[0] == 400
    assert get(f"key={API_KEY}")[1] == {"skus": [], "nextPageToken": ""}


def test_up_freezes_the_live_price_and_the_cap_uses_it(fake_gce: FakeGCE, fake_billing: FakeBilling) -> None:
    _skus(fake_billing)
    live = _offer().vcpus * 0.031611 + _offer().memory_gib * 0.004237 + 0.35
    s = parse_spec({"name": "gcp-live", "provider": "gcp", "num_nodes": 1,
                    "resources": {"accelerators": "T4:1", "instance_type": "n1-standard-8", "region": REGION,
                                  "disk_gb": 100},
                    "policies": {"max_cost_usd": 1.0},
                    "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    ctx = Context(store=StateStore())
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report)
    res = core.up(s, ctx)
    try:
        c = res.cluster
        assert c is not None and c.price_per_hour == pytest.approx(live, abs=1e-6)
        assert c.extra["price_source"].startswith("live (gcp cloud billing catalog, us-central1, ")
        assert [i.price_per_hour for i in ctx.store.intervals(c.id)] == [pytest.approx(live, abs=1e-6)]
        # the node's own cap: maxRunDuration = $1 / the live $/h, not the catalog's
        with fake_gce.lock:
            inst = next(i for i in fake_gce.instances.values() if i["labels"].get("gtrain-cluster") == c.id)
        assert int(inst["scheduling"]["maxRunDuration"]["seconds"]) == int(1.0 / live * 3600)
    finally:
        core.down(s.name, ctx)
