"""RunPod's GPU types as gtrain reads them from ``GET /v2/catalog/gpus`` (live list prices per GPU and cloud), and
the type a spec asks for: ``resources.accelerators: H100:1`` names a type by its short name (``H100 SXM``,
``RTX 4090``, matched without case, spaces or dashes) or its id (``NVIDIA H100 80GB HBM3``);
``resources.instance_type`` is a type's id."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gtrain.errors import ConfigError

CLOUDS = ("SECURE", "COMMUNITY")
#: the list a plan reads with no API key or network (``gtrain up --dry-run`` offline, ``any_of``): dated, its
#: prices list prices, marked as estimates where shown
SNAPSHOT = Path(__file__).with_name("gpu_types.json")


@dataclass(frozen=True)
class GpuType:
    id: str  # "NVIDIA H100 80GB HBM3": what a pod is created with
    name: str  # "H100 SXM"
    memory_gb: int
    secure_price: float | None  # USD/h for ONE GPU on Secure Cloud (None: not offered there)
    community_price: float | None
    max_secure: int
    max_community: int

    def price(self, cloud: str, count: int) -> float | None:
        """USD/h of a pod with ``count`` of these GPUs on ``cloud`` (the list price; the pod's ``cost`` is billed)."""
        each = self.secure_price if cloud == "SECURE" else self.community_price
        return None if each is None else round(each * count, 4)

    def max_count(self, cloud: str) -> int:
        return self.max_secure if cloud == "SECURE" else self.max_community


def _price(v: Any, offered: Any) -> float | None:
    if offered is False or isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        return None  # RunPod lists 0 (or the type as not on that cloud) for what it does not offer
    return float(v)


def parse(gpus: list[dict[str, Any]]) -> list[GpuType]:
    out = []
    for g in gpus:
        if not isinstance(g, dict) or not g.get("id"):
            continue
        price: dict[str, Any] = g["price"] if isinstance(g.get("price"), dict) else {}
        most: dict[str, Any] = g["maxCount"] if isinstance(g.get("maxCount"), dict) else {}
        out.append(GpuType(id=str(g["id"]), name=str(g.get("name") or g["id"]), memory_gb=int(g.get("memory") or 0),
                           secure_price=_price(price.get("secure"), g.get("secure")),
                           community_price=_price(price.get("community"), g.get("community")),
                           max_secure=int(most.get("secure") or 0), max_community=int(most.get("community") or 0)))
    return sorted(out, key=lambda t: t.id)


def snapshot() -> tuple[list[GpuType], str]:
    """The bundled list and its date."""
    doc = json.loads(SNAPSHOT.read_text())
    return parse(doc["gpus"]), str(doc.get("_snapshot", "?"))


def _norm(s: str) -> str:
    return re.sub(r"[\s_-]+", "", s.lower())


def choose(types: list[GpuType], res: Any, cloud: str) -> tuple[GpuType, int]:
    """(GPU type, GPUs per pod) the spec asks for, on ``cloud``; ConfigError naming the field otherwise."""
    if res.instance_type:
        found = [t for t in types if t.id == res.instance_type]
        field = "resources.instance_type"
        if not found:
            raise ConfigError(f"{field}: {res.instance_type!r} is not a RunPod GPU type id",
                              hint="e.g. " + ", ".join(t.id for t in types[:6]), field=field)
        count = res.gpus_per_node if res.accelerators else 1
    else:
        if not res.accelerators:
            raise ConfigError("resources: RunPod needs resources.accelerators (e.g. H100:1) or resources.instance_type "
                              "(a GPU type id)", hint="gtrain rents RunPod GPU pods only", field="resources")
        field = "resources.accelerators"
        want, count = _norm(res.gpu_name), res.gpus_per_node
        found = [t for t in types if _norm(t.id) == want or _norm(t.name) == want]
        if not found:  # "H100" -> every H100 variant; the cheapest one offered on the cloud wins
            found = [t for t in types if want in _norm(t.name) or want in _norm(t.id)]
        if not found:
            raise ConfigError(f"{field}: RunPod has no GPU type named {res.gpu_name!r}",
                              hint="e.g. " + ", ".join(sorted({t.name for t in types})[:10]), field=field)
    offered = [t for t in found if t.price(cloud, count) is not None and count <= (t.max_count(cloud) or count)]
    if not offered:
        names = ", ".join(t.id for t in found[:4])
        raise ConfigError(f"{field}: {count}x {names} is not offered on RunPod's {cloud} cloud (per-pod maximum "
                          f"{max(t.max_count(cloud) for t in found)})",
                          hint="fewer GPUs per node, or runpod.cloud: "
                               + ("COMMUNITY" if cloud == "SECURE" else "SECURE"),
                          field=field)
    best = sorted(offered, key=lambda t: (t.price(cloud, count) or 0.0, t.id))[0]
    return best, count
