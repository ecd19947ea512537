"""Moving a running ``resources.any_of`` cluster to another candidate (docs/any_of.md, "Moves").

When recovery cannot replace a lost node on the cluster's cloud (its provider raises ``CapacityError`` or
``QuotaError``), the whole cluster moves: every node of the current candidate is deleted (its cost intervals
closed and priced by its own provider, so the cost report keeps each cloud's part), the other candidates are
tried in order on the same cluster record, and recovery relaunches the job under the same id on the new nodes,
which restore the newest checkpoint from the job's store. Nothing here names a provider.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import CapacityError, GtrainError, QuotaError

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord


def can_move(cluster: Cluster) -> bool:
    return bool(cluster.extra.get("any_of"))


def _part_cost(ctx: Context, cluster: Cluster) -> float:
    """Close and price every interval of the cluster as its current provider bills it (kept in state)."""
    from gtrain.costs.report import cluster_cost

    return cluster_cost(ctx.store, cluster, ctx.provider(cluster.provider), persist=True).total_usd


def move(cluster: Cluster, ctx: Context, why: GtrainError) -> Cluster:
    """Delete the cluster's nodes on its candidate and make them on the next one that has capacity; the cluster
    record (and so every job id) stays. Raises a ``CapacityError`` listing every candidate when none has."""
    from gtrain.runs import placement
    from gtrain.spec import parse_spec

    info = dict(cluster.extra["any_of"])
    spec = parse_spec(info["spec"], base_dir=cluster.extra.get("base_dir"))
    here = next((c for c in info["candidates"] if c["outcome"] == "landed"), None)
    label = here["label"] if here else cluster.provider
    ctx.report.warn(f"{label}: {why.message.splitlines()[0]}; moving the cluster to the next candidate")
    started_move = time.time()
    ctx.provider(cluster.provider).terminate(cluster)
    ctx.store.close_intervals(cluster.id, at=started_move)
    ctx.store.set_nodes_status(cluster.id, "terminated")
    done_parts = sum(float(m.get("cost_usd") or 0) for m in info.get("moves") or [])
    part = round(_part_cost(ctx, cluster) - done_parts, 6)
    offers = placement.offers(spec, ctx)
    for o in offers:
        if here is not None and o.index + 1 == here["candidate"]:
            o.outcome, o.why = "lost", f"{why.message.splitlines()[0]} (moved away)"
        elif o.plan is None:
            continue
        else:
            o.outcome = "untried"
    tried = [o for o in offers if o.plan is not None and o.outcome == "untried"]
    for o in tried:
        assert o.plan is not None
        skip = placement.quota_skip(ctx, o)
        if skip:
            o.outcome, o.why = "skipped", skip
            ctx.report.warn(f"{o.label}: skipped before anything was made: {skip}")
            continue
        ctx.report.info(f"moving {cluster.name} to {o.label}: {o.plan.instance_type or '-'} {o.plan.market} in "
                        f"{o.plan.region or '-'} at ${o.plan.cluster_price_per_hour:.2f}/h")
        ctx.store.update_cluster(
            cluster.id, provider=o.spec.provider, spec=o.spec.to_yaml_dict(), region=o.plan.region,
            instance_type=o.plan.instance_type, market=o.plan.market, price_per_hour=o.plan.price_per_hour,
            extra={**cluster.extra, "plan": o.plan.to_dict()})
        moved = ctx.store.get_cluster_by_id(cluster.id)
        started = time.time()
        try:
            ctx.provider(o.spec.provider).provision(o.spec, moved, o.plan)
        except (CapacityError, QuotaError) as e:  # its provider left nothing behind
            o.outcome = "no quota" if isinstance(e, QuotaError) else "no capacity"
            o.why = e.message.splitlines()[0]
            ctx.report.warn(f"{o.label}: {o.outcome}; trying the next candidate")
            continue
        o.outcome = "landed"
        for node in ctx.store.node_records(cluster.id):
            ctx.store.open_interval(cluster.id, node.rank, instance_type=o.plan.instance_type, market=o.plan.market,
                                    price_per_hour=o.plan.price_per_hour,
                                    started_at=node.launched_at if node.launched_at is not None else started)
        mv = {"at": started_move, "from": label, "from_provider": here["provider"] if here else None,
              "to": o.label, "to_provider": o.spec.provider, "why": why.message.splitlines()[0], "cost_usd": part,
              "seconds": round(time.time() - started_move, 3)}
        info.update(candidates=[x.to_dict() for x in offers], moves=[*(info.get("moves") or []), mv])
        ctx.store.update_cluster(cluster.id, status="up", extra={**moved.extra, "any_of": info})
        ctx.event(moved, "move", msg=f"moved from {label} to {o.label}: {mv['why']}", provider=o.spec.provider)
        return ctx.store.get_cluster_by_id(cluster.id)
    info.update(candidates=[x.to_dict() for x in offers])
    ctx.store.update_cluster(cluster.id, extra={**cluster.extra, "any_of": info})
    raise CapacityError(f"cluster {cluster.name} lost its nodes on {label} and no other candidate could take it",
                        [f"{o.label}: {o.outcome}: {o.why}" for o in offers],
                        hint="`gtrain up` the spec again later; the checkpoint store keeps the run")


def rebase_job(job: JobRecord, cluster: Cluster, ctx: Context) -> None:
    """After a move: the job's recorded spec is the new candidate's, with the job section it was launched with."""
    spec: Any = job.info.get("spec")
    if not isinstance(spec, dict):
        return
    new = {**cluster.spec, **({"job": spec["job"]} if "job" in spec else {})}
    ctx.store.update_job(job.id, status=job.status, info={**job.info, "spec": new})
