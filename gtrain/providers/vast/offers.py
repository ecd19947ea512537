"""Vast.ai's marketplace as gtrain reads it: the query ``up`` sends (``POST /api/v0/bundles/``: GPU name and
count, host reliability, bandwidth, the spec's regions as countries, on-demand or interruptible), the offers it
gets back, what each would bill, and which of them the spec's caps let it take.

A Vast price is set per host and changes with the market, so the price is the offer's own, read at ``up``:
on-demand, ``dph_total`` (the host's ``dph_base`` plus the storage of the disk asked for, which the query
prices in through ``allocated_storage``); interruptible, the bid (``vast.bid_usd_per_hour``, else the offer's
``min_bid``) plus that same storage part. Bandwidth (``inet_up_cost``/``inet_down_cost``, $/GB) is billed by use
and is not in the $/h: the plan names it.

The caps: ``vast.max_usd_per_hour`` skips an offer billing more per node, and ``policies.max_cost_usd`` skips an
offer of which one hour for every node costs more than what is left of the budget (the budget less what the
cluster has already cost, so a recovery does not spend it again)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError

if TYPE_CHECKING:
    from gtrain.providers.vast.options import VastOptions

#: GPU names as Vast's offers spell them (``gpu_name``), for matching a spec's short name (``H100`` -> every
#: H100 variant); a name not here is sent as given (``RTX_A5000`` -> ``RTX A5000``, the CLI's convention)
GPU_NAMES = ("A10", "A100 PCIE", "A100 SXM4", "A100X", "A40", "A800 PCIE", "B200", "GH200 SXM", "H100 NVL",
             "H100 PCIE", "H100 SXM", "H200", "H200 NVL", "L4", "L40", "L40S", "RTX 3060", "RTX 3080", "RTX 3090",
             "RTX 4070", "RTX 4080", "RTX 4090", "RTX 5090", "RTX 6000Ada", "RTX A4000", "RTX A5000", "RTX A6000",
             "Tesla T4", "Tesla V100")
COUNTRY = re.compile(r"^[A-Z]{2}$")
#: offers asked for per search (cheapest first): enough to skip what the caps refuse
SEARCH_LIMIT = 64


def _norm(s: str) -> str:
    return re.sub(r"[\s_-]+", "", s.lower())


def gpu_names(wanted: str) -> list[str]:
    """The Vast ``gpu_name`` values a spec's name means: an exact name, else every variant it prefixes."""
    w = _norm(wanted)
    exact = [n for n in GPU_NAMES if _norm(n) == w]
    if exact:
        return exact
    variants = [n for n in GPU_NAMES if _norm(n).startswith(w) or _norm(n).removeprefix("tesla").startswith(w)]
    return variants or [wanted.replace("_", " ").strip()]


def countries(res: Any) -> list[str]:
    """The spec's regions as Vast geolocations (two-letter country codes); ConfigError naming the field."""
    if res.zones:
        raise ConfigError("resources.zones: Vast.ai places instances by host, filtered by country",
                          field="resources.zones", hint="give country codes in resources.regions (e.g. US, DE)")
    given = res.region_list()
    for i, cc in enumerate(given):
        if not COUNTRY.match(cc):
            where = f"resources.regions[{i}]" if res.regions else "resources.region"
            raise ConfigError(f"{where}: {cc!r} is not a country code (Vast.ai filters offers by the host's country)",
                              field=where, hint="two capital letters, e.g. US, CA, DE, SE, TW")
    return given


def query(names: list[str], count: int, opts: VastOptions, disk_gb: int, spot: bool,
          where: list[str]) -> dict[str, Any]:
    """The ``POST /api/v0/bundles/`` body: the CLI's default filters (verified, rentable, not rented, not
    external), the GPU, the caps the server can apply, cheapest first, the disk priced in."""
    q: dict[str, Any] = {"rentable": {"eq": True}, "rented": {"eq": False}, "external": {"eq": False},
                         "num_gpus": {"eq": count}, "reliability": {"gte": opts.min_reliability},
                         "gpu_name": {"eq": names[0]} if len(names) == 1 else {"in": names}}
    if opts.verified:
        q["verified"] = {"eq": True}
    if where:
        q["geolocation"] = {"in": list(where)}
    if opts.min_inet_down_mbps:
        q["inet_down"] = {"gte": opts.min_inet_down_mbps}
    if opts.max_usd_per_hour and not spot:
        q["dph_total"] = {"lte": opts.max_usd_per_hour}
    q.update({"order": [["dph_total", "asc"]], "type": "bid" if spot else "on-demand", "limit": SEARCH_LIMIT,
              "allocated_storage": disk_gb})
    return q


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else None


