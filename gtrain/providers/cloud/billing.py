"""The billing arithmetic of a per-second cloud: a minimum per interval, the boot disk by GB-hour from a
$/GB-month list price."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from gtrain.providers.base import IntervalCost

if TYPE_CHECKING:
    from gtrain.state import CostInterval

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
                        disk_gb: float, disk_usd_per_gb_month: float, disk_label: str) -> IntervalCost:
    """One node interval's cost on a per-second cloud: compute at the on-demand $/h stored at start (or the
    provider's ``spot`` (rate, is_estimate, note)), plus the boot disk by GB-hour, with the billing minimum."""
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
        # the $/h stored at start is the gtrain catalog's list price: an estimate of what the cloud bills
        rate, estimate = interval.price_per_hour, True
        notes = [f"on-demand ${rate:g}/h from the gtrain catalog, stored at start (an estimate)"]
    disk = disk_cost(disk_gb, disk_usd_per_gb_month, billed)
    if seconds and seconds < minimum_s:
        notes.append(f"billed the {minimum_s:.0f} s minimum")
    if disk_gb:
        notes.append(f"{disk_label} {disk_gb:g} GB ${disk:.6f}")
    return IntervalCost(round(billed * rate / 3600.0 + disk, 6), estimate=estimate, note="; ".join(notes))
