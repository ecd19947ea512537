"""`gtrain gc --provider kubernetes`: the objects labelled ``app.kubernetes.io/managed-by=gtrain`` (Jobs, pods,
Services, ConfigMaps, Secrets) in the swept namespaces of the current kubeconfig context whose
``gtrain.dev/cluster`` is no live cluster's; with ``--yes`` each such cluster's objects are deleted by label
(foreground propagation) and what is still there afterwards is listed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.providers.base import GCResult, Orphan
from gtrain.providers.kubernetes import objects as ko
from gtrain.providers.kubernetes.api import edge, is_not_found

if TYPE_CHECKING:
    from gtrain.providers.kubernetes.host import KubeHost


def namespaces(provider: KubeHost) -> list[str]:
    """``default`` and every namespace a kubernetes cluster in state used."""
    out = ["default"]
    for c in provider.store.list_clusters(include_terminated=True):
        ns = (c.extra.get("kubernetes") or {}).get("namespace") if c.provider == "kubernetes" else None
        if ns and ns not in out:
            out.append(ns)
    return out


def _kinds() -> list[Any]:
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import ConfigMap, Pod, Secret, Service

    return [Job, Pod, Service, ConfigMap, Secret]


def _found(c: Any, ns: str) -> list[tuple[str, str, str]]:
    """(cluster id, kind, name) of every gtrain-labelled object in ``ns``."""
    out = []
    for kind in _kinds():
        with edge(f"list {kind.__name__}s managed by gtrain", ns):
            for obj in c.list(kind, namespace=ns, labels={"app.kubernetes.io/managed-by": "gtrain"}):
                cid = (obj.metadata.labels or {}).get(ko.LABEL_CLUSTER)
                if cid:
                    out.append((cid, kind.__name__, obj.metadata.name))
    return out


def sweep(provider: KubeHost, regions: list[str] | None, live_cluster_ids: set[str],
          delete: bool) -> GCResult:
    from lightkube.types import CascadeType

    from gtrain.providers.kubernetes.api import client

    picked = list(regions) if regions else namespaces(provider)
    res = GCResult(picked)
    live = {cid[:63] for cid in live_cluster_ids}
    clients = {ns: client(None, ns) for ns in picked}
    for ns in picked:
        for cid, kind, name in _found(clients[ns], ns):
            if cid not in live:
                res.orphans.append(Orphan(ns, cid, kind, name))
    if res.orphans:
        provider.report.info(f"{len(res.orphans)} orphaned object(s) of {len(res.clusters)} cluster(s)")
    if not delete or not res.orphans:
        return res
    by_kind = {k.__name__: k for k in _kinds()}
    for o in res.orphans:
        try:
            clients[o.region].delete(by_kind[o.kind], o.id, namespace=o.region, cascade=CascadeType.FOREGROUND)
        except Exception as e:
            if not is_not_found(e):
                with edge(f"delete {o.kind} {o.id}", o.region):
                    raise
    gone = {(o.region, o.cluster_id) for o in res.orphans}
    for ns in sorted({ns for ns, _ in gone}):
        res.left += [f"{ns}/{kind}/{name}" for cid, kind, name in _found(clients[ns], ns)
                     if (ns, cid) in gone and kind != "Pod"]  # a pod's grace period may still run
    res.deleted = True
    return res
