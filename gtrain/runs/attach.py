"""``gtrain attach NAME --provider P [--region R] [SPEC]``: adopt a running cluster this machine has no record of.

The provider finds the cluster by its resources' tags / labels (``Provider.find_by_name``) and records its
resources and nodes (``Provider.adopt``), as a resumed ``up`` would; the core makes the cluster's row under the
id the tags carry (so ``down`` and ``gc`` agree with it), opens one cost interval per node from the node's
launch time, marked as reconstructed, and reads the record ``launch`` keeps through the provider
(``Provider.keep_record`` / ``read_record``: node 0's ``<root>/gtrain-record.json`` by default, a scheduler's
shared folder, kubernetes' anchor ConfigMap; the cluster's spec and its jobs, nothing secret) to rebuild the
jobs, so that ``status``, ``logs -f``, ``pull``, ``cancel`` and ``down`` work from here.

The spec: the one given (the team's file: it says how the nodes are reached), else the one node 0's record
keeps, else the least the provider needs (name, provider, num_nodes from the tags).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster



def write_record(ctx: Context, cluster: Cluster) -> None:
    """After a launch: the provider keeps the cluster's spec and its jobs for a later ``gtrain attach`` (best
    effort: a node or an API that refuses the record does not fail the launch)."""
    from gtrain.state import _j

    jobs = [{"id": j.id, "status": j.status, "created_at": j.created_at, "ended_at": j.ended_at,
             "exit_code": j.exit_code, "info": j.info} for j in ctx.store.jobs(cluster.id)]
    body = _j({"format": 1, "cluster_id": cluster.id, "name": cluster.name, "spec": cluster.spec,
               "extra": {k: v for k, v in cluster.extra.items() if k in ("by", "base_dir")}, "jobs": jobs})
    with contextlib.suppress(Exception):  # a node that refuses the file: attach reads none
        ctx.provider(cluster.provider).keep_record(cluster, body.encode())


def attach(ctx: Context, name: str, provider_name: str, regions: list[str], spec: ClusterSpec | None,
           num_nodes: int | None = None) -> Cluster:
    from gtrain.costs.report import RECONSTRUCTED
    from gtrain.runs.cluster import _open_intervals
    from gtrain.spec import parse_spec

    have = ctx.store.find_cluster(name)
    if have is not None and have.status != "terminated":
        raise ConfigError(f"cluster {name!r} is already known here ({have.id}, {have.status})", field="NAME",
                          hint=f"`gtrain status {name}`; nothing to attach")
    if spec is None:
        spec = parse_spec({"name": name, "provider": provider_name, "num_nodes": num_nodes or 1})
    if spec.provider != provider_name:
        raise ConfigError(f"--provider {provider_name}: the spec says provider: {spec.provider}", field="--provider")
    if spec.name != name:
        spec = parse_spec({**spec.to_yaml_dict(), "name": name}, base_dir=spec.base_dir)
    provider = ctx.provider(provider_name)
    found = provider.find_by_name(spec, regions)
    if found is None:
        raise ConfigError(f"no live {provider_name} resources tagged as cluster {name!r}"
                          + (f" in {', '.join(regions)}" if regions else ""), field="NAME",
                          hint="check --region (and the account / project); `gtrain gc --provider "
                               f"{provider_name}` lists what gtrain's tags say")
    cid, region = found
    plan = provider.plan(spec)
    started = time.time()
    cluster = ctx.store.create_cluster(
        name=name, provider=provider_name, num_nodes=spec.num_nodes, spec=spec.to_yaml_dict(), cluster_id=cid,
        region=region or plan.region, instance_type=plan.instance_type, market=plan.market,
        price_per_hour=plan.price_per_hour, extra={"base_dir": spec.base_dir, "plan": plan.to_dict(),
                                                   "attached_at": started})
    try:
        provider.adopt(spec, cluster, plan, region)
    except BaseException:  # nothing was made: the row goes, the name is free again
        ctx.store.update_cluster(cluster.id, status="terminated", terminated_at=time.time())
        raise
    cluster = ctx.store.get_cluster_by_id(cluster.id)
    _open_intervals(ctx.store, cluster, plan, started)
    for iv in ctx.store.intervals(cluster.id):
        if iv.stopped_at is None and iv.note is None:
            _note(ctx, iv.id, f"{RECONSTRUCTED} (from the node's launch time)")
    record = provider.read_record(cluster)
    if record is not None and record.get("cluster_id") == cluster.id:
        _adopt_jobs(ctx, cluster, record)
    ctx.store.update_cluster(cluster.id, status="up")
    ctx.event(cluster, "attach", msg=f"{spec.num_nodes} {provider_name} node(s) adopted by tag")
    return ctx.store.get_cluster_by_id(cluster.id)


def _note(ctx: Context, iid: int, note: str) -> None:
    with ctx.store.tx() as c:
        c.execute("UPDATE cost_intervals SET note=? WHERE id=?", (note, iid))
    push = getattr(ctx.store, "push", None)
    if push is not None:
        row = ctx.store.conn.execute("SELECT cluster_id FROM cost_intervals WHERE id=?", (iid,)).fetchone()
        push(row[0])


def _adopt_jobs(ctx: Context, cluster: Cluster, record: dict[str, Any]) -> None:
    jobs = record.get("jobs")
    if not isinstance(jobs, list):
        return
    for j in jobs:
        if not (isinstance(j, dict) and isinstance(j.get("id"), str) and isinstance(j.get("info"), dict)
                and j["id"].startswith(f"{cluster.name}-")):
            continue
        ctx.store.create_job(cluster.id, j["id"], j["info"])
        status = str(j.get("status")) if j.get("status") in ("pending", "running", "succeeded", "failed",
                                                              "cancelled", "preempted") else "running"
        code = j.get("exit_code") if isinstance(j.get("exit_code"), int) else None
        ctx.store.update_job(j["id"], status=status, exit_code=code)
