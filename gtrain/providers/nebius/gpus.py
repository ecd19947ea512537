"""Nebius's GPU platforms and presets as gtrain knows them, and the bundled price table that is the catalog
fallback when the API's calculator does not answer.

Platforms and presets: https://docs.nebius.com/compute/virtual-machines/types (a preset names the GPUs, vCPUs
and GiB of RAM of one VM). Prices: https://nebius.com/prices (USD per GPU-hour, on-demand and preemptible, as
published on PRICES_AS_OF; since 2025-10 one unified price covers a VM's GPU, vCPU and RAM:
https://docs.nebius.com/signup-billing/billing-changes-oct-2025). These are ESTIMATES: ``up`` asks Nebius's
calculator (``CalculatorService.Estimate``) for the live price of the exact instance and freezes that; this
table is used only when it cannot answer, and the frozen price then says "estimate".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gtrain.errors import ConfigError

PRICES_AS_OF = "2026-05"


@dataclass(frozen=True)
class Platform:
    id: str  # gpu-h100-sxm
    gpu: str  # H100
    memory_gb: int
    presets: tuple[str, ...]  # by GPU count: 1gpu-..., 8gpu-...
    usd_per_gpu_hour: float  # on-demand, nebius.com/prices
    usd_per_gpu_hour_preemptible: float
    fabrics: tuple[str, ...]  # InfiniBand fabrics a GPU cluster of it can use

    def preset_for(self, gpus: int) -> str | None:
        return next((p for p in self.presets if gpu_count(p) == gpus), None)

    def price(self, gpus: int, preemptible: bool) -> float:
        each = self.usd_per_gpu_hour_preemptible if preemptible else self.usd_per_gpu_hour
        return round(each * gpus, 4)


PLATFORMS = (
    Platform("gpu-h100-sxm", "H100", 80, ("1gpu-16vcpu-200gb", "8gpu-128vcpu-1600gb"), 2.95, 1.25,
             ("fabric-2", "fabric-3", "fabric-4", "fabric-6")),
    Platform("gpu-h200-sxm", "H200", 141, ("1gpu-16vcpu-200gb", "8gpu-128vcpu-1600gb"), 3.50, 1.45,
             ("fabric-5", "fabric-7", "us-central1-a")),
    Platform("gpu-b200-sxm", "B200", 180, ("1gpu-20vcpu-224gb", "8gpu-160vcpu-1792gb"), 5.50, 2.30,
             ("us-central1-b",)),
)


def gpu_count(preset: str) -> int:
    m = re.match(r"^(\d+)gpu-", preset)
    return int(m.group(1)) if m else 0


def _norm(s: str) -> str:
    return re.sub(r"[\s_-]+", "", s.lower())


def choose(res: Any, platform: str | None, preset: str | None) -> tuple[Platform, str]:
    """(platform, preset) the spec asks for; ConfigError naming the field otherwise."""
    if platform:
        found = [p for p in PLATFORMS if p.id == platform]
        if not found:
            raise ConfigError(f"nebius.platform: {platform!r} is not a GPU platform gtrain knows",
                              hint="one of " + ", ".join(p.id for p in PLATFORMS), field="nebius.platform")
        plat = found[0]
    elif res.instance_type:
        found = [p for p in PLATFORMS if p.id == res.instance_type]
        if not found:
            raise ConfigError(f"resources.instance_type: {res.instance_type!r} is not a Nebius GPU platform",
                              hint="one of " + ", ".join(p.id for p in PLATFORMS), field="resources.instance_type")
        plat = found[0]
    elif res.accelerators:
        want = _norm(res.gpu_name)
        found = [p for p in PLATFORMS if _norm(p.gpu) == want or want in _norm(p.id)]
        if not found:
            raise ConfigError(f"resources.accelerators: Nebius has no GPU platform for {res.gpu_name!r}",
                              hint="H100, H200 or B200 (e.g. H100:8)", field="resources.accelerators")
        plat = found[0]
    else:
        raise ConfigError("resources: Nebius needs resources.accelerators (e.g. H100:8) or nebius.platform",
                          hint="gtrain rents Nebius GPU VMs", field="resources")
    if preset:
        if preset not in plat.presets:
            raise ConfigError(f"nebius.preset: {preset!r} is not a preset of {plat.id}",
                              hint="one of " + ", ".join(plat.presets), field="nebius.preset")
        return plat, preset
    gpus = res.gpus_per_node if res.accelerators else 1
    got = plat.preset_for(gpus)
    if got is None:
        raise ConfigError(f"resources.accelerators: {plat.id} has no preset with {gpus} GPUs",
                          hint="GPUs per VM: " + ", ".join(str(gpu_count(p)) for p in plat.presets),
                          field="resources.accelerators")
    return plat, got
