"""The $/h ``up`` freezes for an azure VM: the live price of its size in its region from the Azure Retail Prices
API (https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices): public, no login,
``GET https://prices.azure.com/api/retail/prices?api-version=2023-01-01-preview&$filter=...`` (OData; values
are case-sensitive from that api-version on), answering ``{"Items": [...], "NextPageLink": ...}``. The filter
asks for the one size in the one region, pay-as-you-go (``priceType eq 'Consumption'``); of the items, the
Linux ones (``productName`` not ending in " Windows") priced per "1 Hour" in USD, Spot those whose
``skuName``/``meterName`` say "Spot", on-demand the rest ("Low Priority" left out: that is the old Batch
market). The catalog's price (``gtrain/catalog/azure.csv``, an estimate) when the API is down, throttled or has
no such item. ``GTRAIN_AZURE_PRICES_URL`` (the API's base URL, as ``gtrain catalog --refresh`` reads it) points
it elsewhere (the tests' fake)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gtrain.errors import ProviderError
from gtrain.providers.cloud.billing import FrozenPrice, catalog_price, live_or_catalog, live_price

BASE = "https://prices.azure.com"
PATH = "/api/retail/prices"
API_VERSION = "2023-01-01-preview"
TIMEOUT_S = 10.0
MAX_PAGES = 5


def url() -> str:
    return (os.environ.get("GTRAIN_AZURE_PRICES_URL") or BASE).rstrip("/") + PATH


def query(size: str, region: str) -> str:
    """The OData filter for one size in one region, pay-as-you-go (quotes doubled, as OData escapes them)."""
    q = lambda v: "'" + v.replace("'", "''") + "'"  # noqa: E731
    return (f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq {q(region)} "
            f"and armSkuName eq {q(size)}")


def items(size: str, region: str, *, base: str | None = None, timeout: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Every item the API answers for ``size`` in ``region`` (following ``NextPageLink``)."""
    nxt: str | None = (f"{base or url()}?api-version={API_VERSION}&"
                       + urllib.parse.urlencode({"$filter": query(size, region)}, quote_via=urllib.parse.quote))
    out: list[dict[str, Any]] = []
    for _ in range(MAX_PAGES):
        if not nxt:
            return out
        req = urllib.request.Request(nxt, headers={"Accept": "application/json", "User-Agent": "gtrain"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the public price API
                page = json.load(r)
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode("utf-8", "replace")
            raise ProviderError(f"Azure Retail Prices API: HTTP {e.code} {detail}".strip()) from None
        out.extend(page.get("Items") or [])
        nxt = page.get("NextPageLink")
    raise ProviderError(f"Azure Retail Prices API: more than {MAX_PAGES} pages for {size} in {region}")


def pick(found: list[dict[str, Any]], size: str, region: str, spot: bool) -> tuple[float, str] | None:
    """The Linux hourly USD price of the market asked for, and its effectiveStartDate; None if none."""
    best: tuple[float, str] | None = None
    for it in found:
        name, meter = str(it.get("skuName") or ""), str(it.get("meterName") or "")
        if it.get("armSkuName") != size or it.get("armRegionName") != region or it.get("type") != "Consumption" \
                or str(it.get("productName") or "").endswith("Windows") or it.get("unitOfMeasure") != "1 Hour" \
                or it.get("currencyCode", "USD") != "USD" or "Low Priority" in name + meter:
            continue
        if ("Spot" in name or "Spot" in meter) != spot:
            continue
        price = float(it["retailPrice"])
        if price > 0 and (best is None or str(it.get("effectiveStartDate") or "") > best[1]):
            best = (price, str(it.get("effectiveStartDate") or ""))
    return best


def at_launch(size: str, region: str, spot: bool, catalog_usd: float, snapshot: str) -> FrozenPrice:
    """The live $/h of ``size`` in ``region`` (Spot or pay-as-you-go), else the catalog's with why."""
    def fetch() -> FrozenPrice | None:
        got = pick(items(size, region), size, region, spot)
        if got is None:
            return None
        return live_price(got[0], "azure retail prices" + (" spot" if spot else ""), region)

    return live_or_catalog(fetch, catalog_price(catalog_usd, snapshot))
