"""Finding and deleting what a nebius cluster owns, by its labels: each instance is named
``gtrain-<cluster id>-<rank>`` and labelled ``gtrain-cluster: <cluster id>``, ``gtrain-rank: <rank>``; a
multi-node cluster's GPU cluster is named ``gtrain-<cluster id>`` with the same ``gtrain-cluster`` label. Nebius
lists both by project (``InstanceService.List`` / ``GpuClusterService.List``, their labels included), so ``down``, a
failed ``up`` and ``gtrain gc`` find them with the local state gone. A managed boot disk is deleted with its
instance; gtrain uploads no account key (the cluster's key rides in the instance's cloud-init)."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from gtrain.providers.base import GCResult, Orphan

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.nebius.api import NebiusAPI
    from gtrain.state import Cluster

PREFIX = "gtrain-"
LABEL = "gtrain-cluster"
RANK_LABEL = "gtrain-rank"
NAME_RE = re.compile(r"^gtrain-(.+)-(\d+)$")
GONE = ("DELETING",)


def instance_name(cluster_id: str, rank: int) -> str:
    return f"{PREFIX}{cluster_id}-{rank}"


def gpu_cluster_name(cluster_id: str) -> str:
    return f"{PREFIX}{cluster_id}"


def owner_of(inst: dict[str, Any]) -> tuple[str, int] | None:
    """(cluster id, rank) of a gtrain instance: its label, confirmed by its name."""
    labels = inst.get("labels") or {}
    m = NAME_RE.match(str(inst.get("name") or ""))
    if not m or labels.get(LABEL) != m.group(1):
        return None
    return m.group(1), int(m.group(2))


def owner_of_group(g: dict[str, Any]) -> str | None:
    cid = (g.get("labels") or {}).get(LABEL)
    return str(cid) if cid and g.get("name") == gpu_cluster_name(str(cid)) else None


class NebiusTeardown:
    def __init__(self, api: NebiusAPI, ledger: Ledger, report: Reporter, poll_s: float = 0.25,
                 timeout_s: float = 600.0) -> None:
        self.api, self.ledger, self.report = api, ledger, report
        self.poll_s, self.timeout_s = poll_s, timeout_s

    def instances(self, project: str, cluster_id: str | None) -> list[dict[str, Any]]:
        out = []
        for i in self.api.instances(project):
            own = owner_of(i)
            if own and i.get("state") not in GONE and (cluster_id is None or own[0] == cluster_id):
                out.append(i)
        return out

    def groups(self, project: str, cluster_id: str | None) -> list[dict[str, Any]]:
        return [g for g in self.api.gpu_clusters(project)
                if (own := owner_of_group(g)) and (cluster_id is None or own == cluster_id)]

    def delete(self, project: str, ids: list[str], groups: list[str], cluster: Cluster | None) -> None:
        """Delete the instances ``ids`` (each ``Delete`` waits for its operation), then the GPU clusters ``groups``
        (Nebius refuses to delete a GPU cluster that still has instances)."""
        for iid in sorted(set(ids)):
            self.api.delete_instance(iid)
        deadline = time.monotonic() + self.timeout_s
        while any(i["id"] in set(ids) for i in self.api.instances(project)) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        if cluster is not None and ids:
            self.ledger.mark_live(cluster.id, "deleted", kind="instance", refs=set(ids))
        for gid in sorted(set(groups)):
            self.api.delete_gpu_cluster(gid)
        if cluster is not None and groups:
            self.ledger.mark_live(cluster.id, "deleted", kind="gpu-cluster", refs=set(groups))

    def teardown(self, project: str, cluster_id: str, cluster: Cluster | None = None,
                 known: list[str] | None = None) -> list[str]:
        """Delete every instance and GPU cluster labelled for the cluster (plus ``known`` instance ids); returns
        what still exists after."""
        ids = {i["id"] for i in self.instances(project, cluster_id)} | set(known or [])
        groups = [g["id"] for g in self.groups(project, cluster_id)]
        if ids:
            self.report.info(f"deleting {len(ids)} instance(s)")
        if groups:
            self.report.info(f"deleting GPU cluster {', '.join(groups)}")
        self.delete(project, sorted(ids), groups, cluster)
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted")
        return [f"instance {i['id']} ({i.get('name')})" for i in self.instances(project, cluster_id)] + \
               [f"GPU cluster {g['id']} ({g.get('name')})" for g in self.groups(project, cluster_id)]

    def sweep(self, projects: list[str], live_ids: set[str], delete: bool) -> GCResult:
        """``gtrain gc --provider nebius``: instances and GPU clusters labelled for a cluster that no live cluster
        in state owns, in the projects ``projects``."""
        res = GCResult(list(projects))
        for project in projects:
            for i in self.instances(project, None):
                own = owner_of(i)
                if own and own[0] not in live_ids:
                    res.orphans.append(Orphan(project, own[0], "instance", str(i["id"])))
            for g in self.groups(project, None):
                cid = owner_of_group(g)
                if cid and cid not in live_ids:
                    res.orphans.append(Orphan(project, cid, "gpu-cluster", str(g["id"])))
        if res.orphans:
            self.report.info(f"{len(res.orphans)} orphaned resource(s) of {len(res.clusters)} cluster(s)")
        if not delete or not res.orphans:
            return res
        for project in projects:
            for cid in res.clusters:
                mine = [o.id for o in res.orphans if o.cluster_id == cid and o.region == project]
                kinds = {o.id: o.kind for o in res.orphans}
                if not mine:
                    continue
                self.report.info(f"deleting what cluster {cid} left in {project}")
                self.delete(project, [x for x in mine if kinds[x] == "instance"],
                            [x for x in mine if kinds[x] == "gpu-cluster"], None)
                res.left += [f"instance {i['id']}" for i in self.instances(project, cid)] + \
                    [f"GPU cluster {g['id']}" for g in self.groups(project, cid)]
        res.deleted = True
        return res
