"""``job.queue``, ``job.priority`` and ``job.gpus_per_node`` (docs/queue.md): the checks that need the whole
spec (models only; the queue itself is gtrain.jobs.queue and, on the nodes, gtrain.remote.nodequeue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec, Job


def packed(spec: ClusterSpec, job: Job) -> bool:
    """The job takes fewer GPUs than its node has: it may run beside others (with ``queue``)."""
    return job.gpus_per_node is not None and job.gpus_per_node < spec.resources.gpus_per_node


def job_gpus(spec: ClusterSpec, job: Job | None) -> int:
    """The GPUs per node a job asks of a scheduler that packs (Slurm's ``--gpus-per-node``, a pod's
    ``nvidia.com/gpu`` limit, a Ray bundle's ``GPU``): ``job.gpus_per_node``, else the whole node's; 0 with no
    ``resources.accelerators``."""
    if not spec.resources.accelerators:
        return 0
    if job is not None and job.gpus_per_node is not None:
        return min(job.gpus_per_node, spec.resources.gpus_per_node)
    return spec.resources.gpus_per_node


def problem(spec: ClusterSpec, job: Job, num_nodes: int, scheduler: bool = False) -> tuple[str, str] | None:
    """Why ``job.gpus_per_node`` cannot be had on ``num_nodes`` nodes of the spec's shape: (field, message).
    With ``scheduler`` (Slurm, Kubernetes, Ray: the scheduler packs jobs on its nodes, gtrain only maps the
    request), only what no node could give is refused."""
    want, have = job.gpus_per_node, spec.resources.gpus_per_node
    if want is None:
        return None
    if have == 0:
        return "job.gpus_per_node", f"job.gpus_per_node: {want} but the nodes have no GPU (resources.accelerators)"
    if want > have:
        return "job.gpus_per_node", f"job.gpus_per_node: {want} but a node has {have} GPU(s)"
    if scheduler:
        return None
    if want < have and num_nodes > 1:
        return "job.gpus_per_node", (f"job.gpus_per_node: {want} of {have} on {num_nodes} nodes: a multi-node job "
                                     "takes whole nodes (packing is for one-node clusters)")
    if want < have and job.image:
        return "job.gpus_per_node", "job.gpus_per_node with job.image: a container sees every GPU of its node"
    return None


def check(spec: ClusterSpec) -> None:
    """What no node of the spec could give (exit 2 at load, whatever runs the job): more GPUs than a node has, or
    GPUs of nodes that have none. The rest of :func:`problem` needs the cluster's backend (``launch``)."""
    if spec.job is None or spec.resources.any_of:
        return
    if found := problem(spec, spec.job, spec.num_nodes, scheduler=True):
        from gtrain.errors import ConfigError

        raise ConfigError(f"invalid spec: {found[1]}", field=found[0],
                          hint=f"job.gpus_per_node: at most {spec.resources.gpus_per_node}, or drop it (the whole "
                          "node)" if spec.resources.gpus_per_node else "give resources.accelerators, or drop "
                          "job.gpus_per_node")
