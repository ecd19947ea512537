"""What an aws node costs. At ``up`` (:meth:`AWSPricing.at_launch`): a spot node's $/h is the live spot price
of its type in the zone it is launched in, the latest record of ``describe_spot_price_history``
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html); the catalog's spot
estimate when the history is missing, implausible or refused (the frozen price says which). An on-demand node's
is the catalog's list price, marked an estimate: AWS's live on-demand list is the Price List Query API
(``pricing`` ``get_products``, us-east-1 endpoint: https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html),
which moto, the emulator every aws test runs on, does not serve, so gtrain does not call it at launch (untested
code on the money path); ``gtrain catalog --refresh`` re-reads the same list prices from the bulk Price List.
After the fact: spot read from the history over the node's own running interval; EC2 bills per second with a
60-second minimum; the root EBS volume (gp3) is added by GB-hour at :data:`EBS_GP3_USD_PER_GB_MONTH`. And the
nodes' own cost cap for spot (:func:`budget_watch_user_data`: gtrain/providers/aws/nodebudget.py at boot, re-pricing
with the instance role). A part of :class:`gtrain.providers.aws.AWSProvider`."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.providers.aws import api
from gtrain.providers.cloud.billing import (
    FrozenPrice,
    catalog_price,
    cloud_interval_cost,
    live_or_catalog,
    live_price,
    price_label,
)

if TYPE_CHECKING:
    from gtrain.providers.base import IntervalCost
    from gtrain.state import Cluster, CostInterval
    from gtrain.state.nodes import NodeRecord

#: EBS gp3 storage, USD per GB-month (us-east-1/us-east-2/us-west-2 list price, 2025; eu-west-1 is 0.088).
#: gp3's baseline 3,000 IOPS and 125 MB/s are included; gtrain never asks for more. A month is 730 hours.
EBS_GP3_USD_PER_GB_MONTH = 0.08
EBS_GP3_BY_REGION = {"eu-west-1": 0.088}

SPOT_IMPLAUSIBLE_FRACTION = 0.01
#: why an on-demand node keeps the catalog's price (module docstring)
ON_DEMAND_WHY = ("AWS's live on-demand list (the Price List Query API) is not read at launch: no emulator serves "
                 "it to test against; `gtrain catalog --refresh` re-prices the catalog from the same list")
#: how often a spot node's own budget watch re-reads its spot price (gtrain/providers/aws/nodebudget.py)
BUDGET_CHECK_S = 60


def ebs_rate(region: str | None) -> float:
    return EBS_GP3_BY_REGION.get(region or "", EBS_GP3_USD_PER_GB_MONTH)


class AWSPricing:
    """Prices node intervals; caches the spot price history it reads."""

    def __init__(self, clients: api.EC2Clients, minimum_s: float) -> None:
        self.clients = clients
        self.minimum_s = minimum_s
        self._spot_cache: dict[tuple[Any, ...], list[tuple[float, float]]] = {}

    def at_launch(self, cluster: Cluster, region: str, zone: str, itype: str, spot: bool, on_demand: float,
                  catalog_spot: float, profile: str | None) -> FrozenPrice:
        """The $/h ``up`` freezes for nodes launched now in ``zone``: spot, the latest spot price there (the
        price in effect now: AWS answers a StartTime of now with the last change before it); on-demand, the
        catalog's list price (:data:`ON_DEMAND_WHY`)."""
        from gtrain.catalog import snapshot_date

        snapshot = snapshot_date("aws")
        if not spot:
            return catalog_price(on_demand, snapshot, ON_DEMAND_WHY)

        def fetch() -> FrozenPrice | None:
            ec2 = self.clients.ec2(region, profile)
            with api.call(f"{zone}: describe_spot_price_history {itype}"):
                got = ec2.describe_spot_price_history(
                    InstanceTypes=[itype], ProductDescriptions=["Linux/UNIX"], AvailabilityZone=zone,
                    StartTime=dt.datetime.now(dt.UTC))["SpotPriceHistory"]
            if not got:
                return None
            last = max(got, key=lambda p: api.epoch(p["Timestamp"]))
            usd = float(last["SpotPrice"])
            if on_demand and (usd < SPOT_IMPLAUSIBLE_FRACTION * on_demand or usd > on_demand * 1.0001):
                raise ValueError(f"the spot price history says ${usd:g}/h against ${on_demand:g}/h on-demand "
                                 "(implausible)")
            return live_price(usd, "aws spot price history", zone, api.epoch(last["Timestamp"]))

        return live_or_catalog(fetch, catalog_price(catalog_spot, snapshot))

    def price(self, cluster: Cluster, interval: CostInterval, node: NodeRecord | None) -> IntervalCost:
        meta: dict[str, Any] = node.extra if node is not None else {}
        frozen = {**cluster.extra, **meta}
        spot: tuple[float, bool, str] | None = None
        if interval.market == "spot":
            stop = interval.stopped_at or time.time()
            od = float(meta.get("price_ondemand") or 0.0)
            at_start = float(meta.get("price_spot_catalog") or interval.price_per_hour)
            label = price_label(frozen) or "the catalog's spot estimate"
            rate, why = self.spot_rate(cluster, meta, interval.started_at, stop, od)
            spot = ((at_start, True, f"spot: {why}; used the $/h frozen at start, ${at_start:g}/h {label}")
                    if rate is None else (rate, False, f"spot: ${rate:.4f}/h averaged from the spot price history"))
        return cloud_interval_cost(interval, minimum_s=self.minimum_s, spot=spot,
                                   disk_gb=float(meta.get("disk_gb") or 0),
                                   disk_usd_per_gb_month=ebs_rate(meta.get("region") or cluster.region),
                                   disk_label="EBS gp3", frozen=frozen)

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


