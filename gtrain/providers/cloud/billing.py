"""The billing arithmetic of a per-second cloud: a minimum per interval, the boot disk by GB-hour from a
$/GB-month list price; and the price ``up`` freezes, with where it came from (:class:`FrozenPrice`: the
provider's live price, or the catalog's estimate), which every provider records the same way
(:func:`freeze_price`, :func:`price_fields`) and the plan, ``status`` and the cost report show (docs/costs.md)."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.providers.base import IntervalCost

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.base import Plan
    from gtrain.state import Cluster, CostInterval, StateStore


@dataclass(frozen=True)
class FrozenPrice:
    """The $/h per node ``up`` freezes, and where it came from: ``live`` (the provider's API answered at launch:
    its price list, its spot price history, the offer's own price) or not (the gtrain catalog's dated list
    price, an estimate). ``source`` names it: ``aws spot price history, us-east-1a, 2026-12-06T14:00Z`` or
    ``catalog 2025-12``; ``why`` says why a catalog price was used where a live one was asked for."""

    usd_per_hour: float
    live: bool
    source: str
    why: str | None = None

    @property
    def label(self) -> str:
        """``live (aws spot price history, us-east-1a, 2026-12-06T14:00Z)`` / ``estimate (catalog 2025-12)``."""
        return f"{'live' if self.live else 'estimate'} ({self.source})"

    def note(self) -> str:
        """The plan's and ``up``'s line: ``price: $0.9/h per node, live (...)`` (with the why of a fallback)."""
        return (f"price: ${self.usd_per_hour:g}/h per node, {self.label}"
                + (f"; the live price was not had: {self.why}" if self.why else ""))


def stamp(at: float | dt.datetime | None = None) -> str:
    """A price's moment as the label shows it: ``2026-12-06T14:00Z`` (UTC, to the minute)."""
    if at is None:
        at = time.time()
    when = at if isinstance(at, dt.datetime) else dt.datetime.fromtimestamp(at, dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%MZ")


def live_price(usd_per_hour: float, what: str, where: str | None = None,
               at: float | dt.datetime | None = None) -> FrozenPrice:
    """A price the provider gave now: ``what`` (``aws spot price history``), ``where`` (the zone or region) and
    ``at`` (the price's own timestamp where the API gives one; now otherwise)."""
    return FrozenPrice(float(usd_per_hour), True, ", ".join(x for x in (what, where, stamp(at)) if x))


def catalog_price(usd_per_hour: float, snapshot: str, why: str | None = None) -> FrozenPrice:
    """The gtrain catalog's list price (an estimate): ``snapshot`` is its date (``2025-12``)."""
    return FrozenPrice(float(usd_per_hour), False, f"catalog {snapshot}", why)


def live_or_catalog(fetch: Callable[[], FrozenPrice | None], fallback: FrozenPrice) -> FrozenPrice:
    """``fetch()``'s live price, or ``fallback`` (the catalog's) with why when the API is down, refuses (no
    credentials, 403, 429 after retries), has no price for this type and place (None), or answers nonsense."""
    try:
        got = fetch()
    except GtrainError as e:
        why = e.message
    except (OSError, ValueError, KeyError, TypeError) as e:  # network, a body that is not the documented one
        why = f"{type(e).__name__}: {e}"
    else:
        if got is not None and got.usd_per_hour > 0 and math.isfinite(got.usd_per_hour):
            return got
        why = "the API has no price for this type here" if got is None else f"it answered ${got.usd_per_hour}/h"
    return FrozenPrice(fallback.usd_per_hour, False, fallback.source, (why or "")[:200])


def price_fields(price: FrozenPrice) -> dict[str, Any]:
    """What a node's record (``NodeRecord.extra``) and the cluster's ``extra`` keep of the frozen price."""
    return {"price_per_hour": price.usd_per_hour, "price_live": price.live, "price_source": price.label}


def price_label(meta: Mapping[str, Any] | None) -> str | None:
    """The recorded source of a frozen price (``live (...)`` / ``estimate (...)``); None in older records."""
    label = (meta or {}).get("price_source")
    return str(label) if label else None


def freeze_price(store: StateStore, cluster: Cluster, plan: Plan, price: FrozenPrice,
                 report: Reporter | None = None) -> None:
    """Make ``price`` the one ``up`` freezes: the plan's $/h (core opens the cost intervals from it), the
    cluster's $/h (the caps: ``policies.max_cost_usd`` as the nodes' lifetime, their budget watch) and the
    source in the cluster's ``extra`` (``status``, the cost report); ``up`` says it in one line."""
    plan.price_per_hour = price.usd_per_hour
    line = price.note()
    plan.notes = [n for n in plan.notes if not n.startswith("price: ")] + [line]
    fresh = store.get_cluster_by_id(cluster.id)
    extra = dict((fresh.extra if fresh is not None else cluster.extra) or {})
    extra.update({k: v for k, v in price_fields(price).items() if k != "price_per_hour"})
    if isinstance(extra.get("plan"), dict):
        extra["plan"] = {**extra["plan"], "price_per_hour": price.usd_per_hour, "notes": plan.notes}
    store.update_cluster(cluster.id, price_per_hour=price.usd_per_hour, extra=extra)
    cluster.price_per_hour, cluster.extra = price.usd_per_hour, extra
    if report is not None:
        report.info(line)

#: a month of disk, in hours (the clouds' own convention for $/GB-month)
HOURS_PER_MONTH = 730.0


def billed_seconds(seconds: float, minimum_s: float) -> int:
    """Per-second billing with a minimum (EC2 and GCE: 60 s) for an interval that ran at all."""
    if seconds <= 0:
        return 0
    return math.ceil(max(seconds, minimum_s))


def disk_cost(disk_gb: float, usd_per_gb_month: float, billed_s: float) -> float:
    """A disk's cost over ``billed_s`` seconds at a $/GB-month list price (730 h a month)."""
    return disk_gb * usd_per_gb_month / HOURS_PER_MONTH * billed_s / 3600.0


def cloud_interval_cost(interval: CostInterval, *, minimum_s: float, spot: tuple[float, bool, str] | None,
                        disk_gb: float, disk_usd_per_gb_month: float, disk_label: str,
                        frozen: Mapping[str, Any] | None = None) -> IntervalCost:
    """One node interval's cost on a per-second cloud: compute at the on-demand $/h stored at start (or the
    provider's ``spot`` (rate, is_estimate, note)), plus the boot disk by GB-hour, with the billing minimum.
    ``frozen``: the node's record (:func:`price_fields`): a live on-demand price is no estimate."""
    stop = interval.stopped_at or time.time()
    seconds = max(0.0, stop - interval.started_at)
    if interval.market == "stopped":  # `gtrain stop`: no compute, the disk at the $/h stored when it stopped
        return IntervalCost(round(seconds * interval.price_per_hour / 3600.0, 6), estimate=True,
                            note=f"stopped: {disk_label} {disk_gb:g} GB only, ${interval.price_per_hour:.6f}/h")
    billed = billed_seconds(seconds, minimum_s)
    if interval.market == "spot" and spot is not None:
        rate, estimate, note = spot
        notes = [note]
    else:
        rate, label = interval.price_per_hour, price_label(frozen)
        live = bool((frozen or {}).get("price_live"))
        # a catalog $/h is an estimate of what the cloud bills; the provider's own list price at launch is not
        estimate = not live
        notes = ([f"{interval.market} ${rate:g}/h {label}, stored at start"] if label else
                 [f"on-demand ${rate:g}/h from the gtrain catalog, stored at start (an estimate)"])
    disk = disk_cost(disk_gb, disk_usd_per_gb_month, billed)
    if seconds and seconds < minimum_s:
        notes.append(f"billed the {minimum_s:.0f} s minimum")
    if disk_gb:
        notes.append(f"{disk_label} {disk_gb:g} GB ${disk:.6f}")
    return IntervalCost(round(billed * rate / 3600.0 + disk, 6), estimate=estimate, note="; ".join(notes))
