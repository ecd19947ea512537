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
#: nodes made this soon after the cluster was (the first `up`) get a whole lifetime; later ones what is left
UP_WINDOW_S = 600


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


def node_lifetime_s(policies: Any, num_nodes: int, price_per_hour: float | None, cluster: Cluster,
                    now: float | None = None) -> int | None:
    """The lifetime of a node made now for ``cluster``: the budget holds for the whole run, across recoveries.
    Each rank's slot ends at the cluster's start + :func:`lifetime_s`; a replacement gets what is left of its
    slot, not a full lifetime of its own (which would let each recovery spend the budget again). A slot with
    less than a minute left: the budget is spent, and no node is made (:class:`BudgetSpent`). Nodes made in the
    cluster's first :data:`UP_WINDOW_S` (the first `up`, however long it takes) get the whole lifetime."""
    import math
    import time

    full = lifetime_s(policies, num_nodes, price_per_hour)
    if full is None:
        return None
    left = cluster.created_at + full - (time.time() if now is None else now)
    if left >= full - UP_WINDOW_S:
        return full
    if left < 60:
        raise BudgetSpent(
            f"policies: the run's budget is spent (max_hours {policies.max_hours}, max_cost_usd "
            f"{policies.max_cost_usd}: every node of {cluster.name} ends {full / 3600:.2f} h after it was made); "
            "no new node is made", hint="raise policies.max_hours / max_cost_usd and `gtrain up --recreate`, "
                                        "or `gtrain down` what is left")
    return min(full, math.ceil(left))


class BudgetSpent(GtrainError):
    """policies.max_hours / max_cost_usd leave no time for a new node of the run."""


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


def running_s(provider: Provider, cluster: Cluster, rank: int, now: float) -> float:
    """How long node ``rank`` has run (and billed compute) so far: its cost intervals, the stopped ones left out."""
    from gtrain.providers.base import STOPPED_MARKET

    return sum((i.stopped_at or now) - i.started_at for i in provider.store.intervals(cluster.id)
               if i.node_rank == rank and i.market != STOPPED_MARKET)


def time_left_s(provider: Provider, cluster: Cluster, ranks: list[int]) -> dict[int, int]:
    """Before ``gtrain start``: what is left of each node's lifetime, counting only the time it ran (a stopped
    node bills its disk only). Empty without a time or cost limit; :class:`BudgetSpent` when a node has less
    than a minute left (it would end itself at once: nothing is started)."""
    import time

    life = cluster_lifetime_s(cluster)
    if life is None:
        return {}
    now = time.time()
    left = {r: int(life - running_s(provider, cluster, r, now)) for r in ranks}
    spent = sorted(r for r, s in left.items() if s < 60)
    if spent:
        raise BudgetSpent(f"policies: node(s) {spent} of {cluster.name} have run their {life / 3600:.2f} h "
                          "(max_hours / max_cost_usd): starting them would end them at once; nothing was started",
                          hint=f"`gtrain down {cluster.name}` deletes the cluster (its checkpoints: `gtrain pull` "
                               "needs running nodes, so raise the limit in the spec and `gtrain up --recreate`)")
    return left


def rearm(runners: dict[int, Any], left: dict[int, int], command: list[str], report: Any) -> None:
    """After ``gtrain start`` on a cloud whose nodes schedule their end at first boot only (EC2's cloud-init
    user data): each started node runs ``command`` (the section's ``idle_command``: power off, which on EC2
    terminates) once what is left of its lifetime has passed, detached, so it holds with no laptop."""
    import shlex

    for rank, r in sorted(runners.items()):
        if rank not in left:
            continue
        line = f"sleep {left[rank]} && exec {' '.join(map(shlex.quote, command))}"
        r.start_detached(f"sh -c {shlex.quote(line)}" + ' >>"$HOME/.gtrain-lifetime.log" 2>&1')
    if left:
        report.info(f"time limit re-armed on {len(left)} node(s): each ends itself after what is left of its "
                    f"lifetime ({min(left.values()) / 3600:.2f} h at the least; policies.max_hours / max_cost_usd)")
