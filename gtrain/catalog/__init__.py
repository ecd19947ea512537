"""The GPU instance catalog: what each cloud sells, where, and at what hourly price.

Data lives in ``aws.csv`` and ``gcp.csv`` next to this module (package data, read through
``importlib.resources``). A user copy at ``$GTRAIN_HOME/catalog/<provider>.csv`` (``GTRAIN_HOME`` defaults
to ``~/.gtrain``) replaces the shipped file for that provider, whole; see README.md for columns and sources.

Importing this module is cheap: nothing is parsed until the first call, and each file is parsed once
(re-read only when the file in use changes). Stdlib only.

GPU names are matched exactly, case-insensitively: ``A100`` is the 40 GB part and does not match
``A100-80GB``; ask for ``A100-80GB`` to get the 80 GB one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from gtrain.errors import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import time matters here)
if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["PROVIDERS", "CatalogSource", "Offer", "gpu_names", "lookup", "offers", "parse_accelerators", "regions",
           "resolve", "snapshot_date", "source"]

PROVIDERS = ("aws", "gcp", "azure")
_ACCEL_PATTERN = r"^\s*([A-Za-z0-9][A-Za-z0-9_-]*)\s*(?::\s*(\d+))?\s*$"
#: the comment line that dates a catalog file: ``# snapshot: 2025-12`` (shipped) or ``2026-05-12`` (refreshed)
SNAPSHOT_PREFIX = "# snapshot:"


@dataclass(frozen=True)
class Offer:
    """One instance type (plus, on GCP, its attached accelerator) in one region, with hourly USD prices."""

    provider: str
    instance_type: str
    accelerator_type: str | None  # GCP accelerator name (nvidia-tesla-t4, ...); None on AWS
    vcpus: int
    memory_gib: float
    gpu_name: str
    gpu_count: int
    gpu_memory_gib: float  # per GPU
    region: str
    price_ondemand: float
    price_spot: float
    efa: bool = False  # always False on GCP

    def price(self, spot: bool) -> float:
        return self.price_spot if spot else self.price_ondemand

    def with_price(self, spot: bool, usd_per_hour: float) -> Offer:
        """This offer at another $/h in one market: the live price ``up`` froze (gtrain.providers.cloud.billing)."""
        return replace(self, price_spot=usd_per_hour) if spot else replace(self, price_ondemand=usd_per_hour)

    @property
    def accelerators(self) -> str:
        """The spec spelling of this offer's GPUs, e.g. ``A100:8``."""
        return f"{self.gpu_name}:{self.gpu_count}"


@dataclass(frozen=True)
class CatalogSource:
    """Which file a provider's offers come from, and how old its prices are."""

    provider: str
    snapshot: str  # "2025-12" (the shipped file), "2026-05-12" (a refresh), "undated" (a hand-made copy)
    path: str  # the file read
    user_copy: bool  # True: $GTRAIN_HOME/catalog/<provider>.csv, which replaces the shipped file


# ---------------------------------------------------------------------------------------------- loading

_cache: dict[str, tuple[tuple[str, int], tuple[Offer, ...], CatalogSource]] = {}


def _override_file(provider: str) -> str:
    home = os.environ.get("GTRAIN_HOME") or os.path.join(os.path.expanduser("~"), ".gtrain")
    return os.path.join(os.path.expanduser(home), "catalog", f"{provider}.csv")


def override_path(provider: str) -> Path:
    """Where a user copy of the provider's catalog is looked for (``$GTRAIN_HOME/catalog/<provider>.csv``;
    it need not exist). A refresh command may write it; deleting it falls back to the shipped file."""
    from pathlib import Path

    return Path(_override_file(provider))


def _check_provider(provider: str) -> str:
    p = (provider or "").strip().lower()
    if p not in PROVIDERS:
        raise ConfigError(
            f"resources.provider: no catalog for provider {provider!r}",
            hint=f"the catalog covers {', '.join(PROVIDERS)}",
            field="resources.provider",
        )
    return p


def _load(provider: str) -> tuple[Offer, ...]:
    return _entry(provider)[1]


def _entry(provider: str) -> tuple[tuple[str, int], tuple[Offer, ...], CatalogSource]:
    user = _override_file(provider)
    try:
        key: tuple[str, int] = (user, os.stat(user).st_mtime_ns)
    except OSError:
        key = ("", 0)
    hit = _cache.get(provider)
    if hit is not None and hit[0] == key:
        return hit
    if key[0]:
        with open(user, encoding="utf-8") as f:
            text = f.read()
        source = user
    else:
        text = shipped_text(provider)
        source = f"{__name__}/{provider}.csv"
    entry = (key, _parse(provider, text, source), CatalogSource(provider, _snapshot(text), source, bool(key[0])))
    _cache[provider] = entry
    return entry


def shipped_text(provider: str) -> str:
    """The text of the catalog file shipped with gtrain (what a refresh starts from)."""
    from importlib.resources import files

    return (files(__name__) / f"{provider}.csv").read_text(encoding="utf-8")


