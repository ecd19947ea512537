"""``gtrain stop`` / ``gtrain start``: a VM cluster's nodes stopped with their disks kept (compute billing ends,
the disks bill on) and started again. Provider-independent: what a provider can do is ``Provider.can_stop``,
and the work is its ``stop_nodes`` / ``start_nodes``. Cost: each node's running interval ends at the stop and
a ``stopped`` interval (market ``stopped``, the disk's $/h) runs until the start, which opens a running one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.errors import ClusterNotFound, ConfigError
from gtrain.providers.base import STOPPED_MARKET, cannot_stop

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.providers.base import StoppedNode
    from gtrain.state import Cluster



@dataclass
class StopResult:
    cluster: str
    already: bool
    nodes: list[StoppedNode] = field(default_factory=list)

    @property
    def disk_usd_per_hour(self) -> float:
        return round(sum(n.usd_per_hour for n in self.nodes), 6)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "status": "stopped", "already_stopped": self.already,
                "nodes": [n.to_dict() for n in self.nodes], "disk_usd_per_hour": self.disk_usd_per_hour}


@dataclass
class StartResult:
    cluster: str
    started: list[int]
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "status": "up", "started": self.started, "nodes": self.nodes}


def refuse_stopped(cluster: Cluster, what: str) -> None:
    """``what`` needs the nodes running: exit 2 naming ``gtrain start`` for a stopped cluster."""
    if cluster.status == "stopped":
        raise ConfigError(f"cluster {cluster.name} is stopped: {what} needs its nodes running",
                          hint=f"`gtrain start {cluster.name}` brings them back", field="CLUSTER")


def _cluster(name: str, ctx: Context, verb: str) -> Cluster:
    cluster = ctx.cluster(name)
    provider = ctx.provider(cluster.provider)
    if not provider.can_stop:
        raise cannot_stop(cluster.provider, verb, provider.cannot_stop_why)
    return cluster


def stop(name: str, ctx: Context) -> StopResult:
    """Stop every node of ``name`` (disks and the nodes' files kept). Refused while a job runs there."""
    from gtrain.jobs.status import active_job
    from gtrain.locks import cluster_lock

    _cluster(name, ctx, "stop")
    with cluster_lock(ctx.store.home, name, "stop"):
        cluster = ctx.store.find_cluster(name)
        if cluster is None or cluster.status == "terminated":
            raise ClusterNotFound(name, gone=cluster is not None)
        provider = ctx.provider(cluster.provider)
        if cluster.status == "stopped":
            ctx.report.info(f"cluster {name} is already stopped (`gtrain start {name}` brings it back)")
            return StopResult(name, True, [_stopped(provider, cluster, n) for n in ctx.nodes(cluster)])
        if cluster.status != "up":
            raise ConfigError(f"cluster {name} is {cluster.status}, not up: only a cluster that is up can be stopped",
                              hint=f"`gtrain up` finishes it, `gtrain down {name}` deletes it", field="CLUSTER")
        active = active_job(cluster, ctx)
        if active is not None:
            raise ConfigError(f"job {active.id} is still {active.status} on {name}: stopping would kill it",
                              hint=f"wait for it (`gtrain logs {name} -f`) or `gtrain cancel {name}` first",
                              field="CLUSTER")
        _archive(ctx, cluster)
        nodes = provider.stop_nodes(cluster)
        now = time.time()
        ctx.store.close_intervals(cluster.id, at=now)
        for n in nodes:
            ctx.store.open_interval(cluster.id, n.rank, instance_type=cluster.instance_type, market=STOPPED_MARKET,
                                    price_per_hour=n.usd_per_hour, started_at=now)
        ctx.store.update_cluster(cluster.id, status="stopped")
        ctx.event(cluster, "stop", msg=f"{len(nodes)} node(s) stopped, disks kept")
        return StopResult(name, False, nodes)


def _stopped(provider: Any, cluster: Cluster, node: Any) -> StoppedNode:
    from gtrain.providers.base import StoppedNode

    rate, label = provider.disk_price(cluster, node)
    return StoppedNode(node.rank, float(node.extra.get("disk_gb") or 0), rate, label)


def _bill_own_stop(ctx: Context, provider: Any, cluster: Cluster, ranks: list[int]) -> None:
    """Nodes that stopped on their own, where the cloud says since when: their running interval ends then, a
    stopped (disk-only) one covers the stop, and a running one starts now."""
    now = time.time()
    for node in ctx.nodes(cluster):
        since = node.extra.get("stopped_since")
        if node.rank not in ranks or not isinstance(since, int | float) or not 0 < since < now:
            continue
        ctx.store.close_node_interval(cluster.id, node.rank, at=since)
        disk = _stopped(provider, cluster, node)
        iid = ctx.store.open_interval(cluster.id, node.rank, instance_type=cluster.instance_type,
                                      market=STOPPED_MARKET, price_per_hour=disk.usd_per_hour, started_at=since)
        ctx.store.close_node_interval(cluster.id, node.rank, at=now)
        ctx.store.open_interval(cluster.id, node.rank, instance_type=cluster.instance_type, market=cluster.market,
                                price_per_hour=cluster.price_per_hour, started_at=now)
        ctx.report.node(node.rank, f"stopped on its own from {time.strftime('%H:%M:%S', time.localtime(since))}: "
                                   f"billed its disk only until now (cost interval {iid})")


def _archive(ctx: Context, cluster: Cluster) -> None:
    """The ended jobs' logs into the run archive while the nodes answer (a stopped node does not)."""
    from gtrain.errors import GtrainError
    from gtrain.runlog import archive

    try:
        archive.archive_cluster(ctx, cluster)
    except (GtrainError, OSError, ValueError) as e:
        ctx.report.warn(f"could not keep the jobs' logs: {getattr(e, 'message', e)}")


def start(name: str, ctx: Context) -> StartResult:
    """Start the stopped nodes of ``name`` (a cluster stopped by ``gtrain stop``, or nodes that stopped themselves:
    ``policies.idle_minutes`` on GCE) and wait until they answer over SSH; jobs can be launched again."""
    from gtrain.locks import cluster_lock

    _cluster(name, ctx, "start")
    with cluster_lock(ctx.store.home, name, "start"):
        cluster = ctx.store.find_cluster(name)
        if cluster is None or cluster.status == "terminated":
            raise ClusterNotFound(name, gone=cluster is not None)
        if cluster.status not in ("stopped", "up"):
            raise ConfigError(f"cluster {name} is {cluster.status}: only a stopped cluster can be started",
                              hint=f"`gtrain up` finishes it, `gtrain down {name}` deletes it", field="CLUSTER")
        provider = ctx.provider(cluster.provider)
        started = provider.start_nodes(cluster)
        if cluster.status == "stopped":
            now = time.time()
            ctx.store.close_intervals(cluster.id, at=now)  # the stopped (disk-only) intervals end here
            for node in ctx.nodes(cluster):
                ctx.store.open_interval(cluster.id, node.rank, instance_type=cluster.instance_type,
                                        market=cluster.market, price_per_hour=cluster.price_per_hour, started_at=now)
            ctx.store.update_cluster(cluster.id, status="up")
            ctx.event(cluster, "start", msg=f"{len(started)} node(s) started")
        elif started:  # nodes that had stopped themselves (policies.idle_minutes on GCE)
            _bill_own_stop(ctx, provider, cluster, started)
            ctx.event(cluster, "start", msg=f"node(s) {started} started")
        else:
            ctx.report.info(f"cluster {name} is up and no node of it is stopped")
        nodes = [{"rank": n.rank, "instance_id": n.instance_id, "address": n.address,
                  "host": n.ssh.host if n.ssh else None} for n in ctx.nodes(cluster)]
        return StartResult(name, started, nodes)
