"""azure: the $/h `up` freezes is the Retail Prices API's for the size in the region (pay-as-you-go or Spot),
read from a fake of that API at the wire (tests/fixtures/fake_azure_prices.py); the catalog's estimate when
the API is throttled, down or has no such item, and the source is shown (plan note, cluster record, cost)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.catalog import lookup, snapshot_date
from gtrain.providers.azure import pricing
from gtrain.spec import parse_spec
from tests.fixtures.fake_arm import FakeARM
from tests.fixtures.fake_azure_prices import FakePrices

SIZE, REGION = "Standard_NC4as_T4_v3", "eastus"


def _catalog(spot: bool) -> float:
    return lookup("azure", SIZE, REGION)[0].price(spot)


def _decoys(fake: FakePrices) -> None:
    """What the API lists beside the Linux meter: Windows, Low Priority, another region, another size."""
    fake.add_vm(SIZE, REGION, 0.752, windows=True)
    fake.add_vm(SIZE, REGION, 0.105, low_priority=True)
    fake.add_vm(SIZE, "westus2", 0.61)
    fake.add_vm("Standard_NC64as_T4_v3", REGION, 4.352)


def test_live_pay_as_you_go_and_spot_prices(azure_prices: FakePrices) -> None:
    _decoys(azure_prices)
    azure_prices.add_vm(SIZE, REGION, 0.5431)
    azure_prices.add_vm(SIZE, REGION, 0.0921, spot=True)
    azure_prices.page_size = 1  # the one item per page: NextPageLink is followed
    od = pricing.at_launch(SIZE, REGION, False, _catalog(False), snapshot_date("azure"))
    spot = pricing.at_launch(SIZE, REGION, True, _catalog(True), snapshot_date("azure"))
    assert (od.usd_per_hour, od.live, spot.usd_per_hour, spot.live) == (0.5431, True, 0.0921, True)
    assert od.label.startswith("live (azure retail prices, eastus, ") and spot.label.startswith(
        "live (azure retail prices spot, eastus, ")
    sent = azure_prices.requests[-1]
    assert sent["api-version"] == ["2023-01-01-preview"]
    assert sent["$filter"] == [f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
                               f"armRegionName eq '{REGION}' and armSkuName eq '{SIZE}'"]


@pytest.mark.parametrize("broken", ["throttled", "down", "no item"])
def test_the_catalog_estimate_when_the_api_does_not_answer(azure_prices: FakePrices, broken: str) -> None:
    if broken == "throttled":
        azure_prices.add_vm(SIZE, REGION, 0.5431)
        azure_prices.throttle = 1
    elif broken == "down":
        azure_prices.down = True
    got = pricing.at_launch(SIZE, REGION, False, _catalog(False), snapshot_date("azure"))
    assert not got.live and got.usd_per_hour == _catalog(False)
    assert got.label == f"estimate (catalog {snapshot_date('azure')})"
    assert {"throttled": "HTTP 429", "down": "HTTP 503", "no item": "no price"}[broken] in (got.why or "")


def test_the_fake_refuses_what_the_api_refuses(azure_prices: FakePrices) -> None:
    azure_prices.add_vm(SIZE, REGION, 0.5431)

    def get(query: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"{azure_prices.url}/api/retail/prices?{query}") as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    code, body = get("$filter=" + urllib.request.quote("armSkuNam eq 'x'"))
    assert code == 400 and "armSkuNam" in body["Error"]["Message"]
    code, body = get("$filter=" + urllib.request.quote("armSkuName gt 'x'"))
    assert code == 400 and "gt" in body["Error"]["Message"]
    code, _ = get("api-version=1999-01-01")
    assert code == 400
    # values are case-sensitive from 2023-01-01-preview on, not before
    q = urllib.request.quote("serviceName eq 'virtual machines'")
    assert get(f"api-version=2023-01-01-preview&$filter={q}")[1]["Items"] == []
    assert len(get(f"api-version=2021-10-01-preview&$filter={q}")[1]["Items"]) == 1


def test_up_freezes_the_live_price_and_shows_its_source(fake_arm: FakeARM, azure_prices: FakePrices,
                                                        gtrain_home: Path) -> None:
    azure_prices.add_vm(SIZE, REGION, 0.5431)
    data = {"name": "az-live", "provider": "azure", "num_nodes": 1,
            "resources": {"accelerators": "T4:1", "region": REGION, "disk_gb": 64},
            "azure": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}}
    res = gtrain.up(parse_spec(data))
    try:
        c = res.cluster
        assert c is not None and res.plan.price_per_hour == 0.5431 and c.price_per_hour == 0.5431
        assert c.extra["price_live"] is True and c.extra["price_source"].startswith("live (azure retail prices, ")
        assert any(n.startswith("price: $0.5431/h per node, live (azure retail prices") for n in res.plan.notes)
        report = next(r for r in gtrain.cost() if r.cluster == "az-live")
        assert report.price_source == c.extra["price_source"]
        assert report.lines[0].price_per_hour == 0.5431 and not report.lines[0].estimate
        assert "live (azure retail prices" in (report.lines[0].note or "")
    finally:
        gtrain.down("az-live")