def _snapshot(text: str) -> str:
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(SNAPSHOT_PREFIX):
            return line[len(SNAPSHOT_PREFIX):].strip() or "undated"
    return "undated"


def source(provider: str) -> CatalogSource:
    """Where ``provider``'s offers are read from now and the date of their prices."""
    return _entry(_check_provider(provider))[2]


def snapshot_date(provider: str | None = None) -> str:
    """How old the catalog's prices are: ``"2025-12"`` for the shipped files, the refresh day for a user copy
    written by ``gtrain catalog --refresh``. With no provider: one date when all agree, else
    ``"aws 2026-05-12, gcp 2025-12"``."""
    if provider is not None:
        return source(provider).snapshot
    dates = {p: source(p).snapshot for p in PROVIDERS}
    if len(set(dates.values())) == 1:
        return next(iter(dates.values()))
    return ", ".join(f"{p} {d}" for p, d in dates.items())


def _parse(provider: str, text: str, source: str) -> tuple[Offer, ...]:
    import csv

    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    out: list[Offer] = []
    for n, row in enumerate(csv.DictReader(lines), start=2):
        try:
            efa = (row.get("efa") or "false").strip().lower()
            if efa not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"efa must be true/false, not {efa!r}")
            acc = (row.get("accelerator_type") or "").strip() or None
            out.append(
                Offer(
                    provider=provider,
                    instance_type=row["instance_type"].strip(),
                    accelerator_type=acc if provider == "gcp" else None,
                    vcpus=int(row["vcpus"]),
                    memory_gib=float(row["memory_gib"]),
                    gpu_name=row["gpu_name"].strip(),
                    gpu_count=int(row["gpu_count"]),
                    gpu_memory_gib=float(row["gpu_memory_gib"]),
                    region=row["region"].strip(),
                    price_ondemand=float(row["price_ondemand"]),
                    price_spot=float(row["price_spot"]),
                    efa=provider == "aws" and efa in ("true", "1", "yes"),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(
                f"catalog {source}: bad data row {n}: {e}",
                hint=f"fix or delete {_override_file(provider)} to fall back to the shipped catalog",
                field="catalog",
            ) from e
    return tuple(out)


def _all(provider: str | None) -> list[Offer]:
    if provider is None:
        return [o for p in PROVIDERS for o in _load(p)]
    return list(_load(_check_provider(provider)))


def _order(o: Offer, spot: bool) -> tuple[float, str, str, int, str]:
    return (o.price(spot), o.provider, o.instance_type, o.gpu_count, o.region)


# ---------------------------------------------------------------------------------------------- queries


def offers(
    provider: str | None = None,
    gpu: str | None = None,
    gpu_count: int | None = None,
    region: str | None = None,
    spot: bool = False,
) -> list[Offer]:
    """All offers matching the filters, cheapest first (by spot price when ``spot``), then by name.

    ``gpu`` is an exact, case-insensitive GPU name (``A100`` does not match ``A100-80GB``).
    """
    out = _all(provider)
    if gpu is not None:
        g = gpu.strip().lower()
        out = [o for o in out if o.gpu_name.lower() == g]
    if gpu_count is not None:
        out = [o for o in out if o.gpu_count == gpu_count]
    if region is not None:
        r = region.strip().lower()
        out = [o for o in out if o.region.lower() == r]
    return sorted(out, key=lambda o: _order(o, spot))


def lookup(provider: str, instance_type: str, region: str | None = None) -> list[Offer]:
    """Every offer of one instance type (all regions, or one), cheapest on-demand first.

    On GCP an N1 machine type appears once per attached accelerator configuration.
    """
    t = instance_type.strip().lower()
    out = [o for o in _all(provider) if o.instance_type.lower() == t]
    if region is not None:
        r = region.strip().lower()
        out = [o for o in out if o.region.lower() == r]
    return sorted(out, key=lambda o: _order(o, False))


def gpu_names(provider: str | None = None) -> list[str]:
    return sorted({o.gpu_name for o in _all(provider)})


def regions(provider: str) -> list[str]:
    return sorted({o.region for o in _all(provider)})


def parse_accelerators(accelerators: str) -> tuple[str, int]:
    """``"A100:8"`` -> ``("A100", 8)``; a bare name means one GPU."""
    import re

    m = re.match(_ACCEL_PATTERN, accelerators or "")
    if not m or (m.group(2) is not None and int(m.group(2)) < 1):
        raise ConfigError(
            f"resources.accelerators: {accelerators!r} is not GPU:COUNT",
            hint="write it like A100:8 or H100:1",
            field="resources.accelerators",
        )
    return m.group(1), int(m.group(2) or 1)


# ---------------------------------------------------------------------------------------------- resolve


def _near(word: str, choices: list[str], n: int = 3) -> list[str]:
    import difflib

    by_lower = {c.lower(): c for c in choices}
    return [by_lower[c] for c in difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=0.5)]


def _did_you_mean(word: str, choices: list[str], what: str) -> str:
    near = _near(word, choices)
    head = f"did you mean {' or '.join(near)}? " if near else ""
    listed = ", ".join(choices) if len(choices) <= 12 else ", ".join(choices[:12]) + ", ..."
    return f"{head}known {what}: {listed}"


def _counts_summary(matching: list[Offer]) -> str:
    """'1 (a2-highgpu-1g), 2 (a2-highgpu-2g), 8 (a2-highgpu-8g)'"""
    by_count: dict[int, list[str]] = {}
    for o in sorted(matching, key=lambda o: (o.gpu_count, o.price_ondemand, o.instance_type)):
        names = by_count.setdefault(o.gpu_count, [])
        if o.instance_type not in names:
            names.append(o.instance_type)
    parts = []
    for count, names in sorted(by_count.items()):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{count} ({shown})")
    return ", ".join(parts)


def resolve(
    provider: str,
    accelerators: str | None,
    instance_type: str | None,
    region: str | None,
    spot: bool,
) -> Offer:
    """The cheapest offer that fits: ``accelerators`` ("A100:8": that GPU, exactly that many per node) and/or
    ``instance_type`` (both given: they must agree), in ``region`` if given, else in the cheapest region.
    Prices compared are spot prices when ``spot``. Raises ConfigError naming the field, the bad value and a fix.
    """
    prov = _check_provider(provider)
    everything = list(_load(prov))
    cands = everything

    if region is not None:
        known_regions = sorted({o.region for o in everything})
        if region.strip().lower() not in {r.lower() for r in known_regions}:
            raise ConfigError(
                f"resources.region: {prov} has no GPU offers in the catalog for region {region!r}",
                hint=_did_you_mean(region, known_regions, f"{prov} regions"),
                field="resources.region",
            )

    if instance_type is not None:
        t = instance_type.strip().lower()
        cands = [o for o in cands if o.instance_type.lower() == t]
        if not cands:
            types = sorted({o.instance_type for o in everything})
            raise ConfigError(
                f"resources.instance_type: no {prov} GPU instance type {instance_type!r} in the catalog",
                hint=_did_you_mean(instance_type, types, f"{prov} GPU instance types")
                + f"; `gtrain catalog --provider {prov}` lists them all",
                field="resources.instance_type",
            )

    if accelerators is not None:
        name, count = parse_accelerators(accelerators)
        names = sorted({o.gpu_name for o in everything})
        if name.lower() not in {n.lower() for n in names}:
            raise ConfigError(
                f"resources.accelerators: no {prov} GPU named {name!r}",
                hint=_did_you_mean(name, names, f"{prov} GPUs") + " (names match exactly; A100 is the 40 GB part)",
                field="resources.accelerators",
            )
        canon = next(n for n in names if n.lower() == name.lower())
        same_gpu_all = [o for o in everything if o.gpu_name == canon]
        if not any(o.gpu_count == count for o in same_gpu_all):
            counts = sorted({o.gpu_count for o in same_gpu_all})
            below = [c for c in counts if c < count][-1:]
            above = [c for c in counts if c > count][:1]
            nearest = " or ".join(f"{canon}:{c}" for c in below + above)
            raise ConfigError(
                f"resources.accelerators: no {prov} offer with {canon}:{count} — "
                f"{canon} comes in counts {_counts_summary(same_gpu_all)}",
                hint=f"use {nearest} per node (scale out with more nodes)",
                field="resources.accelerators",
            )
        if instance_type is not None:
            agree = [o for o in cands if o.gpu_name == canon and o.gpu_count == count]
            if not agree:
                has = sorted({o.accelerators for o in cands}, key=lambda a: (a.split(":")[0], int(a.split(":")[1])))
                fits = sorted({o.instance_type for o in same_gpu_all if o.gpu_count == count})
                raise ConfigError(
                    f"resources.accelerators: {canon}:{count} does not match resources.instance_type "
                    f"{cands[0].instance_type!r}, which has {' or '.join(has)}",
                    hint=f"drop one of the two, or make them agree: {canon}:{count} is on {', '.join(fits[:4])}",
                    field="resources.accelerators",
                )
            cands = agree
        else:
            cands = [o for o in same_gpu_all if o.gpu_count == count]
        wanted = f"{canon}:{count}" + (f" on {cands[0].instance_type}" if instance_type is not None else "")
    elif instance_type is not None:
        wanted = cands[0].instance_type
    else:
        raise ConfigError(
            "resources.accelerators: nothing to resolve — set resources.accelerators or resources.instance_type",
            hint="e.g. accelerators: A100:8, or instance_type: p4d.24xlarge",
            field="resources.accelerators",
        )

    if region is not None:
        r = region.strip().lower()
        in_region = [o for o in cands if o.region.lower() == r]
        if not in_region:
            where = sorted({o.region for o in cands})
            raise ConfigError(
                f"resources.region: no {prov} offer with {wanted} in {region}; it is offered in {', '.join(where)}",
                hint="pick one of those regions, or leave resources.region unset to take the cheapest",
                field="resources.region",
            )
        cands = in_region

    return min(cands, key=lambda o: _order(o, spot))