def budget_watch_user_data(budget_usd: float, usd_per_hour: float, source: str, region: str, zone: str, itype: str,
                           interval_s: float = BUDGET_CHECK_S, *, root: str = "/opt/gtrain",
                           endpoint: str | None = None,
                           command: tuple[str, ...] = ("shutdown", "-h", "now")) -> str:
    """Shell lines for the node's cloud-init user data (after :func:`~gtrain.providers.aws.instances.
    shutdown_user_data`'s) that start the node's own budget watch at boot: gtrain/providers/aws/nodebudget.py, written
    to ``root``, re-reads the spot price of its type and zone every ``interval_s`` with the instance role's
    credentials (the role needs ``ec2:DescribeSpotPriceHistory``; without a role the frozen price holds, as the
    fixed lifetime does) and runs ``command`` (power off = terminate) before this node's ``budget_usd`` (what is
    left of its share of ``policies.max_cost_usd``) would be spent, at first ``usd_per_hour`` (the $/h frozen at
    ``up``, ``source`` its label). ``endpoint``: another EC2 endpoint (tests). The script travels gzipped (EC2's
    user data is at most 16 KB)."""
    import base64
    import gzip
    import shlex
    from pathlib import Path

    raw = Path(__file__).with_name("nodebudget.py").read_bytes()
    packed = base64.b64encode(gzip.compress(raw, mtime=0)).decode()
    script, state, log = f"{root}/nodebudget.py", f"{root}/budget.json", f"{root}/budget.log"
    args = ["--budget-usd", f"{budget_usd:.6f}", "--price", f"{usd_per_hour:g}", "--source", source,
            "--interval", f"{interval_s:g}", "--state", state, "--aws-region", region, "--aws-zone", zone,
            "--instance-type", itype, *(["--ec2-endpoint", endpoint] if endpoint else []), "--", *command]
    q = shlex.quote
    return ("\n# gtrain: policies.max_cost_usd held by the node at its live spot price (aws/nodebudget.py)\n"
            f"mkdir -p {q(root)}\n"
            f"echo {packed} | base64 -d | gunzip > {q(script)}\n"
            f"nohup python3 {q(script)} {' '.join(map(q, args))} >>{q(log)} 2>&1 &\n")


def node_budget_usd(policies: Any, num_nodes: int, usd_per_hour: float | None, cluster: Cluster) -> float | None:
    """What is left of one node's share of ``policies.max_cost_usd`` for a node made now, at the frozen $/h:
    its slot's time left under the cost cap alone (:func:`~gtrain.providers.cloud.lifetime.node_lifetime_s`: a
    replacement gets what is left, not a new share) times that price. None without a cost cap."""
    from gtrain.providers.cloud.lifetime import node_lifetime_s

    if not policies.max_cost_usd or not usd_per_hour:
        return None
    left = node_lifetime_s(policies.model_copy(update={"max_hours": None}), num_nodes, usd_per_hour, cluster)
    return None if left is None else left * usd_per_hour / 3600.0
