"""Finding and deleting what a lambda cluster owns, by name: its instances (``gtrain-<cluster id>-<rank>``) and its
SSH key (``gtrain-<cluster id>``). Used by ``down``, a failed ``up`` and ``gtrain gc``; the names are the tags
(Lambda instances carry no labels), so a lost state database loses nothing."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import ProviderError
from gtrain.providers.base import GCResult, Orphan
from gtrain.providers.cloud.errors import code_of
from gtrain.providers.lambda_cloud.api import KEY_IN_USE, is_gone

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.lambda_cloud.api import LambdaAPI
    from gtrain.state import Cluster

PREFIX = "gtrain-"
INSTANCE_RE = re.compile(r"^gtrain-(.+)-(\d+)$")
#: no longer listed: Lambda is done with it
GONE = ("terminated",)
#: not waited on once sent a terminate, not reported as left over: a preempted instance runs nothing, but it is
#: still listed and still holds the cluster's SSH key (``ssh-keys/key-in-use``) until it is terminated, so `down`
#: and `gc` list it and send it a terminate like any other
NOT_WAITED = ("terminated", "preempted")


def instance_name(cluster_id: str, rank: int) -> str:
    return f"{PREFIX}{cluster_id}-{rank}"


def key_name(cluster_id: str) -> str:
    return f"{PREFIX}{cluster_id}"


def owner_of_instance(name: str | None) -> tuple[str, int] | None:
    m = INSTANCE_RE.match(name or "")
    return (m.group(1), int(m.group(2))) if m else None


class LambdaTeardown:
    def __init__(self, api: LambdaAPI, ledger: Ledger, report: Reporter, poll_s: float = 2.0,
                 timeout_s: float = 600.0) -> None:
        self.api, self.ledger, self.report = api, ledger, report
        self.poll_s, self.timeout_s = poll_s, timeout_s

    def instances(self, cluster_id: str | None) -> list[dict[str, Any]]:
        """Listed (not terminated, preempted ones too) instances of the cluster, or of any gtrain cluster when
        ``cluster_id`` is None."""
        out = []
        for i in self.api.instances():
            own = owner_of_instance(i.get("name"))
            if own and i.get("status") not in GONE and (cluster_id is None or own[0] == cluster_id):
                out.append(i)
        return out

    def keys(self, cluster_id: str | None) -> list[dict[str, Any]]:
        return [k for k in self.api.ssh_keys() if str(k.get("name") or "").startswith(PREFIX)
                and (cluster_id is None or k.get("name") == key_name(cluster_id))]

    def terminate(self, ids: list[str], cluster: Cluster | None) -> None:
        """Terminate ``ids`` and wait until Lambda says they are terminated (or gone)."""
        ids = sorted(set(ids))
        if not ids:
            return
        live = {i["id"] for i in self.api.instances() if i.get("status") != "terminated"}
        todo = [i for i in ids if i in live]
        if todo:
            try:
                self.api.terminate(todo)
            except ProviderError as e:
                if not is_gone(e):  # another teardown got there first
                    raise
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = [i["id"] for i in self.api.instances()
                    if i["id"] in set(ids) and i.get("status") not in NOT_WAITED]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
        if cluster is not None:
            refs = set(ids)
            with self.ledger.lock:
                for res in self.ledger.store.resources(cluster.id, live_only=True):
                    if res.kind == "instance" and res.ref in refs:
                        self.ledger.store.mark_resource(res.id, "deleted")

    def delete_keys(self, cluster_id: str, cluster: Cluster | None) -> None:
        for k in self.keys(cluster_id):
            deadline = time.monotonic() + 120
            while True:
                try:
                    self.api.delete_ssh_key(str(k["id"]))
                    break
                except ProviderError as e:
                    if is_gone(e):  # deleted by another teardown: Lambda says global/not-found
                        break
                    if code_of(e) != KEY_IN_USE or time.monotonic() > deadline:
                        raise
                    time.sleep(self.poll_s)  # an instance still terminating holds it
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted", kind="ssh-key")

    def teardown(self, cluster_id: str, cluster: Cluster | None = None, known: list[str] | None = None) -> list[str]:
        """Terminate every instance named for the cluster (plus ``known`` ids), then its SSH key; returns what
        still exists afterwards (empty when clean)."""
        ids = {i["id"] for i in self.instances(cluster_id)} | set(known or [])
        if ids:
            self.report.info(f"terminating {len(ids)} instance(s)")
        self.terminate(sorted(ids), cluster)
        self.delete_keys(cluster_id, cluster)
        if cluster is not None:
            self.ledger.mark_live(cluster.id, "deleted")
        return [f"instance {i['id']} ({i.get('name')})" for i in self.instances(cluster_id)
                if i.get("status") not in NOT_WAITED] + \
               [f"ssh-key {k.get('name')}" for k in self.keys(cluster_id)]

    def sweep(self, live_ids: set[str], delete: bool, regions: list[str] | None) -> GCResult:
        """``gtrain gc --provider lambda``: instances and keys named for a cluster no live cluster in state owns."""
        res = GCResult(list(regions) if regions else ["all"])
        for i in self.instances(None):
            own = owner_of_instance(i.get("name"))
            region = str((i.get("region") or {}).get("name") or "?")
            if own and own[0] not in live_ids and (not regions or region in regions):
                res.orphans.append(Orphan(region, own[0], "instance", str(i["id"])))
        for k in self.keys(None):
            cid = str(k["name"])[len(PREFIX):]
            if cid not in live_ids:
                res.orphans.append(Orphan("global", cid, "ssh-key", str(k["name"])))
        if res.orphans:
            self.report.info(f"{len(res.orphans)} orphaned resource(s) of {len(res.clusters)} cluster(s)")
        if not delete or not res.orphans:
            return res
        for cid in res.clusters:
            self.report.info(f"deleting what cluster {cid} left")
            res.left += self.teardown(cid, known=[o.id for o in res.orphans
                                                   if o.cluster_id == cid and o.kind == "instance"])
        res.deleted = True
        return res
