"""The Cloud TPU types gtrain knows (``tpu.csv`` beside this file): chips and worker hosts per slice, the zones
that offer them, on-demand and spot $ per chip-hour, and the default TPU software (runtime) version. Data only:
no SDK, no network, so the spec's checks and ``gtrain catalog --tpu`` use it offline.

A spec names a type as ``resources.accelerators: tpu-v5p-32`` (the ``tpu-`` prefix, then the TPU API's
``acceleratorType``: generation and size; for v4/v5p the size counts TensorCores, two per chip; for v5e/v6e it
counts chips).

``gtrain catalog --refresh`` (gcp) writes a re-priced copy to ``$GTRAIN_HOME/catalog/tpu.csv``
(:mod:`.prices`), which then replaces the shipped file; deleting it falls back to the shipped one. Shared code
reads these types through :func:`gtrain.registry.accelerator_shape` (:func:`shapes`)."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtrain.registry import AcceleratorShape

__all__ = ["RUNTIMES", "TPUType", "is_tpu", "lookup", "shapes", "snapshot", "text", "topology_chips", "tpu_types",
           "user_copy"]

CSV = Path(__file__).with_name("tpu.csv")
PREFIX = "tpu-"
_TOPOLOGY = re.compile(r"^\d+x\d+(x\d+)?$")

#: the runtime versions a generation accepts (https://cloud.google.com/tpu/docs/runtimes); the first is "auto"
RUNTIMES: dict[str, tuple[str, ...]] = {
    "v4": ("tpu-ubuntu2204-base", "tpu-vm-v4-base", "tpu-vm-v4-pt-2.0", "tpu-vm-tf-2.16.1-pod-pjrt"),
    "v5e": ("v2-alpha-tpuv5-lite", "tpu-ubuntu2204-base"),
    "v5p": ("v2-alpha-tpuv5", "tpu-ubuntu2204-base"),
    "v6e": ("v2-alpha-tpuv6e",),
}


@dataclass(frozen=True)
class TPUType:
    accelerator_type: str  # the TPU API's acceleratorType: v5p-32
    generation: str  # v4, v5e, v5p, v6e
    chips: int
    hosts: int
    zones: tuple[str, ...]
    price_ondemand_chip_h: float
    price_spot_chip_h: float
    runtime_version: str

    @property
    def name(self) -> str:
        return PREFIX + self.accelerator_type

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    def price_per_host_hour(self, spot: bool) -> float:
        return round((self.price_spot_chip_h if spot else self.price_ondemand_chip_h) * self.chips_per_host, 4)

    def price_per_hour(self, spot: bool) -> float:
        return round(self.price_per_host_hour(spot) * self.hosts, 4)

    @property
    def api_generation(self) -> str:
        """acceleratorConfig.type: V4, V5LITE_POD, V5P, V6E."""
        return {"v5e": "V5LITE_POD"}.get(self.generation, self.generation.upper())

    def region_zones(self, region: str | None) -> list[str]:
        return [z for z in self.zones if region is None or z.rsplit("-", 1)[0] == region]


def is_tpu(accelerators: str | None) -> bool:
    return bool(accelerators) and str(accelerators).strip().lower().startswith(PREFIX)


def user_copy() -> Path:
    """``$GTRAIN_HOME/catalog/tpu.csv``: a re-priced copy that replaces the shipped file (it need not exist)."""
    import os

    home = os.environ.get("GTRAIN_HOME") or os.path.join(os.path.expanduser("~"), ".gtrain")
    return Path(os.path.expanduser(home)) / "catalog" / "tpu.csv"


def text() -> str:
    """The catalog in use: the user copy when there is one, else the shipped file."""
    try:
        return user_copy().read_text(encoding="utf-8")
    except OSError:
        return CSV.read_text(encoding="utf-8")


def tpu_types() -> dict[str, TPUType]:
    body = text()
    try:
        return _parse(body)
    except (KeyError, ValueError, TypeError) as e:  # only a user copy can be malformed: the shipped file is tested
        from gtrain.errors import ConfigError

        raise ConfigError(f"{user_copy()}: not a Cloud TPU types catalog ({type(e).__name__}: {e})",
                          hint="fix it, or delete it to fall back to the types shipped with gtrain "
                               "(`gtrain catalog --refresh` writes a new one)", field="GTRAIN_HOME") from None


@lru_cache(maxsize=4)
def _parse(body: str) -> dict[str, TPUType]:
    lines = [ln for ln in body.splitlines() if ln.strip() and not ln.startswith("#")]
    out: dict[str, TPUType] = {}
    for r in csv.DictReader(lines):
        t = TPUType(r["accelerator_type"], r["generation"], int(r["chips"]), int(r["hosts"]),
                    tuple(r["zones"].split()), float(r["price_ondemand_chip_h"]), float(r["price_spot_chip_h"]),
                    r["runtime_version"])
        out[t.name] = t
    return out


def snapshot() -> str:
    return snapshot_of(text())


def snapshot_of(body: str) -> str:
    return next((ln.split(":", 1)[1].strip() for ln in body.splitlines() if ln.startswith("# snapshot:")), "?")


def check_text(body: str, source: str) -> None:
    """A catalog text every row of which parses (before it is written); GtrainError naming the source if not."""
    from gtrain.errors import GtrainError

    try:
        if not _parse(body):
            raise ValueError("no rows")
    except (KeyError, ValueError, TypeError) as e:
        raise GtrainError(f"{source}: not a Cloud TPU types catalog ({e})") from None


def shapes() -> dict[str, AcceleratorShape]:
    """Every type as the registry's :class:`~gtrain.registry.AcceleratorShape` (the seam's view)."""
    from gtrain.registry import AcceleratorShape

    day = snapshot()
    return {n: AcceleratorShape(n, "tpu", "gcp", t.generation, t.chips, t.hosts, t.zones, t.price_ondemand_chip_h,
                                t.price_spot_chip_h, day) for n, t in tpu_types().items()}


def lookup(accelerators: str) -> TPUType:
    """The type named ``tpu-v5p-32``; ValueError naming the known ones."""
    name = accelerators.strip().lower()
    t = tpu_types().get(name)
    if t is None:
        known = ", ".join(sorted(tpu_types(), key=lambda n: (n.rsplit("-", 1)[0], int(n.rsplit("-", 1)[1]))))
        raise ValueError(f"{accelerators!r} is not a Cloud TPU type gtrain knows (known: {known}; "
                         "`gtrain catalog --tpu` lists them)")
    return t


def topology_chips(topology: str) -> int:
    """``2x2x4`` -> 16; ValueError when it is not AxB or AxBxC."""
    if not _TOPOLOGY.match(topology):
        raise ValueError(f"{topology!r} is not a TPU topology (AxB or AxBxC, e.g. 2x2x4)")
    n = 1
    for part in topology.split("x"):
        n *= int(part)
    return n
