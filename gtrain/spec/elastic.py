"""Elastic node counts: ``num_nodes: {min: 2, max: 8}`` (docs/durable.md, "Elastic runs").

The spec keeps ``num_nodes`` an int (the most nodes, what ``up`` asks for) and ``min_nodes`` beside it (the
fewest a run trains on); :func:`split` turns the YAML's mapping into the two before validation and
:func:`check` refuses what cannot be elastic, naming the field, the value and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.registry import FIXED_ALLOCATION

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec

#: launchers that cannot change their world size while running, and why
NOT_ELASTIC = {
    "accelerate": "accelerate launch gives each machine a fixed --machine_rank and --num_machines",
    "deepspeed": "gtrain starts DeepSpeed from a fixed hostfile (DeepSpeed's own elasticity needs its "
                 "elastic config and batch-size schedule)",
    "jax": "jax.distributed.initialize takes a fixed num_processes",
    "tensorflow": "TF_CONFIG names a fixed cluster",
    "python": "the python launcher has no rendezvous to rejoin",
}
#: providers whose scheduler owns the allocation, and why they cannot grow or shrink a running job: the registry's
#: word (gtrain.registry.FIXED_ALLOCATION), where every provider name lives
NOT_ELASTIC_PROVIDER = FIXED_ALLOCATION


def split(data: Any) -> Any:
    """The spec mapping with ``num_nodes: {min, max}`` as ``num_nodes: max`` and ``min_nodes: min``."""
    if not isinstance(data, dict):
        return data
    if "min_nodes" in data:
        raise ValueError("min_nodes: not a field of the spec; write num_nodes: {min: 2, max: 8} for an "
                         "elastic run")
    n = data.get("num_nodes")
    if not isinstance(n, dict):
        return data
    unknown = sorted(str(k) for k in n if k not in ("min", "max"))
    if unknown or "min" not in n or "max" not in n:
        raise ValueError(f"num_nodes: {n!r} — an elastic node count is {{min: N, max: M}} "
                         f"({'unknown key(s) ' + ', '.join(unknown) if unknown else 'both keys are needed'})")
    lo, hi = n["min"], n["max"]
    for key, v in (("min", lo), ("max", hi)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"num_nodes.{key}: {v!r} is not a whole number of nodes (1 or more)")
    if lo > hi:
        raise ValueError(f"num_nodes: min {lo} is more than max {hi}; give min <= max")
    return {**data, "num_nodes": hi, "min_nodes": lo}


def check(spec: ClusterSpec) -> None:
    """Refuse an elastic spec (``min < max``) that its provider or launcher cannot run."""
    if spec.min_nodes is None or spec.min_nodes >= spec.num_nodes:
        return
    span = f"{{min: {spec.min_nodes}, max: {spec.num_nodes}}}"
    providers = {spec.provider, *(c.provider for c in spec.resources.any_of or [] if c.provider)}
    for p in sorted(providers & set(NOT_ELASTIC_PROVIDER)):
        raise ValueError(f"num_nodes: {span} — provider {p} cannot run an elastic job: {NOT_ELASTIC_PROVIDER[p]}; "
                         f"give a plain num_nodes")
    if spec.resources.tpu:
        raise ValueError(f"num_nodes: {span} — a TPU slice has a fixed host count; give a plain num_nodes")
    job = spec.job
    if job is not None and job.image:
        raise ValueError(f"num_nodes: {span} — an elastic run in job.image is not supported yet (each rendezvous "
                         "round restores its checkpoint on the host); drop job.image or give a plain num_nodes")
    if job is not None and job.launcher in NOT_ELASTIC and job.fault_tolerance != "torchft":
        raise ValueError(f"num_nodes: {span} — job.launcher {job.launcher} cannot be elastic: "
                         f"{NOT_ELASTIC[job.launcher]}; use launcher torchrun or a plain num_nodes")


#: (join_timeout, last_call_timeout, keep_alive_interval) of torchrun's c10d rendezvous, by provider: how long the
#: first round waits for min nodes (a cloud's VMs boot and install for minutes), how long a round that has min
#: nodes waits for more (every shrink and start pays it once), and how often a node says it lives (a node silent
#: for KEEP_ALIVE_ATTEMPTS of them is dead: the survivors' next round waits that long for a node that died)
TIMEOUTS = {"local": (120, 1, 1), "ssh": (300, 2, 2)}
CLOUD_TIMEOUTS = (900, 5, 5)
KEEP_ALIVE_ATTEMPTS = 3
#: a fixed world's static rendezvous: how long node 0's store waits for every node's agent (their setup runs first)
STATIC_JOIN_S = 300

# Rendezvous at scale (docs/scale.md): the base timeouts above fit up to SCALE_FROM nodes. Beyond it:
# - every node more may come up later (its setup, its boot): JOIN_PER_NODE_S more of join timeout, up to JOIN_CAP_S;
# - c10d's read_timeout (connecting to node 0's store and each store read; torch's default 60 s: a node whose
#   agent starts before node 0's fails with "The client socket has timed out after 60s", pytorch#107021) grows
#   by one second per READ_PER_NODES nodes;
# - each c10d keep-alive rewrites the one rendezvous state, which names every node: N nodes every interval is
#   O(N^2) bytes on node 0's store and N-way compare-and-set contention (the reason pytorch#145228 exposed the
#   interval "for jobs with thousands of ranks"), so the interval grows with N / KEEP_ALIVE_PER_NODES, and a dead
#   node is noticed that much later.
SCALE_FROM = 64
JOIN_PER_NODE_S = 2
JOIN_CAP_S = 3600
READ_TIMEOUT_S = 60
READ_PER_NODES = 10
KEEP_ALIVE_PER_NODES = 100


def join_timeout(base: int, nodes: int) -> int:
    """A rendezvous's join timeout for ``nodes`` nodes: ``base`` up to :data:`SCALE_FROM` nodes, then
    :data:`JOIN_PER_NODE_S` more per node, capped at :data:`JOIN_CAP_S` (never below ``base``)."""
    return max(base, min(JOIN_CAP_S, base + JOIN_PER_NODE_S * max(0, nodes - SCALE_FROM)))


def rendezvous_settings(nodes: int) -> dict[str, int]:
    """A fixed world's rendezvous fields of a node's render context: the static rendezvous's timeout."""
    return {"join_timeout": join_timeout(STATIC_JOIN_S, nodes)}


def torchrun_settings(spec: ClusterSpec, provider: str) -> dict[str, int]:
    """The elastic fields of a node's render context (gtrain.jobs.templating.NodeContext)."""
    join, last_call, keep_alive = TIMEOUTS.get(provider, CLOUD_TIMEOUTS)
    nodes = spec.num_nodes
    job = spec.job
    # every loss makes the survivors' workers fail once (a join does not count): torchrun restarts them that
    # many times before it gives up
    restarts = max(job.max_restarts if job else 0, spec.policies.recovery.max_restarts, 3)
    return {"min_nodes": int(spec.min_nodes or nodes), "max_nodes": nodes, "join_timeout": join_timeout(join, nodes),
            "last_call_timeout": last_call, "keep_alive_interval": keep_alive * max(1, nodes // KEEP_ALIVE_PER_NODES),
            "read_timeout": READ_TIMEOUT_S + nodes // READ_PER_NODES, "max_restarts": restarts}
