"""Energy of a run: the GPU power draw the telemetry sampler keeps (``telemetry/node-K.jsonl``, ``power`` in W
from ``nvidia-smi --query-gpu=power.draw``) integrated over time, per GPU, per node and per job, and its
carbon estimate from the region's grid intensity (``gtrain/catalog/grid_intensity.csv``, dated and cited).

How it is counted (docs/energy.md):

- between two samples of one GPU no more than :data:`MAX_GAP_S` apart, the mean of their draws times the time
  between them (the trapezoid rule); a longer gap (the sampler stopped, the node was lost) is not counted, and
  the seconds left out are reported as ``gap_s``;
- a sample without a power reading (``[N/A]``, ``[Not Supported]``) but with a utilisation is estimated as
  ``TDP x utilisation`` when the GPU model's board power is known (:data:`TDP_W`), and the figure is marked
  ``estimate``; with neither, that GPU has no energy data;
- a run with no power sample at all (CPU nodes, telemetry off) has ``kwh: None`` and the note "no energy
  data" -- never zero.

Host CPU power: where the node's RAPL counters are readable (``/sys/class/powercap/intel-rapl:N``), the CPU
packages' energy is counted beside the GPUs' (``host_kwh``) and said so; a CPU-only node with RAPL has the host
figure alone as its ``kwh``, marked "host CPU packages only" (``host_only``); with neither, "no energy data".
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from gtrain.health.nodeprobe import MAX_GAP_S, integrate

__all__ = ["MAX_GAP_S", "Energy", "NodeEnergy", "carbon", "from_folders", "from_integral", "node_energy"]

#: board power (W) of the GPU models the catalog sells, for the TDP x utilisation estimate (vendor data sheets:
#: NVIDIA A100 SXM4 400 W, H100 SXM5 700 W, H200 SXM 700 W, L40S 350 W, L4 72 W, A10G 300 W, T4 70 W, V100 SXM2
#: 300 W, A10 150 W, B200 1000 W)
TDP_W = {"A100": 400.0, "H100": 700.0, "H200": 700.0, "L40S": 350.0, "L4": 72.0, "A10G": 300.0, "T4": 70.0,
         "V100": 300.0, "A10": 150.0, "B200": 1000.0}
NO_DATA = "no energy data (no GPU power readings and no RAPL counters: CPU nodes, or telemetry off)"
HOST_ONLY = ("host CPU packages only, from RAPL counters (no GPU power readings; memory, disks, fans not "
             "measured)")
GPU_ONLY = "GPU power only (nvidia-smi power.draw); host CPU/memory power is not measured"


@dataclass
class NodeEnergy:
    node: int
    kwh: float | None = None
    gpus: int = 0
    seconds: float = 0.0
    gap_s: float = 0.0
    estimate: bool = False
    #: CPU package energy from RAPL (measured by the node's counters), None where the node does not expose it
    host_kwh: float | None = None


@dataclass
class Energy:
    nodes: list[NodeEnergy] = field(default_factory=list)
    carbon: dict[str, Any] | None = None

    @property
    def gpu_kwh(self) -> float | None:
        vals = [n.kwh for n in self.nodes if n.kwh is not None]
        return round(sum(vals), 6) if vals else None

    @property
    def host_only(self) -> bool:
        """No GPU power anywhere, but RAPL counters: the figure is the host CPUs' (marked as such)."""
        return self.gpu_kwh is None and self.host_kwh is not None

    @property
    def kwh(self) -> float | None:
        """The GPUs' kWh; on CPU-only nodes with RAPL, the CPU packages' (:attr:`host_only`)."""
        return self.host_kwh if self.host_only else self.gpu_kwh

    @property
    def estimate(self) -> bool:
        return any(n.estimate for n in self.nodes)

    @property
    def total_kwh(self) -> float | None:
        """GPUs, and the CPU packages where RAPL was read (the carbon estimate's kWh)."""
        if self.host_only:
            return self.host_kwh
        return None if self.gpu_kwh is None else round(self.gpu_kwh + (self.host_kwh or 0.0), 6)

    @property
    def host_kwh(self) -> float | None:
        vals = [n.host_kwh for n in self.nodes if n.host_kwh is not None]
        return round(sum(vals), 6) if vals else None

    def note(self) -> str:
        if self.host_only:
            return HOST_ONLY
        if self.kwh is None:
            return NO_DATA
        est = "; partly estimated from TDP x utilisation" if self.estimate else ""
        if self.host_kwh is not None:
            return (f"GPU power (nvidia-smi power.draw){est}; host CPU packages {self.host_kwh:.4g} kWh more, from "
                    "RAPL counters (CPU only: memory, disks, fans not measured)")
        return GPU_ONLY + est

    def to_dict(self) -> dict[str, Any]:
        return {"kwh": self.kwh, "host_kwh": self.host_kwh, "host_only": self.host_only, "estimate": self.estimate,
                "note": self.note(),
                "nodes": [{"node": n.node, "kwh": None if n.kwh is None else round(n.kwh, 6), "gpus": n.gpus,
                           "seconds": round(n.seconds, 3), "gap_s": round(n.gap_s, 3), "estimate": n.estimate,
                           "host_kwh": None if n.host_kwh is None else round(n.host_kwh, 6)}
                          for n in self.nodes],
                "carbon": self.carbon}


