"""The $/h ``up`` freezes for a gcp node: the live Cloud Billing Catalog API
(https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list; ``GET
https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus``, Compute Engine's SKUs, paged) priced the
way ``gtrain catalog --refresh`` prices a row (gtrain/catalog/refresh.py): vCPUs x "<family> Instance Core" +
GiB x "<family> Instance Ram" + GPUs x "<GPU> GPU" in the node's region, on-demand (``usageType: OnDemand``) or
Spot (``Preemptible``, "Spot Preemptible ..."). It needs credentials: an API key in ``GTRAIN_GCP_API_KEY`` or an
OAuth token (``GTRAIN_GCP_ACCESS_TOKEN``, or gcloud's); without them, or when the API does not answer or has no
SKU for a part, the catalog's price (an estimate) is frozen and the plan says why. The SKU list is read once per
process (a few pages of 5,000), and ``GTRAIN_GCP_BILLING_URL`` points it elsewhere (the tests' fake)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from gtrain.providers.cloud.billing import FrozenPrice, catalog_price, live_or_catalog, live_price

if TYPE_CHECKING:
    from gtrain.catalog import Offer

_lock = threading.Lock()
_rates: dict[str, dict[tuple[str, str, str, str], float]] = {}


def rates() -> dict[tuple[str, str, str, str], float]:
    """Compute Engine's rates, fetched once per process and billing URL."""
    import os

    from gtrain.catalog.refresh import gcp_compute_rates

    key = os.environ.get("GTRAIN_GCP_BILLING_URL") or ""
    with _lock:
        if key not in _rates:
            _rates[key] = gcp_compute_rates()
        return _rates[key]


def forget() -> None:
    """Drop what was fetched (the next price is read afresh)."""
    with _lock:
        _rates.clear()


def at_launch(offer: Offer, region: str, spot: bool, snapshot: str) -> FrozenPrice:
    """The live $/h of ``offer``'s machine type (and its attached GPUs) in ``region``, else the catalog's."""
    def fetch() -> FrozenPrice | None:
        from gtrain.catalog.refresh import gcp_machine_price

        usd = gcp_machine_price(rates(), offer.instance_type, offer.vcpus, offer.memory_gib, offer.accelerator_type,
                                offer.gpu_count, region, "Preemptible" if spot else "OnDemand")
        if usd is None:
            return None
        return live_price(round(usd, 6), "gcp cloud billing catalog" + (" spot" if spot else ""), region)

    return live_or_catalog(fetch, catalog_price(offer.price(spot), snapshot))
