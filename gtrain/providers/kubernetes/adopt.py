"""``gtrain attach NAME --provider kubernetes``: a cluster's record rebuilt from gtrain's labels in its namespace.

Every cluster has its own object there from ``up`` on: the anchor ConfigMap (``gtrain-<name>-<id tail>``,
labelled ``gtrain.dev/cluster=<id>`` and ``app.kubernetes.io/managed-by=gtrain``; data ``cluster``,
``cluster_id``). After each launch gtrain keeps ``gtrain attach``'s record in it (``record``: the cluster's spec
and jobs, nothing secret, as ``gtrain-record.json`` on a VM's node 0; ``gpu_label``: the node label its pods
select), since a pod's files end with the pod. API: ConfigMap list by label selector, get, and replace (PUT)
on the object's resourceVersion (kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/
config-map-v1/).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.providers.kubernetes import objects as ko
from gtrain.providers.kubernetes.api import call, edge, is_not_found
from gtrain.providers.kubernetes.options import parse_options

if TYPE_CHECKING:
    from gtrain.providers.kubernetes.host import KubeHost
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

MANAGED = {"app.kubernetes.io/managed-by": "gtrain"}


def find_by_name(p: KubeHost, spec: ClusterSpec, namespaces: list[str]) -> tuple[str, str | None] | None:
    """(cluster id, namespace) of the anchor ConfigMap naming cluster ``spec.name`` (``namespaces``: only those;
    default the spec's ``kubernetes.namespace``)."""
    from lightkube.resources.core_v1 import ConfigMap

    from gtrain.providers.kubernetes.api import client

    opts = parse_options(spec)
    found: dict[str, str] = {}
    for ns in namespaces or [opts.namespace]:
        c = client(opts.context, ns)
        with edge(f"list ConfigMaps labelled {MANAGED}", ns):
            maps = [m.to_dict() for m in c.list(ConfigMap, namespace=ns, labels=MANAGED)]
        for m in maps:
            data, meta = m.get("data") or {}, m.get("metadata") or {}
            cid = str(data.get("cluster_id") or "")
            labelled = bool(cid) and (meta.get("labels") or {}).get(ko.LABEL_CLUSTER) == cid[:63]
            if labelled and data.get("cluster") == spec.name and meta.get("name") == ko.anchor_name(spec.name, cid):
                found.setdefault(cid, ns)
    if len(found) > 1:
        raise ConfigError(f"more than one cluster named {spec.name!r} has objects: {sorted(found)}", field="NAME",
                          hint="`gtrain gc --provider kubernetes` lists them by id; `gtrain down` the one you know")
    return next(iter(found.items()), None)


def adopt(p: KubeHost, spec: ClusterSpec, cluster: Cluster, namespace: str | None) -> None:
    """Record the anchor in the ledger and the node slots, as ``up`` does (nothing is created)."""
    from gtrain.providers.kubernetes.api import client

    opts = parse_options(spec)
    ns = namespace or opts.namespace
    c = client(opts.context, ns)
    extra = {**cluster.extra, "kubernetes": {"context": opts.context, "namespace": ns, "gpu_label": None}}
    cluster.extra = extra
    anchor = _anchor(p, cluster)
    label = json.loads((anchor or {}).get("data", {}).get("gpu_label") or "null")
    extra["kubernetes"]["gpu_label"] = label if isinstance(label, list) else None
    p.store.update_cluster(cluster.id, extra=extra)
    p.remember_client(cluster, c)
    rid = p.store.record_resource(cluster.id, "configmap", ko.anchor_name(cluster.name, cluster.id), region=ns)
    p.store.mark_resource(rid, "created")
    for k in range(spec.num_nodes):
        p.store.upsert_node(cluster.id, k, status="up", address=f"pod {k}", instance_id=f"kubernetes:{ns}/pod-{k}",
                            meta={})


def _anchor(p: KubeHost, cluster: Cluster) -> dict[str, Any] | None:
    from lightkube.resources.core_v1 import ConfigMap

    ns = (cluster.extra.get("kubernetes") or {}).get("namespace") or "default"
    name = ko.anchor_name(cluster.name, cluster.id)
    try:
        return dict(p.client(cluster).get(ConfigMap, name, namespace=ns).to_dict())
    except Exception as e:
        if is_not_found(e):
            return None
        with edge(f"get ConfigMap {name}", ns):
            raise


def keep_record(p: KubeHost, cluster: Cluster, body: bytes) -> None:
    """The record into the anchor ConfigMap (replaced on the version read; one retry on a conflict)."""
    from lightkube import codecs

    ns = (cluster.extra.get("kubernetes") or {}).get("namespace") or "default"
    for _ in range(2):
        have = _anchor(p, cluster)
        if have is None:
            return
        have.setdefault("data", {}).update(
            record=body.decode(), gpu_label=json.dumps((cluster.extra.get("kubernetes") or {}).get("gpu_label")))
        try:
            call(p.client(cluster).replace, f"replace ConfigMap {have['metadata']['name']}", ns,
                 codecs.from_dict(have))
            return
        except ConfigError:  # 409: another writer in between; read again
            continue


def read_record(p: KubeHost, cluster: Cluster) -> dict[str, Any] | None:
    have = _anchor(p, cluster)
    try:
        doc = json.loads(((have or {}).get("data") or {}).get("record") or "null")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
