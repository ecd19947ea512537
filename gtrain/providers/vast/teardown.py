"""Finding and destroying what a vast cluster owns, by its tags: each instance is labelled
``gtrain-<cluster id>-<rank>`` and carries ``GTRAIN_CLUSTER_ID`` in its env (``label`` and ``extra_env`` are what
``GET /api/v0/instances/`` returns). Used by ``down``, a failed ``up``, a lost node's replacement and ``gtrain
gc``; a lost state database loses nothing. gtrain registers no account SSH key on Vast (the cluster's key is
attached to each instance): instances are all there is to destroy."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from gtrain.providers.base import GCResult, Orphan

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.vast.api import VastAPI
    from gtrain.state import Cluster

PREFIX = "gtrain-"
TAG_ENV = "GTRAIN_CLUSTER_ID"
LABEL_RE = re.compile(r"^gtrain-(.+)-(\d+)$")


def label(cluster_id: str, rank: int) -> str:
    return f"{PREFIX}{cluster_id}-{rank}"


def env_of(inst: dict[str, Any]) -> dict[str, str]:
    """An instance's env: ``extra_env`` is a list of ``[name, value]`` pairs (a mapping accepted too)."""
    raw = inst.get("extra_env")
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    out = {}
    for pair in raw or []:
        if isinstance(pair, list | tuple) and len(pair) == 2:
            out[str(pair[0])] = str(pair[1])
    return out


def owner(inst: dict[str, Any]) -> tuple[str, int] | None:
    """(cluster id, rank) of a gtrain instance: its label, confirmed by its env tag when the env is listed."""
    m = LABEL_RE.match(str(inst.get("label") or ""))
    if not m:
        return None
    tag = env_of(inst).get(TAG_ENV)
    if tag is not None and tag != m.group(1):
        return None  # labelled like gtrain's but tagged otherwise: not ours to touch
    return m.group(1), int(m.group(2))


def country(inst: dict[str, Any]) -> str:
    geo = str(inst.get("geolocation") or "")
    return geo.rsplit(",", 1)[-1].strip() if geo else "?"


class VastTeardown:
    def __init__(self, api: VastAPI, ledger: Ledger, report: Reporter, poll_s: float = 2.0,
                 timeout_s: float = 300.0) -> None:
        self.api, self.ledger, self.report = api, ledger, report
        self.poll_s, self.timeout_s = poll_s, timeout_s

    def instances(self, cluster_id: str | None) -> list[dict[str, Any]]:
        """Listed instances of the cluster (of any gtrain cluster when ``cluster_id`` is None)."""
        return [i for i in self.api.instances()
                if (own := owner(i)) and (cluster_id is None or own[0] == cluster_id)]

    def destroy(self, ids: list[str], cluster: Cluster | None) -> None:
        """Destroy the instances ``ids`` (one already gone is no error) and wait until none is listed."""
        ids = sorted(set(ids))
        if not ids:
            return
        for iid in ids:
            self.api.destroy(iid)
        deadline = time.monotonic() + self.timeout_s
        while any(str(i.get("id")) in set(ids) for i in self.api.instances()) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted", kind="instance", refs=set(ids))

    def teardown(self, cluster_id: str, cluster: Cluster | None = None, known: list[str] | None = None) -> list[str]:
        """Destroy every instance tagged for the cluster (plus ``known`` ids); returns what still exists after."""
        ids = {str(i["id"]) for i in self.instances(cluster_id)} | set(known or [])
        if ids:
            self.report.info(f"destroying {len(ids)} Vast.ai instance(s)")
        self.destroy(sorted(ids), cluster)
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted")
        return [f"instance {i['id']} ({i.get('label')})" for i in self.instances(cluster_id)]

    def sweep(self, live_ids: set[str], delete: bool, regions: list[str] | None) -> GCResult:
        """``gtrain gc --provider vast``: instances tagged for a cluster that no live cluster in state owns (in
        the countries ``regions`` only, when given)."""
        res = GCResult(list(regions) if regions else ["all"])
        for i in self.instances(None):
            own = owner(i)
            where = country(i)
            if own and own[0] not in live_ids and (not regions or where in regions):
                res.orphans.append(Orphan(where, own[0], "instance", str(i["id"])))
        if res.orphans:
            self.report.info(f"{len(res.orphans)} orphaned instance(s) of {len(res.clusters)} cluster(s)")
        if not delete or not res.orphans:
            return res
        for cid in res.clusters:
            self.report.info(f"destroying what cluster {cid} left")
            mine = [o.id for o in res.orphans if o.cluster_id == cid]
            self.destroy(mine, None)
            res.left += [f"instance {i['id']} ({i.get('label')})" for i in self.api.instances()
                         if str(i.get("id")) in set(mine)]
        res.deleted = True
        return res