def tdp_of(gpu_name: str | None) -> float | None:
    return TDP_W.get(str(gpu_name or "").upper()) if gpu_name else None


def node_energy(node: int, samples: list[dict[str, Any]], tdp_w: float | None = None) -> NodeEnergy:
    """One node's kWh from its samples (``{"t", "gpu", "power", "util"}`` each), integrated by
    :func:`gtrain.health.nodeprobe.integrate` (the same code a node runs for `status --gpus`)."""
    return from_integral(node, integrate(list(samples), tdp_w))


def from_integral(node: int, got: dict[str, Any]) -> NodeEnergy:
    joules, host = got.get("joules"), got.get("host_joules")
    return NodeEnergy(node, None if joules is None else float(joules) / 3.6e6, int(got.get("gpus") or 0),
                      float(got.get("seconds") or 0), float(got.get("gap_s") or 0), bool(got.get("estimate")),
                      None if host is None else float(host) / 3.6e6)


def read_samples(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
    except OSError:
        pass
    return out


def from_folders(folders: list[Path], *, gpu_name: str | None = None, region: str | None = None,
                 override: dict[str, Any] | None = None) -> Energy:
    """The energy of the telemetry kept in ``folders`` (each a ``telemetry/`` folder of one job), summed per
    node, with its carbon estimate."""
    per: dict[int, list[NodeEnergy]] = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("node-*.jsonl")):
            tail = path.stem.rsplit("-", 1)[-1]
            node = int(tail) if tail.isdigit() else 0
            per.setdefault(node, []).append(from_integral(node, _integral(path, tdp_of(gpu_name))))
    energy = Energy()
    for node in sorted(per):
        parts = per[node]
        got = [p.kwh for p in parts if p.kwh is not None]
        host = [p.host_kwh for p in parts if p.host_kwh is not None]
        energy.nodes.append(NodeEnergy(node, sum(got) if got else None, max(p.gpus for p in parts),
                                       sum(p.seconds for p in parts), sum(p.gap_s for p in parts),
                                       any(p.estimate for p in parts), sum(host) if host else None))
    energy.carbon = carbon(energy.total_kwh, region, override)
    return energy


#: the integral of each kept telemetry file, in the job's archive cache (``JOB/.cache/energy.json``, beside the
#: parsed metrics): `cost` of many clusters reads each file once, until it changes
CACHE = "energy.json"


def _integral(path: Path, tdp_w: float | None) -> dict[str, Any]:
    cache = path.parent.parent / ".cache" / CACHE
    try:
        st = path.stat()
        key = f"{path.name}:{st.st_size}:{st.st_mtime_ns}:{tdp_w}"
    except OSError:
        return {"joules": None}
    try:
        known = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(key), dict):
        return known[key]  # type: ignore[no-any-return]
    got = integrate(list(read_samples(path)), tdp_w)
    known = {k: v for k, v in known.items() if not k.startswith(path.name + ":")}
    known[key] = got
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_name(CACHE + f".{os.getpid()}")
        tmp.write_text(json.dumps(known), encoding="utf-8")
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only archive: counted again next time
    return got


# ---- carbon ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridIntensity:
    region: str
    location: str
    gco2_per_kwh: float
    grid_of: str


@lru_cache(maxsize=1)
def grid_table() -> tuple[str, str, dict[str, GridIntensity]]:
    """(snapshot, source, {region: intensity}) from the shipped table."""
    from importlib.resources import files

    text = files("gtrain.catalog").joinpath("grid_intensity.csv").read_text(encoding="utf-8")
    snapshot, source = "", ""
    rows: dict[str, GridIntensity] = {}
    body = []
    for line in text.splitlines():
        if line.startswith("# snapshot:"):
            snapshot = line.split(":", 1)[1].strip().split(" ")[0]
        elif line.startswith("# source:"):
            source = line.split(":", 1)[1].strip().rstrip(",")
        elif not line.startswith("#"):
            body.append(line)
    for r in csv.DictReader(body):
        rows[r["region"]] = GridIntensity(r["region"], r["location"], float(r["gco2_per_kwh"]), r["grid_of"] or "")
    return snapshot, source, rows


SOURCE_SHORT = "Google Cloud region carbon data (github.com/GoogleCloudPlatform/region-carbon-info)"


def carbon(kwh: float | None, region: str | None, override: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """kg CO2e of ``kwh`` at the spec's override (``energy.grid_gco2_per_kwh``) or the region's row; None
    when there is no energy figure or no intensity for the region."""
    if kwh is None:
        return None
    if override and override.get("grid_gco2_per_kwh") is not None:
        g = float(override["grid_gco2_per_kwh"])
        return {"kg_co2e": round(kwh * g / 1000, 9), "gco2_per_kwh": g, "estimate": True,
                "source": str(override.get("grid_source") or "the spec's energy.grid_gco2_per_kwh"), "date": None,
                "region": region}
    snapshot, _source, rows = grid_table()
    row = rows.get(region or "")
    if row is None:
        return None
    src = SOURCE_SHORT + (f"; the grid of {row.grid_of} ({row.location}) as a proxy" if row.grid_of else "")
    return {"kg_co2e": round(kwh * row.gco2_per_kwh / 1000, 9), "gco2_per_kwh": row.gco2_per_kwh,
            "estimate": True, "source": src, "date": snapshot, "region": region}
