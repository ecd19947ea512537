"""RunPod Instant Clusters: a gtrain cluster of more than one node is one RunPod pod cluster (API v2 ``POST
/v2/clusters``, ``type: TRAINING``): ``num_nodes`` identical pods, placed together in one data center on one
private overlay network, each with its node rank (``cluster.rank``) and overlay address (``cluster.ip``). RunPod
makes and ends the members together: a member cannot be created, replaced or deleted alone (the pod endpoints
answer 409), so ``up`` makes the whole cluster per data center tried, ``down`` deletes it, and a lost member is not
replaced (the job's recovery then fails with that reason rather than half-rebuilding a cluster).

The cluster is named ``gtrain-<cluster id>`` (its tag: RunPod clusters have no labels) and its members carry
``GTRAIN_CLUSTER_ID`` in their env like single pods."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.providers.runpod.teardown import TAG_ENV, cluster_name

if TYPE_CHECKING:
    from gtrain.providers.runpod.options import RunPodOptions

#: RunPod's generic distributed-training cluster type (``ClusterType``)
CLUSTER_TYPE = "TRAINING"
MAX_PODS = 250  # ClusterCompute.podCount's maximum (its minimum is 2)


def cluster_body(cluster_id: str, gpu_id: str, count: int, num_nodes: int, opts: RunPodOptions, public_key: str,
                 disk_gb: int, data_center: str | None) -> dict[str, Any]:
    """The ``POST /v2/clusters`` body (``CreateClusterRequest``): the shape, and the same container settings as a
    single pod's (the cluster's key as ``PUBLIC_KEY``, ``22/tcp`` published, the tag in the env)."""
    body: dict[str, Any] = {
        "name": cluster_name(cluster_id), "type": CLUSTER_TYPE,
        "compute": {"gpuTypeId": gpu_id, "gpuCountPerPod": count, "podCount": num_nodes},
        "image": opts.image, "ports": ["22/tcp"], "disk": disk_gb, "startSsh": True,
        "env": {"PUBLIC_KEY": public_key, TAG_ENV: cluster_id}}
    if data_center:
        body["dataCenterIds"] = [data_center]
    return body


def rank_of(pod: dict[str, Any]) -> int | None:
    member = pod.get("cluster") if isinstance(pod.get("cluster"), dict) else None
    rank = member.get("rank") if member else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def overlay_ip(pod: dict[str, Any]) -> str | None:
    member = pod.get("cluster") if isinstance(pod.get("cluster"), dict) else None
    ip = member.get("ip") if member else None
    return str(ip) if ip else None
