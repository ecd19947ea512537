"""``policies.max_hours`` / ``max_cost_usd`` as a node lifetime the nodes enforce themselves (a shutdown the
node schedules at boot on EC2, GCE's maxRunDuration), and, at ``down``, when nodes that ended so stopped
costing money."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError

if TYPE_CHECKING:
    from gtrain.providers.base import Provider
    from gtrain.state import Cluster

#: node states that mean "not running any more" (the node may have ended itself)
GONE = ("terminated", "preempted", "missing", "stopped")
#: how long a node that reached its lifetime may take to power off
SHUTDOWN_GRACE_S = 60


def lifetime_s(policies: Any, num_nodes: int, price_per_hour: float | None) -> int | None:
    """How long a cloud node may live, in whole seconds (at least 60), from ``policies.max_hours`` and
    ``policies.max_cost_usd`` (the cluster's budget spread over its nodes at their $/h: a cost cap becomes a
    time cap), or None when neither is set. The nodes enforce it themselves, so it holds with no laptop and no
    gtrain process left (see the aws and gcp providers)."""
    caps: list[float] = []
    if policies.max_hours:
        caps.append(float(policies.max_hours) * 3600)
    if policies.max_cost_usd and price_per_hour and price_per_hour > 0:
        caps.append(float(policies.max_cost_usd) / (price_per_hour * max(1, num_nodes)) * 3600)
    if not caps:
        return None
    return max(60, int(min(caps)))


def lifetime_note(seconds: int | None, how: str) -> list[str]:
    if seconds is None:
        return []
    return [f"each node deletes itself {seconds / 3600:.2f} h after it starts ({how}; policies.max_hours / "
            "max_cost_usd), whatever happens to this machine"]


def cluster_lifetime_s(cluster: Cluster) -> int | None:
    """The lifetime the nodes of ``cluster`` were given at ``up`` (None: no time or cost limit)."""
    from gtrain.spec import Policies

    try:
        policies = Policies.model_validate(cluster.spec.get("policies") or {})
    except ValueError:
        return None
    return lifetime_s(policies, cluster.num_nodes, cluster.price_per_hour or None)


def ended_by_limit(provider: Provider, cluster: Cluster) -> dict[int, float]:
    """Nodes of a cluster with a time or cost limit (which the nodes enforce themselves) that are gone by now:
    rank -> the latest moment each can have run (its start + its lifetime + a minute for the shutdown), so the
    cost report does not bill them up to ``down``. The :meth:`Provider.ended_at` of the VM clouds."""
    life = cluster_lifetime_s(cluster)
    if life is None:
        return {}
    try:
        gone = {s.rank: s.status for s in provider.describe(cluster) if s.status in GONE}
    except GtrainError as e:
        provider.report.warn(f"could not ask which nodes ended on their own ({e.message}); billing them until now")
        return {}
    starts = {i.node_rank: i.started_at for i in provider.store.intervals(cluster.id) if i.stopped_at is None}
    out = {rank: starts[rank] + life + SHUTDOWN_GRACE_S for rank in gone if rank in starts}
    for rank in sorted(out):
        provider.report.info(f"node {rank} had already ended ({gone[rank]}); billed up to its time limit at most")
    return out
