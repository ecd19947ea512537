"""The azure catalog (``gtrain/catalog/azure.csv``) from the Azure Retail Prices API
(https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices): public, no login,
``GET https://prices.azure.com/api/retail/prices?$filter=...`` answering ``{"Items": [...], "NextPageLink"}``.
An item is one meter: ``armSkuName`` (``Standard_NC24ads_A100_v4``), ``armRegionName``, ``retailPrice`` (USD per
``unitOfMeasure`` "1 Hour"), ``type`` ("Consumption" = pay as you go), ``skuName`` ending in " Spot" or
" Low Priority" for those markets, ``productName`` ending in " Windows" for Windows VMs (left out: gtrain runs
Linux). The sizes' vCPUs, memory and GPUs are Azure's published size tables (NC A100 v4, ND A100 v4, NC H100 v5,
ND H100 v5, NCasT4_v3: https://learn.microsoft.com/azure/virtual-machines/sizes/overview).

    python -m gtrain.providers.azure.prices [OUT.csv]     re-price from the live API ($GTRAIN_HOME/catalog/azure.csv)
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

URL = "https://prices.azure.com/api/retail/prices"
FIELDS = ["instance_type", "vcpus", "memory_gib", "gpu_name", "gpu_count", "gpu_memory_gib", "efa", "region",
          "price_ondemand", "price_spot"]

#: armSkuName -> (vCPUs, memory GiB, GPU name, GPUs, GB per GPU)
SIZES: dict[str, tuple[int, float, str, int, float]] = {
    "Standard_NC4as_T4_v3": (4, 28, "T4", 1, 16),
    "Standard_NC64as_T4_v3": (64, 440, "T4", 4, 16),
    "Standard_NC24ads_A100_v4": (24, 220, "A100-80GB", 1, 80),
    "Standard_NC48ads_A100_v4": (48, 440, "A100-80GB", 2, 80),
    "Standard_NC96ads_A100_v4": (96, 880, "A100-80GB", 4, 80),
    "Standard_ND96asr_v4": (96, 900, "A100", 8, 40),
    "Standard_ND96amsr_A100_v4": (96, 1900, "A100-80GB", 8, 80),
    "Standard_NC40ads_H100_v5": (40, 320, "H100-NVL", 1, 94),
    "Standard_NC80adis_H100_v5": (80, 640, "H100-NVL", 2, 94),
    "Standard_ND96isr_H100_v5": (96, 1900, "H100", 8, 80),
}


def query_filter(sizes: Iterable[str]) -> str:
    skus = " or ".join(f"armSkuName eq '{s}'" for s in sizes)
    return f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and ({skus})"


def fetch(url: str = URL, timeout: float = 30.0, max_pages: int = 200) -> list[dict[str, Any]]:
    """Every item the API answers for :data:`SIZES`, following ``NextPageLink``."""
    items: list[dict[str, Any]] = []
    next_url: str | None = f"{url}?$filter={urllib.parse.quote(query_filter(SIZES))}"
    for _ in range(max_pages):
        if not next_url:
            return items
        with urllib.request.urlopen(next_url, timeout=timeout) as r:  # noqa: S310 - the public price API
            page = json.load(r)
        items.extend(page.get("Items") or [])
        next_url = page.get("NextPageLink")
    raise RuntimeError(f"more than {max_pages} pages from {url}")


def rows(items: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """Catalog rows (one per size and region with a Linux pay-as-you-go price) from Retail Prices API items."""
    ondemand: dict[tuple[str, str], float] = {}
    spot: dict[tuple[str, str], float] = {}
    for it in items:
        sku, region = str(it.get("armSkuName") or ""), str(it.get("armRegionName") or "")
        name, product = str(it.get("skuName") or ""), str(it.get("productName") or "")
        if sku not in SIZES or not region or it.get("type") != "Consumption" or product.endswith("Windows") \
                or it.get("unitOfMeasure") != "1 Hour" or it.get("currencyCode", "USD") != "USD":
            continue
        price = float(it["retailPrice"])
        if name.endswith(" Low Priority"):
            continue
        (spot if name.endswith(" Spot") else ondemand)[(sku, region)] = price
    out = []
    for (sku, region), price in sorted(ondemand.items(), key=lambda kv: (kv[0][0], kv[1], kv[0][1])):
        vcpus, mem, gpu, count, gmem = SIZES[sku]
        out.append({"instance_type": sku, "vcpus": str(vcpus), "memory_gib": f"{mem:g}", "gpu_name": gpu,
                    "gpu_count": str(count), "gpu_memory_gib": f"{gmem:g}", "efa": "false", "region": region,
                    "price_ondemand": f"{price:g}", "price_spot": f"{spot.get((sku, region), price):g}"})
    return out


def render(catalog_rows: list[dict[str, str]], snapshot: str) -> str:
    head = (f"# gtrain Azure GPU catalog, {snapshot}. Linux pay-as-you-go and Spot USD/h from the Azure Retail Prices "
            "API (gtrain/providers/azure/prices.py). See docs/providers/azure.md.\n"
            f"# snapshot: {snapshot}\n")
    return head + ",".join(FIELDS) + "\n" + "".join(",".join(r[f] for f in FIELDS) + "\n" for r in catalog_rows)


def main(argv: list[str]) -> int:
    import datetime

    from gtrain.catalog import override_path

    out = argv[0] if argv else str(override_path("azure"))
    text = render(rows(fetch()), datetime.date.today().isoformat())
    from pathlib import Path

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


def refresh_catalog(base: str, day: str, timeout: float) -> tuple[Any, str]:
    """``gtrain catalog --refresh`` for azure (its hook in ``gtrain.registry.CATALOG_REFRESH``): every
    size of :data:`SIZES`, re-priced from the Retail Prices API (pages linked by NextPageLink)."""
    from urllib.parse import quote

    from gtrain.catalog import override_path
    from gtrain.catalog.refresh import MAX_PAGES, RefreshResult, _bad, _open

    items: list[dict[str, Any]] = []
    url: str | None = f"{base}/api/retail/prices?$filter={quote(query_filter(SIZES))}"
    for _ in range(MAX_PAGES):
        if not url:
            break
        with _open(url, timeout, what="azure") as r:
            try:
                page = json.load(r)
            except ValueError:
                raise _bad("azure", "a page is not JSON") from None
        if not isinstance(page, dict) or not isinstance(page.get("Items"), list):
            raise _bad("azure", "a page is not {'Items': [...]}")
        items += page["Items"]
        url = page.get("NextPageLink")
    found = rows(items)
    if not found:
        raise _bad("azure", "no Linux pay-as-you-go price for any GPU size gtrain lists")
    return (RefreshResult("azure", str(override_path("azure")), day, len(found), len(found), [],
                          source="the Azure Retail Prices API"), render(found, day))
