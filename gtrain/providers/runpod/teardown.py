"""Finding and deleting what a runpod cluster owns, by its tags: each pod is named ``gtrain-<cluster id>-<rank>``
and carries ``GTRAIN_CLUSTER_ID`` in its env (RunPod pods have no labels; the name and the env are what
``GET /v2/pods`` returns), and a multi-node cluster's RunPod Instant Cluster is named ``gtrain-<cluster id>``
(``GET /v2/clusters``). Used by ``down``, a failed ``up`` and ``gtrain gc``; a lost state database loses nothing.
gtrain uploads no account SSH key (the cluster's key rides in the pods' ``PUBLIC_KEY``): pods and pod clusters are
all there is to delete."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from gtrain.providers.base import GCResult, Orphan

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.runpod.api import RunPodAPI
    from gtrain.state import Cluster

PREFIX = "gtrain-"
TAG_ENV = "GTRAIN_CLUSTER_ID"
POD_RE = re.compile(r"^gtrain-(.+)-(\d+)$")
#: no longer billed: RunPod is done with it (a terminated pod also leaves the list)
GONE = ("TERMINATED",)


def pod_name(cluster_id: str, rank: int) -> str:
    return f"{PREFIX}{cluster_id}-{rank}"


def cluster_name(cluster_id: str) -> str:
    """The name of the RunPod Instant Cluster of a multi-node gtrain cluster (gtrain.providers.runpod.clusters)."""
    return f"{PREFIX}{cluster_id}"


def owner_of_cluster(rc: dict[str, Any]) -> str | None:
    """The gtrain cluster id a RunPod cluster is named for, or None."""
    name = str(rc.get("name") or "")
    return name[len(PREFIX):] if name.startswith(PREFIX) and len(name) > len(PREFIX) else None


def owner_of_pod(pod: dict[str, Any]) -> tuple[str, int] | None:
    """(cluster id, rank) of a gtrain pod: its name, confirmed by its env tag when the env is listed."""
    m = POD_RE.match(str(pod.get("name") or ""))
    if not m:
        return None
    env: dict[str, Any] = pod["env"] if isinstance(pod.get("env"), dict) else {}
    tag = env.get(TAG_ENV)
    if tag is not None and tag != m.group(1):
        return None  # named like gtrain's but tagged otherwise: not ours to touch
    return m.group(1), int(m.group(2))


class RunPodTeardown:
    def __init__(self, api: RunPodAPI, ledger: Ledger, report: Reporter, poll_s: float = 2.0,
                 timeout_s: float = 300.0) -> None:
        self.api, self.ledger, self.report = api, ledger, report
        self.poll_s, self.timeout_s = poll_s, timeout_s

    def pods(self, cluster_id: str | None) -> list[dict[str, Any]]:
        """Listed, not terminated pods of the cluster (of any gtrain cluster when ``cluster_id`` is None)."""
        out = []
        for p in self.api.pods():
            own = owner_of_pod(p)
            if own and p.get("status") not in GONE and (cluster_id is None or own[0] == cluster_id):
                out.append(p)
        return out

    def clusters(self, cluster_id: str | None) -> list[dict[str, Any]]:
        """RunPod Instant Clusters named for the cluster (for any gtrain cluster when ``cluster_id`` is None)."""
        return [c for c in self.api.clusters()
                if (own := owner_of_cluster(c)) and (cluster_id is None or own == cluster_id)]

    def delete_clusters(self, ids: list[str], cluster: Cluster | None) -> None:
        """Delete the RunPod clusters ``ids`` (their member pods with them) and wait until none is listed."""
        ids = sorted(set(ids))
        if not ids:
            return
        for rid in ids:
            self.api.delete_cluster(rid)
        deadline = time.monotonic() + self.timeout_s
        while any(c.get("id") in set(ids) for c in self.api.clusters()) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted", kind="pod-cluster", refs=set(ids))

    def terminate(self, ids: list[str], cluster: Cluster | None) -> None:
        """Terminate the pods ``ids`` (``DELETE /v2/pods/{id}``, a pod already gone is no error) and wait until
        none is listed."""
        ids = sorted(set(ids))
        if not ids:
            return
        for pid in ids:
            self.api.delete_pod(pid)
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = [p for p in self.api.pods() if p.get("id") in set(ids) and p.get("status") not in GONE]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted", kind="pod", refs=set(ids))

    def teardown(self, cluster_id: str, cluster: Cluster | None = None, known: list[str] | None = None) -> list[str]:
        """Terminate every pod tagged for the cluster (plus ``known`` ids); returns what still exists after."""
        groups = [str(c["id"]) for c in self.clusters(cluster_id)]
        members = self._members(groups)  # they go with their cluster: the pod endpoints refuse them (409)
        if groups:
            self.report.info(f"deleting RunPod cluster {', '.join(groups)} and its pods")
        self.delete_clusters(groups, cluster)
        ids = ({str(p["id"]) for p in self.pods(cluster_id)} | set(known or [])) - members
        if ids:
            self.report.info(f"terminating {len(ids)} pod(s)")
        self.terminate(sorted(ids), cluster)
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted")
        return [f"pod {p['id']} ({p.get('name')})" for p in self.pods(cluster_id)] + \
               [f"pod cluster {c['id']} ({c.get('name')})" for c in self.clusters(cluster_id)]

    def _members(self, groups: list[str]) -> set[str]:
        """Ids of the member pods of the RunPod clusters ``groups``."""
        out: set[str] = set()
        for g in groups:
            out |= {str(p.get("id")) for p in self.api.cluster_pods(g) or []}
        return out

    def sweep(self, live_ids: set[str], delete: bool, regions: list[str] | None) -> GCResult:
        """``gtrain gc --provider runpod``: pods tagged for a cluster that no live cluster in state owns (in the
        data centers ``regions`` only, when given)."""
        res = GCResult(list(regions) if regions else ["all"])
        for p in self.pods(None):
            own = owner_of_pod(p)
            where = str(p.get("dataCenterId") or "?")
            if own and own[0] not in live_ids and (not regions or where in regions):
                res.orphans.append(Orphan(where, own[0], "pod", str(p["id"])))
        for c in self.clusters(None):
            group_owner = owner_of_cluster(c)
            where = str(c.get("dataCenterId") or "?")
            if group_owner and group_owner not in live_ids and (not regions or where in regions):
                res.orphans.append(Orphan(where, group_owner, "pod-cluster", str(c["id"])))
        if res.orphans:
            self.report.info(f"{len(res.orphans)} orphaned resource(s) of {len(res.clusters)} cluster(s)")
        if not delete or not res.orphans:
            return res
        for cid in res.clusters:
            self.report.info(f"deleting what cluster {cid} left")
            groups = [o.id for o in res.orphans if o.cluster_id == cid and o.kind == "pod-cluster"]
            self.delete_clusters(groups, None)
            mine = [o.id for o in res.orphans if o.cluster_id == cid and o.kind == "pod"]
            self.terminate(mine, None)
            res.left += [f"pod {p['id']} ({p.get('name')})" for p in self.api.pods()
                         if p.get("id") in set(mine) and p.get("status") not in GONE]
            res.left += [f"pod cluster {c['id']}" for c in self.api.clusters() if c.get("id") in set(groups)]
        res.deleted = True
        return res
