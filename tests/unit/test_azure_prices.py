"""The azure catalog from the Azure Retail Prices API: the recorded answer (tests/fixtures/pricing/azure/, two
pages linked by NextPageLink) gives exactly the shipped gtrain/catalog/azure.csv, with the Windows, Low Priority,
Dev/Test and non-GPU meters left out."""

from __future__ import annotations

import json
from pathlib import Path

from gtrain import catalog
from gtrain.providers.azure import prices

FIX = Path(__file__).parents[1] / "fixtures" / "pricing" / "azure"


def items() -> list[dict[str, object]]:
    p1 = json.loads((FIX / "retail-prices-page1.json").read_text())
    p2 = json.loads((FIX / "retail-prices-page2.json").read_text())
    assert p1["NextPageLink"] and p2["NextPageLink"] is None
    return p1["Items"] + p2["Items"]


def test_recorded_retail_prices_give_the_shipped_catalog() -> None:
    rows = prices.rows(items())
    shipped = catalog.shipped_text("azure")
    assert prices.render(rows, "2025-12") == shipped
    by = {(r["instance_type"], r["region"]): r for r in rows}
    a100 = by[("Standard_NC24ads_A100_v4", "eastus")]
    assert (a100["price_ondemand"], a100["price_spot"]) == ("3.673", "0.551")  # not Windows, Low Priority, Dev/Test
    assert not any(r["instance_type"] == "Standard_D4s_v5" for r in rows)
    h100 = catalog.resolve("azure", "H100:8", None, None, spot=False)
    assert (h100.instance_type, h100.gpu_count, h100.price_ondemand) == ("Standard_ND96isr_H100_v5", 8, 98.32)
    assert {o.gpu_name for o in catalog.offers("azure")} == {"T4", "A100", "A100-80GB", "H100", "H100-NVL"}


def test_query_filter_asks_for_linux_payg_meters_of_the_listed_sizes() -> None:
    f = prices.query_filter(["Standard_ND96isr_H100_v5"])
    assert f == ("serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
                 "(armSkuName eq 'Standard_ND96isr_H100_v5')")
