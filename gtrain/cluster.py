"""Cluster lifecycle: up, down, status. Provider-independent; talks to providers through their ABC."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.costs.report import CostReport, cluster_cost
from gtrain.errors import ClusterNotFound, GtrainError
from gtrain.events import SILENT, Reporter
from gtrain.providers import get_provider
from gtrain.state import Cluster, StateStore

if TYPE_CHECKING:
    from gtrain.providers.base import Plan, Provider
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec


@dataclass
class Context:
    """One object carried through a command: the state store and the reporter."""

    store: StateStore = field(default_factory=StateStore)
    report: Reporter = SILENT
    _providers: dict[str, Provider] = field(default_factory=dict)

    def provider(self, name: str) -> Provider:
        if name not in self._providers:
            self._providers[name] = get_provider(name, self.store, self.report)
        return self._providers[name]

    def cluster(self, name: str) -> Cluster:
        c = self.store.find_cluster(name)
        if c is None or c.status == "terminated":
            raise ClusterNotFound(name)
        return c

    def runners(self, cluster: Cluster) -> list[Runner]:
        return self.provider(cluster.provider).runners(cluster)

    def spec_of(self, cluster: Cluster) -> ClusterSpec:
        from gtrain.spec import parse_spec

        return parse_spec(cluster.spec, base_dir=cluster.extra.get("base_dir"))


@dataclass
class UpResult:
    plan: Plan
    cluster: Cluster | None
    created: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster.name if self.cluster else None,
            "cluster_id": self.cluster.id if self.cluster else None,
            "status": self.cluster.status if self.cluster else "planned",
            "created": self.created,
            "plan": self.plan.to_dict(),
        }


def up(spec: ClusterSpec, ctx: Context, *, dry_run: bool = False) -> UpResult:
    provider = ctx.provider(spec.provider)
    plan = provider.plan(spec)  # raises ConfigError before anything is made
    if dry_run:
        return UpResult(plan, None, False)
    existing = ctx.store.find_cluster(spec.name)
    if existing is not None and existing.status == "up":
        if existing.provider != spec.provider or existing.num_nodes != spec.num_nodes:
            raise GtrainError(
                f"cluster {spec.name!r} is already up with {existing.num_nodes} {existing.provider} node(s)",
                hint=f"`gtrain down {spec.name}` first, or pick another --name",
            )
        ctx.report.info(f"cluster {spec.name} is already up")
        return UpResult(plan, existing, False)
    if existing is not None and existing.status != "terminated":
        cluster = existing  # an interrupted up: provisioning is idempotent, make what is missing
        ctx.report.info(f"resuming provisioning of {spec.name} (was {existing.status})")
    else:
        cluster = ctx.store.create_cluster(
            name=spec.name, provider=spec.provider, num_nodes=spec.num_nodes, spec=spec.to_yaml_dict(),
            region=plan.region, instance_type=plan.instance_type, market=plan.market,
            price_per_hour=plan.price_per_hour, extra={"base_dir": spec.base_dir, "plan": plan.to_dict()},
        )
    ctx.report.info(f"provisioning {plan.num_nodes} {plan.provider} node(s) for {spec.name}")
    started = time.time()
    try:
        provider.provision(spec, cluster, plan)
    except BaseException:
        if not ctx.store.resources(cluster.id, live_only=True) and not ctx.store.nodes(cluster.id):
            # nothing was made: leave nothing behind, the name is free again
            ctx.store.update_cluster(cluster.id, status="terminated", terminated_at=time.time())
        else:  # what was made is in state (and in tags): `gtrain down` removes it, `gtrain up` resumes
            ctx.store.update_cluster(cluster.id, status="failed")
            _open_intervals(ctx.store, cluster, plan, started)
        raise
    _open_intervals(ctx.store, cluster, plan, started)
    ctx.store.update_cluster(cluster.id, status="up")
    return UpResult(plan, ctx.store.get_cluster_by_id(cluster.id), True)


def _open_intervals(store: StateStore, cluster: Cluster, plan: Plan, started: float) -> None:
    have = {i.node_rank for i in store.intervals(cluster.id) if i.stopped_at is None}
    for node in store.nodes(cluster.id):
        if node.rank in have or node.status in ("terminated", "deleted"):
            continue
        store.open_interval(cluster.id, node.rank, instance_type=plan.instance_type, market=plan.market,
                            price_per_hour=plan.price_per_hour,
                            started_at=float(node.meta.get("launched_at", started)))


@dataclass
class DownResult:
    cluster: str
    already_down: bool
    cost: CostReport
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "already_down": self.already_down, "warnings": self.warnings,
                "cost": self.cost.to_dict()}


def down(name: str, ctx: Context) -> DownResult:
    from gtrain.jobs.lifecycle import cancel_active_jobs

    cluster = ctx.store.find_cluster(name)
    if cluster is None:
        raise ClusterNotFound(name)
    provider = ctx.provider(cluster.provider)
    if cluster.status == "terminated":
        return DownResult(name, True, cluster_cost(ctx.store, cluster, provider))
    warnings: list[str] = []
    ctx.store.update_cluster(cluster.id, status="terminating")
    try:
        cancel_active_jobs(cluster, ctx)
    except GtrainError as e:  # an unreachable node must not keep us from deleting what costs money
        warnings.append(f"could not stop jobs cleanly: {e.message}")
        ctx.report.warn(warnings[-1])
    ended = _ended_by_their_limit(cluster, provider, ctx)
    ctx.report.info(f"terminating {cluster.num_nodes} node(s) of {name}")
    provider.terminate(cluster)
    now = time.time()
    for rank, at in ended.items():
        ctx.store.close_node_interval(cluster.id, rank, at=min(at, now))
    ctx.store.close_intervals(cluster.id, at=now)
    ctx.store.set_nodes_status(cluster.id, "terminated")
    ctx.store.update_cluster(cluster.id, status="terminated", terminated_at=now)
    cluster = ctx.store.get_cluster_by_id(cluster.id)
    report = cluster_cost(ctx.store, cluster, provider, persist=True)
    return DownResult(name, False, report, warnings)


_GONE = ("terminated", "preempted", "missing", "stopped")


def _ended_by_their_limit(cluster: Cluster, provider: Provider, ctx: Context) -> dict[int, float]:
    """Nodes of a cloud cluster with a time or cost limit (which the nodes enforce themselves) that are gone
    by the time of ``down``: rank -> the latest moment each can have run (its start + its lifetime + a minute
    for the shutdown), so the cost report does not bill them up to ``down``."""
    from gtrain.providers.common import lifetime_s
    from gtrain.spec import Policies

    if not provider.nodes_enforce_limits:
        return {}
    try:
        policies = Policies.model_validate(cluster.spec.get("policies") or {})
    except ValueError:
        return {}
    life = lifetime_s(policies, cluster.num_nodes, cluster.price_per_hour or None)
    if life is None:
        return {}
    try:
        gone = {s.rank: s.status for s in provider.describe(cluster) if s.status in _GONE}
    except GtrainError as e:
        ctx.report.warn(f"could not ask which nodes ended on their own ({e.message}); billing them until now")
        return {}
    starts = {i.node_rank: i.started_at for i in ctx.store.intervals(cluster.id) if i.stopped_at is None}
    out = {rank: starts[rank] + life + 60 for rank in gone if rank in starts}
    for rank in sorted(out):
        ctx.report.info(f"node {rank} had already ended ({gone[rank]}); billed up to its time limit at most")
    return out


def status(ctx: Context, name: str | None = None, *, refresh: bool = True) -> list[dict[str, Any]]:
    """Clusters from state. With a name (and ``refresh``), the newest job's state is asked of the nodes."""
    if name is not None:
        clusters = [ctx.cluster(name)]
    else:
        clusters = ctx.store.list_clusters()
    out = []
    now = time.time()
    for c in clusters:
        job = ctx.store.latest_job(c.id)
        if job is not None and name is not None and refresh and c.status == "up":
            from gtrain.jobs.lifecycle import refresh_job

            job = refresh_job(c, job, ctx)
        jobs = ctx.store.jobs(c.id) if name is not None else ([job] if job else [])
        live: dict[int, Any] = {}
        if name is not None and refresh and c.status == "up":
            live = {s.rank: s for s in ctx.provider(c.provider).describe(c)}
        out.append({
            "name": c.name, "id": c.id, "provider": c.provider, "status": c.status, "num_nodes": c.num_nodes,
            "instance_type": c.instance_type, "market": c.market, "region": c.region,
            "price_per_hour": round(c.price_per_hour * c.num_nodes, 4), "created_at": c.created_at,
            "uptime_hours": round((now - c.created_at) / 3600, 4),
            "nodes": [{"rank": n.rank, "address": n.address, "zone": n.zone,
                       "status": live[n.rank].status if n.rank in live else n.status,
                       "detail": live[n.rank].detail if n.rank in live else ""}
                      for n in ctx.store.nodes(c.id)] if name is not None else None,
            "jobs": [{"id": j.id, "status": j.status, "exit_code": j.exit_code, "created_at": j.created_at,
                      "ended_at": j.ended_at, "run": j.info.get("run")} for j in jobs if j is not None],
        })
    return out
