"""Lambda's instance types as gtrain reads them: the live list (``GET /instance-types``: price and the regions
with capacity now), or, for an offline ``--dry-run``, the small snapshot bundled beside this module
(``instance_types.json``, the API's own shape, no capacity), and the type a spec asks for."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gtrain.errors import ConfigError

#: the region codes of Lambda's OpenAPI document (PublicRegionCode)
REGIONS = ("us-east-1", "us-east-2", "us-east-3", "us-west-1", "us-west-2", "us-west-3", "us-south-1",
           "us-south-2", "us-south-3", "us-midwest-1", "europe-central-1", "asia-south-1", "asia-northeast-1",
           "asia-northeast-2", "australia-east-1", "me-west-1")
SNAPSHOT = Path(__file__).with_name("instance_types.json")
_NAME = re.compile(r"^gpu_(\d+)x_([a-z0-9]+)")


@dataclass
class LambdaType:
    name: str
    description: str
    price: float  # USD per hour
    vcpus: int
    memory_gib: float
    gpus: int
    gpu_name: str  # H100, A100, A10, ... (from the type's name)
    regions: list[str] = field(default_factory=list)  # regions with capacity now (empty in the snapshot)


def parse(data: dict[str, Any]) -> list[LambdaType]:
    out: list[LambdaType] = []
    for name, entry in sorted(data.items()):
        it = entry.get("instance_type") or {}
        specs = it.get("specs") or {}
        m = _NAME.match(name)
        out.append(LambdaType(
            name=name, description=str(it.get("description") or name),
            price=float(it.get("price_cents_per_hour") or 0) / 100.0, vcpus=int(specs.get("vcpus") or 0),
            memory_gib=float(specs.get("memory_gib") or 0), gpus=int(specs.get("gpus") or (m.group(1) if m else 0)),
            gpu_name=(m.group(2).upper() if m else ""),
            regions=[str(r.get("name")) for r in entry.get("regions_with_capacity_available") or [] if r.get("name")]))
    return out


def snapshot() -> tuple[list[LambdaType], str]:
    doc = json.loads(SNAPSHOT.read_text())
    return parse(doc["data"]), str(doc.get("_snapshot", "?"))


def check_regions(res: Any) -> list[str]:
    """The spec's regions, each a Lambda region code (ConfigError naming the field, exit 2, otherwise)."""
    if res.regions and res.region and res.region not in res.regions:
        raise ConfigError(f"resources.region: {res.region!r} is not in resources.regions",
                          hint="give one or the other", field="resources.region")
    if res.zones:
        raise ConfigError("resources.zones: Lambda Cloud has regions only", hint="use resources.region(s)",
                          field="resources.zones")
    given = res.region_list()
    for i, r in enumerate(given):
        if r not in REGIONS:
            where = f"resources.regions[{i}]" if res.regions else "resources.region"
            raise ConfigError(f"{where}: {r!r} is not a Lambda Cloud region",
                              hint=f"one of: {', '.join(REGIONS)}", field=where)
    return given


def choose(types: list[LambdaType], res: Any, regions: list[str]) -> LambdaType:
    """The type of ``resources.instance_type``, or the cheapest of ``resources.accelerators`` (``H100:8`` ->
    ``gpu_8x_h100_sxm5``), preferring one with capacity in ``regions`` (any region when none are given)."""
    if res.instance_type:
        found = next((t for t in types if t.name == res.instance_type), None)
        if found is None:
            raise ConfigError(f"resources.instance_type: {res.instance_type!r} is not a Lambda Cloud instance type",
                              hint=f"one of: {', '.join(t.name for t in types)}", field="resources.instance_type")
        if res.accelerators and (found.gpu_name != res.gpu_name.upper() or found.gpus != res.gpus_per_node):
            raise ConfigError(f"resources.accelerators: {res.accelerators} is not what {found.name} has "
                              f"({found.gpus}x {found.gpu_name})", hint="drop one of the two",
                              field="resources.accelerators")
        return found
    if not res.accelerators:
        raise ConfigError("resources: Lambda Cloud needs resources.accelerators (e.g. H100:8) or "
                          "resources.instance_type", hint="Lambda rents GPU machines only", field="resources")
    gpu, n = res.gpu_name.upper(), res.gpus_per_node
    same = [t for t in types if t.gpu_name == gpu and t.gpus == n]
    if not same:
        offered = sorted({f"{t.gpu_name}:{t.gpus}" for t in types})
        raise ConfigError(f"resources.accelerators: Lambda Cloud has no instance type with {n}x {gpu}",
                          hint=f"offered: {', '.join(offered)}", field="resources.accelerators")

    def has_capacity(t: LambdaType) -> bool:
        return bool(set(t.regions) & set(regions)) if regions else bool(t.regions)

    return sorted(same, key=lambda t: (not has_capacity(t), t.price, t.name))[0]
