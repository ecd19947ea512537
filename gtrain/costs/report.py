"""Cost reports: per node interval, from the $/h stored with the cluster when it started (never today's
catalog), through the provider's own billing rules (``Provider.price``); with where that $/h came from
(``price_source``: ``live (...)`` from the provider's API at launch, or ``estimate (catalog 2025-12)``;
docs/costs.md)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gtrain.providers.base import Provider
    from gtrain.state import Cluster, StateStore


@dataclass
class CostLine:
    node_rank: int
    instance_type: str | None
    market: str | None
    started_at: float
    stopped_at: float | None
    hours: float
    price_per_hour: float
    cost_usd: float
    estimate: bool
    note: str | None


@dataclass
class CostReport:
    cluster: str
    cluster_id: str
    provider: str
    status: str
    lines: list[CostLine] = field(default_factory=list)
    #: every recovery of the cluster's jobs (docs/durable.md), oldest first, each with its ``job`` id
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    #: ``resources.any_of``: the candidates and what became of each (gtrain.runs.placement.record), else None
    placement: dict[str, Any] | None = None
    #: kWh of the cluster's jobs from their kept GPU telemetry (gtrain.health.energy; ``kwh`` None: no data)
    energy: dict[str, Any] | None = None
    #: who started the cluster (gtrain.state.identity: user@host or the CI run's URL); None in records made before
    by: str | None = None
    #: who launched its jobs, when other than ``by`` (a CI job, a colleague), in launch order
    launched_by: list[str] = field(default_factory=list)
    #: each job's world size over time (gtrain.state.progress): ``{"job", "world_sizes": [{"since", "nodes",
    #: "ranks"}]}``
    world_sizes: list[dict[str, Any]] = field(default_factory=list)
    #: the spec's volumes (docs/volumes.md) as the provider attached them, each with its $/GB-month: ``down``
    #: leaves them, a standing charge outside the node lines and ``total_usd`` (:func:`volume_charges`)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    #: where the $/h frozen at ``up`` came from (gtrain.providers.cloud.billing.FrozenPrice.label); None in
    #: records made before gtrain recorded it
    price_source: str | None = None

    @property
    def standing_usd_per_month(self) -> float:
        return round(sum(float(v.get("usd_per_month") or 0) for v in self.volumes), 4)

    @property
    def recovery_summary(self) -> dict[str, Any]:
        """How many recoveries, which nodes they replaced or restarted, the downtime and what it cost."""
        return {"count": len(self.recoveries),
                "lost_nodes": sorted({int(n) for r in self.recoveries for n in r.get("lost") or []}),
                "seconds": round(sum(float(r.get("seconds") or 0) for r in self.recoveries), 3),
                "cost_usd": round(sum(float(r.get("cost_usd") or 0) for r in self.recoveries), 6)}

    @property
    def total_usd(self) -> float:
        return round(sum(line.cost_usd for line in self.lines), 6)

    @property
    def node_hours(self) -> float:
        return round(sum(line.hours for line in self.lines), 6)

    @property
    def estimate(self) -> bool:
        return any(line.estimate for line in self.lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster, "cluster_id": self.cluster_id, "provider": self.provider,
            "status": self.status, "total_usd": self.total_usd, "node_hours": self.node_hours,
            "estimate": self.estimate, "lines": [asdict(line) for line in self.lines],
            "recovery": self.recovery_summary, "recoveries": self.recoveries,
            "placement": {k: v for k, v in self.placement.items() if k != "spec"} if self.placement else None,
            "energy": self.energy, "by": self.by, "launched_by": self.launched_by, "world_sizes": self.world_sizes,
            "volumes": self.volumes, "standing_usd_per_month": self.standing_usd_per_month,
            "price_source": self.price_source,
        }


#: how an interval that `gtrain attach` rebuilt from a node's launch time begins its note
RECONSTRUCTED = "reconstructed by gtrain attach"


def cluster_cost(store: StateStore, cluster: Cluster, provider: Provider, *, persist: bool = False) -> CostReport:
    now = time.time()
    report = CostReport(cluster.name, cluster.id, cluster.provider, cluster.status)
    for iv in store.intervals(cluster.id):
        if iv.cost_usd is not None and iv.stopped_at is not None:
            cost, estimate, note = iv.cost_usd, iv.estimate, iv.note
        else:
            priced = provider.price(cluster, iv)
            cost, estimate, note = priced.cost_usd, priced.estimate, priced.note
            if iv.note and iv.note.startswith(RECONSTRUCTED):  # `gtrain attach` rebuilt it: said, and kept
                estimate, note = True, "; ".join(x for x in (iv.note, note) if x)
            if persist and iv.stopped_at is not None:
                store.set_interval_cost(iv.id, cost, estimate=estimate, note=note)
        stop = iv.stopped_at or now
        report.lines.append(CostLine(
            node_rank=iv.node_rank, instance_type=iv.instance_type, market=iv.market, started_at=iv.started_at,
            stopped_at=iv.stopped_at, hours=round(max(0.0, stop - iv.started_at) / 3600, 6),
            price_per_hour=iv.price_per_hour, cost_usd=round(cost, 6), estimate=estimate, note=note,
        ))
    report.placement = cluster.extra.get("any_of")
    report.price_source = str(cluster.extra["price_source"]) if cluster.extra.get("price_source") else None
    report.volumes = volume_charges(cluster)
    report.by = str(cluster.extra["by"]) if cluster.extra.get("by") else None
    report.launched_by = list(dict.fromkeys(str(j.info["by"]) for j in store.jobs(cluster.id)
                                            if j.info.get("by") and j.info["by"] != report.by))
    report.energy = cluster_energy(store, cluster)
    report.recoveries = [{"job": j.id, **r} for j in store.jobs(cluster.id) for r in j.info.get("recoveries") or []]
    from gtrain.state.progress import world_sizes

    report.world_sizes = [{"job": j.id, "world_sizes": [w.to_dict() for w in world_sizes(
        j.info, num_nodes=cluster.num_nodes, started_at=j.created_at)]} for j in store.jobs(cluster.id)]
    return report


def volume_charges(cluster: Cluster) -> list[dict[str, Any]]:
    """The cluster's volumes (``extra["volumes"]``, written by the provider that attached them) with their
    monthly charge: size x the $/GB-month stored when they were attached."""
    out = []
    for v in cluster.extra.get("volumes") or []:
        if not isinstance(v, dict):
            continue
        size, rate = float(v.get("size_gb") or 0), float(v.get("usd_per_gb_month") or 0)
        out.append({"name": v.get("name"), "id": v.get("id"), "type": v.get("type"), "region": v.get("region"),
                    "size_gb": v.get("size_gb"), "usd_per_gb_month": rate, "usd_per_month": round(size * rate, 4)})
    return out


def standing_charges(reports: list[CostReport]) -> list[dict[str, Any]]:
    """Every volume the reports name, once (the latest cluster's record of it): what is kept after ``down``."""
    seen: dict[str, dict[str, Any]] = {}
    for r in reports:
        for v in r.volumes:
            seen[str(v.get("id") or v.get("name"))] = {**v, "cluster": r.cluster}
    return list(seen.values())


def history(store: StateStore, provider_for: Any) -> list[CostReport]:
    """Every cluster ever run, oldest first. ``provider_for(name)`` returns a provider instance."""
    return [cluster_cost(store, c, provider_for(c.provider)) for c in store.list_clusters(include_terminated=True)]


def cluster_energy(store: StateStore, cluster: Cluster) -> dict[str, Any] | None:
    """Energy of every job of the cluster from the telemetry the run archive kept (per node and in all)."""
    from gtrain.health.energy import from_folders
    from gtrain.state.runs import job_dir

    try:
        folders = [job_dir(store.home, cluster.id, j.id) / "telemetry" for j in store.jobs(cluster.id)]
        accel = str((cluster.spec.get("resources") or {}).get("accelerators") or "")
        return from_folders(folders, gpu_name=accel.split(":")[0] or None, region=cluster.region,
                            override=cluster.spec.get("energy")).to_dict()
    except (OSError, ValueError, TypeError, AttributeError):
        return None
