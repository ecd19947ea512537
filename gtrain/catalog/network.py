"""Each GPU instance type's network: bandwidth (Gbit/s) and RDMA fabric (EFA on AWS; InfiniBand, RoCE or
GPUDirect-TCPX(O) as ``ib``), from ``network.csv`` beside this module (shipped; stdlib only, parsed once).
``gtrain health`` compares the all-reduce's bus bandwidth with it and checks NCCL used the fabric."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Network:
    provider: str
    instance_type: str
    gbps: float
    efa: bool
    ib: bool

    @property
    def fabric(self) -> str | None:
        return "efa" if self.efa else "ib" if self.ib else None


@lru_cache(maxsize=1)
def _table() -> dict[tuple[str, str], Network]:
    from importlib.resources import files

    text = (files(__package__ or "gtrain.catalog") / "network.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
    return {(r["provider"], r["instance_type"]): Network(r["provider"], r["instance_type"], float(r["network_gbps"]),
                                                         r["efa"] == "true", r["ib"] == "true") for r in rows}


def network(provider: str, instance_type: str | None) -> Network | None:
    """The network of ``instance_type`` on ``provider``; None when not known (local, ssh, an unlisted type)."""
    if not instance_type:
        return None
    return _table().get((provider.lower(), instance_type.strip().lower()))
