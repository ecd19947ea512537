"""``gtrain attach NAME --provider runpod``: a cluster's record rebuilt from its pods, on a machine that never ran
its ``up``. RunPod pods have no labels: each is named ``gtrain-<cluster id>-<rank>`` and carries
``GTRAIN_CLUSTER_ID`` in its env (``GET /v2/pods``), a multi-node cluster is one Instant Cluster named
``gtrain-<cluster id>`` whose members carry their rank (``GET /v2/clusters``, ``GET /v2/clusters/{id}/pods``); a
cluster id is ``<name>-<8 hex>``, so the name finds it (docs/providers/runpod.md, "attach").

The pods hold the cluster's key only (their ``PUBLIC_KEY``): the second machine reaches them with the same private
key, ``GTRAIN_SSH_KEY`` on both (gtrain.providers.cloud.keys.team_key).

API reference: https://rest.runpod.io/v2/openapi.json (ListPods, ListClusters), https://docs.runpod.io/api-reference
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import TYPE_CHECKING, Any, Protocol

from gtrain.errors import ConfigError
from gtrain.providers.cloud.keys import key_path
from gtrain.providers.cloud.ssh_access import wait_ssh
from gtrain.providers.runpod import clusters as rc
from gtrain.providers.runpod.options import runpod_options
from gtrain.providers.runpod.teardown import owner_of_cluster, owner_of_pod

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.base import Plan
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.runpod.api import RunPodAPI
    from gtrain.providers.runpod.options import RunPodOptions
    from gtrain.providers.runpod.teardown import RunPodTeardown
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, StateStore


class AdoptHost(Protocol):
    """What attach uses of the provider (:class:`~gtrain.providers.runpod.provider.RunPodProvider` is one)."""

    store: StateStore
    ledger: Ledger
    report: Reporter
    max_workers: int
    api: RunPodAPI
    teardown: RunPodTeardown

    def _record(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: RunPodOptions, gpu_type: str,
                pods: dict[int, dict[str, Any]]) -> None: ...


def of_name(name: str) -> re.Pattern[str]:
    """The cluster ids a cluster named ``name`` has (gtrain.state's ``<name>-<8 hex>``)."""
    return re.compile(rf"^{re.escape(name)}-[0-9a-f]{{8}}$")


def started_at(pod: dict[str, Any]) -> float | None:
    """When the pod started (``startedAt``, else ``createdAt``; RFC 3339), as a UNIX time."""
    raw = str(pod.get("startedAt") or pod.get("createdAt") or "")
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp() if raw else None
    except ValueError:
        return None


def find_by_name(p: AdoptHost, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
    """(cluster id, data center) of the pods / Instant Cluster tagged for a cluster named ``spec.name``
    (``regions``: those data centers only)."""
    want = of_name(spec.name)
    found: dict[str, str | None] = {}
    owned = [(pod_own[0], pod) for pod in p.teardown.pods(None) if (pod_own := owner_of_pod(pod))]
    owned += [(group_own, group) for group in p.teardown.clusters(None) if (group_own := owner_of_cluster(group))]
    for cid, thing in owned:
        where = str(thing.get("dataCenterId") or "") or None
        if want.match(cid) and (not regions or where in regions):
            found.setdefault(cid, where)
    if len(found) > 1:
        raise ConfigError(f"more than one cluster named {spec.name!r} runs: {sorted(found)}", field="NAME",
                          hint="`gtrain gc --provider runpod` lists them by id; `gtrain down` the one you know")
    return next(iter(found.items()), None)


def adopt(p: AdoptHost, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
    opts = runpod_options(spec.section("runpod"))
    nodes: dict[int, dict[str, Any]] = {}
    if spec.num_nodes > 1:
        for group in p.teardown.clusters(cluster.id):
            for pod in p.api.cluster_pods(str(group["id"])) or []:
                rank = rc.rank_of(pod)
                if rank is not None:
                    nodes[rank] = pod
    else:
        for pod in p.teardown.pods(cluster.id):
            own = owner_of_pod(pod)
            if own is not None:
                nodes[own[1]] = pod
    if sorted(nodes) != list(range(spec.num_nodes)):
        raise ConfigError(f"cluster {cluster.name!r} ({cluster.id}) has pod(s) of rank {sorted(nodes)}, the spec says "
                          f"num_nodes: {spec.num_nodes}", field="num_nodes",
                          hint="attach with the spec the cluster was made from, or `gtrain down` it")
    idle = [f"{pod.get('id')} ({pod.get('status')})" for pod in nodes.values() if pod.get("status") != "RUNNING"]
    if idle:
        raise ConfigError(f"cluster {cluster.name!r}: pod(s) not running: {', '.join(idle)}", field="NAME",
                          hint="attach again once RunPod lists them RUNNING; `gtrain gc --provider runpod --yes` "
                               f"removes the pods of cluster {cluster.id}")
    key = key_path(cluster.id)
    if not key.exists():
        raise ConfigError(f"GTRAIN_SSH_KEY: no key file for cluster {cluster.id} here ({key}); its pods hold "
                          "the cluster's key only", field="GTRAIN_SSH_KEY",
                          hint="set GTRAIN_SSH_KEY to the key file `up` used (the same file on both machines)")
    if spec.num_nodes > 1:
        for group in p.teardown.clusters(cluster.id):
            rid = p.ledger.record(cluster, "pod-cluster", str(group.get("name")), str(group.get("dataCenterId") or
                                                                                       region or "any"))
            p.ledger.mark(rid, "created", ref=str(group["id"]), meta={"name": group.get("name")})
    else:
        for pod in nodes.values():
            rid = p.ledger.record(cluster, "pod", str(pod.get("name")), str(pod.get("dataCenterId") or "any"))
            p.ledger.mark(rid, "created", ref=str(pod["id"]), meta={"name": pod.get("name")})
    gpu: dict[str, Any] = nodes[0]["gpu"] if isinstance(nodes[0].get("gpu"), dict) else {}
    p._record(spec, cluster, plan, opts, str(gpu.get("id") or plan.instance_type or ""), nodes)
    for rec in p.store.node_records(cluster.id):  # billed from the pod's start, not from now
        launched = started_at(nodes[rec.rank])
        if launched is not None:
            p.ledger.put_node(cluster.id, dataclasses.replace(rec, launched_at=launched))
    if opts.wait_ssh:
        wait_ssh(cluster, p.ledger, p.report, host_keys=lambda node: [], host_key_wait_s=0,
                 ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=p.max_workers,
                 key_source="RunPod (it publishes none)",
                 hint="the pods hold the cluster's key only: set GTRAIN_SSH_KEY to the key file `up` used")
