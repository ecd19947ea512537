"""The Cloud TPU types re-priced by ``gtrain catalog --refresh`` (gcp), from the Cloud Billing Catalog API, the
way the GCE GPU prices are (``gtrain.catalog.refresh``; its hook here is ``CATALOG_RIDERS`` in
``gtrain.registry``).

Where the prices are (https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list,
https://cloud.google.com/tpu/pricing): the TPU SKUs of two services -- ``E000-3F24-B8AA`` (Cloud TPU: v2, v3,
v4) and ``6F81-5844-456A`` (Compute Engine: v5e, v5p, v6e) -- one SKU per generation, market and set of
``serviceRegions``, priced per chip-hour (``usageUnit`` ``h``). A SKU is read as a TPU price when its
``category.resourceGroup`` is ``TPU`` or its description names one ("TPU v5p chip-hour", "Tpu-v4 Pod ...",
"Preemptible TPU v5p ...", "TPU v5 Lite ...", "Trillium ..."); ``usageType`` ``OnDemand`` is the on-demand price,
``Preemptible`` the spot one (its description says so too). Commitments and other usage types are left out.

Each type takes the price of the region of its first zone (the one gtrain tries first), else of any of its
zones' regions; a type with no on-demand SKU keeps its shipped prices and is listed in the file's comments; a
type with no spot SKU keeps its spot estimate scaled by the new on-demand price."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable
from typing import Any

from gtrain.providers.gcp.tpu import types

SERVICES = ("E000-3F24-B8AA", "6F81-5844-456A")  # Cloud TPU; Compute Engine
_GEN = re.compile(r"\b(?:tpu[-\s]?(v\d+)\s*(p|e|lite\s*pod|litepod|lite)?|(trillium))\b")
_MARKETS = ("OnDemand", "Preemptible")


def generation(description: str) -> str | None:
    """``TPU v5p chip-hour`` -> v5p, ``Tpu-v4 Pod`` -> v4, ``TPU v5 Lite ...`` -> v5e, ``Trillium`` -> v6e."""
    m = _GEN.search(description.lower())
    if not m:
        return None
    if m.group(3):
        return "v6e"
    suffix = (m.group(2) or "").replace(" ", "")
    return m.group(1) + ("e" if suffix.startswith("lite") else suffix)


def rates(skus: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(generation, market, region) -> USD per chip-hour, from SKUs of the two services."""
    out: dict[tuple[str, str, str], float] = {}
    for sku in skus:
        try:
            cat, desc = sku["category"], str(sku["description"])
            usage = cat["usageType"]
            if usage not in _MARKETS:
                continue
            gen = generation(desc)
            if gen is None or (cat.get("resourceGroup") not in (None, "TPU") and "tpu" not in desc.lower()):
                continue
            if ("preemptible" in desc.lower() or "spot" in desc.lower()) != (usage == "Preemptible"):
                continue
            expr = sku["pricingInfo"][-1]["pricingExpression"]
            if expr["usageUnit"] != "h":
                continue
            price = expr["tieredRates"][-1]["unitPrice"]
            usd = int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
            if usd <= 0:
                continue
            for region in sku.get("serviceRegions") or []:
                out[(gen, usage, str(region))] = usd
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue  # a SKU of another shape: not one we price with
    return out


def reprice(text: str, got: dict[tuple[str, str, str], float], day: str) -> tuple[str, int, list[str]]:
    """The catalog ``text`` with its rows re-priced: (new text, rows re-priced, rows kept as shipped)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    reader = csv.DictReader(lines)
    fields, rows = list(reader.fieldnames or []), list(reader)
    kept: list[str] = []
    for r in rows:
        regions = list(dict.fromkeys(z.rsplit("-", 1)[0] for z in r["zones"].split()))
        od = next((got[k] for reg in regions if (k := (r["generation"], "OnDemand", reg)) in got), None)
        if od is None:
            kept.append(f"tpu-{r['accelerator_type']}")
            continue
        spot = next((got[k] for reg in regions if (k := (r["generation"], "Preemptible", reg)) in got), None)
        old_od, old_spot = float(r["price_ondemand_chip_h"]), float(r["price_spot_chip_h"])
        r["price_ondemand_chip_h"] = f"{round(od, 6):.10g}"
        r["price_spot_chip_h"] = f"{round(spot if spot is not None else old_spot * od / old_od, 6):.10g}"
    buf = io.StringIO()
    buf.write(f"# snapshot: {day}\n# gtrain Cloud TPU types, re-priced by `gtrain catalog --refresh` on {day} from "
              "the Cloud Billing Catalog API (TPU SKUs of services E000-3F24-B8AA and 6F81-5844-456A, $ per "
              "chip-hour, the region of each type's first zone). Delete this file to go back to the types shipped "
              "with gtrain.\n")
    if kept:
        buf.write(f"# kept the shipped ({types.snapshot_of(types.CSV.read_text())}) price, no SKU found: "
                  + ", ".join(kept) + "\n")
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue(), len(rows) - len(kept), kept


def refresh_catalog(skus_of: Callable[[str], Iterable[dict[str, Any]]], day: str) -> tuple[Any, str, str | None]:
    """The hook ``gtrain catalog --refresh`` calls with gcp's: (RefreshResult, where to write, the new text),
    re-pricing the shipped types (``types.CSV``, not an older user copy). No TPU SKU recognised at all (Google
    renamed them?): nothing to write (None), the types in use stay, and the result says so -- the GPU prices
    are refreshed all the same."""
    from gtrain.catalog.refresh import RefreshResult

    got: dict[tuple[str, str, str], float] = {}
    for service in SERVICES:
        got.update(rates(skus_of(service)))
    text, repriced, kept = reprice(types.CSV.read_text(), got, day)
    path = types.user_copy()
    if not repriced:
        return (RefreshResult("tpu", "", types.snapshot(), len(kept), 0, kept,
                              source="the Cloud Billing Catalog: no TPU chip-hour SKU recognised; TPU types "
                                     "unchanged"), str(path), None)
    types.check_text(text, str(path))
    return (RefreshResult("tpu", str(path), day, repriced + len(kept), repriced, kept,
                          source="the Cloud Billing Catalog (TPU SKUs)"), str(path), text)
