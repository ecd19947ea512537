"""``job.queue``, ``job.priority`` and ``job.gpus_per_node`` (docs/queue.md): the checks that need the whole
spec (models only; the queue itself is gtrain.jobs.queue and, on the nodes, gtrain.remote.nodequeue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec, Job


def packed(spec: ClusterSpec, job: Job) -> bool:
    """The job takes fewer GPUs than its node has: it may run beside others (with ``queue``)."""
    return job.gpus_per_node is not None and job.gpus_per_node < spec.resources.gpus_per_node


def problem(spec: ClusterSpec, job: Job, num_nodes: int) -> tuple[str, str] | None:
    """Why ``job.gpus_per_node`` cannot be had on ``num_nodes`` nodes of the spec's shape: (field, message)."""
    want, have = job.gpus_per_node, spec.resources.gpus_per_node
    if want is None:
        return None
    if have == 0:
        return "job.gpus_per_node", f"job.gpus_per_node: {want} but the nodes have no GPU (resources.accelerators)"
    if want > have:
        return "job.gpus_per_node", f"job.gpus_per_node: {want} but a node has {have} GPU(s)"
    if want < have and num_nodes > 1:
        return "job.gpus_per_node", (f"job.gpus_per_node: {want} of {have} on {num_nodes} nodes: a multi-node job "
                                     "takes whole nodes (packing is for one-node clusters)")
    if want < have and job.image:
        return "job.gpus_per_node", "job.gpus_per_node with job.image: a container sees every GPU of its node"
    return None