@dataclass(frozen=True)
class Offer:
    id: int
    machine_id: int | None
    gpu_name: str
    num_gpus: int
    gpu_ram_gb: float
    dph_base: float
    dph_total: float
    min_bid: float | None
    reliability: float
    country: str | None
    geolocation: str
    inet_down: float | None
    inet_up_cost: float | None
    inet_down_cost: float | None

    def storage_per_hour(self) -> float:
        """What the disk adds to the $/h (``dph_total`` less ``dph_base``)."""
        return max(0.0, self.dph_total - self.dph_base)

    def bid(self, opts: VastOptions) -> float | None:
        """The interruptible bid for it ($/h per machine): the user's, else the offer's ``min_bid``."""
        return opts.bid_usd_per_hour or self.min_bid

    def price(self, opts: VastOptions, spot: bool) -> float | None:
        """USD/h it bills: ``dph_total`` on demand; the bid plus the storage part interruptible."""
        if not spot:
            return round(self.dph_total, 6)
        b = self.bid(opts)
        return None if b is None else round(b + self.storage_per_hour(), 6)


def parse(rows: list[dict[str, Any]]) -> list[Offer]:
    out = []
    for o in rows:
        oid, total, base = o.get("id"), _num(o.get("dph_total")), _num(o.get("dph_base"))
        if not isinstance(oid, int) or isinstance(oid, bool) or total is None or total <= 0:
            continue
        geo = str(o.get("geolocation") or "")
        cc = geo.rsplit(",", 1)[-1].strip() if geo else ""
        rel = _num(o.get("reliability2"))
        rel = _num(o.get("reliability")) if rel is None else rel
        mid = o.get("machine_id")
        out.append(Offer(id=oid, machine_id=mid if isinstance(mid, int) else None, gpu_name=str(o.get("gpu_name")),
                         num_gpus=int(_num(o.get("num_gpus")) or 0), gpu_ram_gb=round((_num(o.get("gpu_ram")) or 0)
                                                                                      / 1024, 1),
                         dph_base=base if base is not None else total, dph_total=total,
                         min_bid=_num(o.get("min_bid")), reliability=rel or 0.0,
                         country=cc if COUNTRY.match(cc) else None, geolocation=geo,
                         inet_down=_num(o.get("inet_down")), inet_up_cost=_num(o.get("inet_up_cost")),
                         inet_down_cost=_num(o.get("inet_down_cost"))))
    return out


@dataclass(frozen=True)
class Pick:
    offer: Offer
    price: float  # USD/h per node


def choose(offers: list[Offer], opts: VastOptions, spot: bool, count: int, where: list[str], nodes: int,
           budget_left: float | None) -> tuple[list[Pick], list[str]]:
    """(the offers the caps allow, cheapest first, more reliable first at one price; why each other was skipped).
    The server filtered already; this checks again what it sent back (a host's price can move between the
    search and the answer) and applies the caps it cannot: the bid's price and what is left of the budget."""
    picks: list[Pick] = []
    skipped: list[str] = []
    for o in offers:
        price = o.price(opts, spot)
        if o.num_gpus != count or o.reliability < opts.min_reliability or (where and o.country not in where):
            continue
        if price is None:
            skipped.append(f"offer {o.id}: no min_bid for an interruptible bid")
        elif opts.max_usd_per_hour is not None and price > opts.max_usd_per_hour + 1e-9:
            skipped.append(f"offer {o.id}: ${price:.4f}/h is above vast.max_usd_per_hour ${opts.max_usd_per_hour:g}")
        elif budget_left is not None and price * nodes > budget_left + 1e-9:
            skipped.append(f"offer {o.id}: an hour of {nodes} node(s) at ${price:.4f}/h is more than the "
                           f"${budget_left:.2f} left of policies.max_cost_usd")
        else:
            picks.append(Pick(o, price))
    picks.sort(key=lambda p: (p.price, -p.offer.reliability, p.offer.id))
    return picks, skipped


#: the prices a plan reads with no API key or network (``up --dry-run`` offline, ``any_of``): per GPU, dated
SNAPSHOT = Path(__file__).with_name("market.json")


def snapshot_price(names: list[str], count: int, spot: bool) -> tuple[str, float, str] | None:
    """(Vast gpu_name, USD/h of ``count`` of it, the snapshot's date) from the bundled market prices: the cheapest
    of the names the spec means; None when the snapshot has none of them."""
    doc = json.loads(SNAPSHOT.read_text())
    rows = [(n, float(doc["gpus"][n][1 if spot else 0]) * count) for n in names if n in doc["gpus"]]
    if not rows:
        return None
    name, price = min(rows, key=lambda r: (r[1], r[0]))
    return name, round(price, 4), str(doc.get("_snapshot", "?"))

