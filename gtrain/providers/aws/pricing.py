"""What an aws node interval cost: the on-demand $/h of the catalog stored when the node started; spot read
from ``describe_spot_price_history`` over the node's own running interval (the catalog's spot estimate when the
history is missing or implausible, and the report says so); EC2 bills per second with a 60-second minimum; the
root EBS volume (gp3) is added by GB-hour at :data:`EBS_GP3_USD_PER_GB_MONTH`. A part of
:class:`gtrain.providers.aws.AWSProvider`."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.providers.aws import api
from gtrain.providers.cloud.billing import cloud_interval_cost

if TYPE_CHECKING:
    from gtrain.providers.base import IntervalCost
    from gtrain.state import Cluster, CostInterval
    from gtrain.state.nodes import NodeRecord

#: EBS gp3 storage, USD per GB-month (us-east-1/us-east-2/us-west-2 list price, 2025; eu-west-1 is 0.088).
#: gp3's baseline 3,000 IOPS and 125 MB/s are included; gtrain never asks for more. A month is 730 hours.
EBS_GP3_USD_PER_GB_MONTH = 0.08
EBS_GP3_BY_REGION = {"eu-west-1": 0.088}

SPOT_IMPLAUSIBLE_FRACTION = 0.01


def ebs_rate(region: str | None) -> float:
    return EBS_GP3_BY_REGION.get(region or "", EBS_GP3_USD_PER_GB_MONTH)


class AWSPricing:
    """Prices node intervals; caches the spot price history it reads."""

    def __init__(self, clients: api.EC2Clients, minimum_s: float) -> None:
        self.clients = clients
        self.minimum_s = minimum_s
        self._spot_cache: dict[tuple[Any, ...], list[tuple[float, float]]] = {}

    def price(self, cluster: Cluster, interval: CostInterval, node: NodeRecord | None) -> IntervalCost:
        meta: dict[str, Any] = node.extra if node is not None else {}
        spot: tuple[float, bool, str] | None = None
        if interval.market == "spot":
            stop = interval.stopped_at or time.time()
            od = float(meta.get("price_ondemand") or 0.0)
            catalog_spot = float(meta.get("price_spot_catalog") or interval.price_per_hour)
            rate, why = self.spot_rate(cluster, meta, interval.started_at, stop, od)
            spot = ((catalog_spot, True, f"spot: {why}; used the catalog's spot estimate ${catalog_spot:g}/h")
                    if rate is None else (rate, False, f"spot: ${rate:.4f}/h averaged from the spot price history"))
        return cloud_interval_cost(interval, minimum_s=self.minimum_s, spot=spot,
                                   disk_gb=float(meta.get("disk_gb") or 0),
                                   disk_usd_per_gb_month=ebs_rate(meta.get("region") or cluster.region),
                                   disk_label="EBS gp3")

    def spot_rate(self, cluster: Cluster, meta: dict[str, Any], start: float, stop: float,
                  on_demand: float) -> tuple[float | None, str]:
        """Time-weighted spot $/h over [start, stop] from the price history, or (None, why not)."""
        region, zone, itype = meta.get("region") or cluster.region, meta.get("zone"), meta.get("instance_type")
        if not (region and zone and itype):
            return None, "no zone recorded for this node"
        key = (region, zone, itype, int(start), int(stop))
        points = self._spot_cache.get(key)
        if points is None:
            try:
                ec2 = self.clients.ec2(region, api.profile_of(cluster))
                pts: list[tuple[float, float]] = []
                with api.call(f"{region}: describe_spot_price_history"):
                    for page in ec2.get_paginator("describe_spot_price_history").paginate(
                            InstanceTypes=[itype], ProductDescriptions=["Linux/UNIX"], AvailabilityZone=zone,
                            StartTime=dt.datetime.fromtimestamp(start, dt.UTC),
                            EndTime=dt.datetime.fromtimestamp(max(stop, start + 1), dt.UTC)):
                        for p in page["SpotPriceHistory"]:
                            pts.append((api.epoch(p["Timestamp"]), float(p["SpotPrice"])))
            except GtrainError as e:
                return None, f"spot price history unavailable ({e.message[:120]})"
            points = sorted(pts)
            self._spot_cache[key] = points
        if not points:
            return None, "no spot price history for this interval"
        # the first record is the price in effect at `start` (AWS returns the last change before it)
        total = 0.0
        span = max(stop - start, 1e-9)
        for i, (ts, p) in enumerate(points):
            seg_start = start if i == 0 else max(ts, start)
            seg_end = min(points[i + 1][0], stop) if i + 1 < len(points) else stop
            if seg_end > seg_start:
                total += p * (seg_end - seg_start)
        rate = total / span if stop > start else points[0][1]
        lo = min(p for _, p in points)
        if on_demand and (lo < SPOT_IMPLAUSIBLE_FRACTION * on_demand or rate > on_demand * 1.0001):
            return None, (f"the spot price history is implausible (${lo:g}/h against ${on_demand:g}/h on-demand)")
        return rate, ""
