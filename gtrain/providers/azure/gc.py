"""``gtrain gc --provider azure``: every resource group tagged ``gtrain-cluster`` in the subscription whose
cluster no live cluster in state is. Lists by default; with ``delete=True`` deletes each group whole (what is
in it goes with it), polled to the end like ``gtrain down``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gtrain.errors import GtrainError
from gtrain.providers.azure import api
from gtrain.providers.base import GCResult, Orphan

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.azure.resources import AzureResources

__all__ = ["sweep"]


def sweep(parts: AzureResources, live_ids: set[str], delete: bool, regions: list[str] | None,
          report: Reporter) -> GCResult:
    res = GCResult(list(regions) if regions else [f"subscription {parts.arm.subscription}"])
    for g in parts.tagged_groups(None):
        cid, loc = str(g["tags"][api.TAG_CLUSTER]), str(g.get("location") or "")
        if regions and loc not in regions:
            continue
        if cid not in live_ids:
            res.orphans.append(Orphan(loc, cid, "resource-group", str(g["name"])))
    if res.orphans:
        report.info(f"{len(res.orphans)} orphaned resource group(s) of {len(res.clusters)} cluster(s)")
    if not delete or not res.orphans:
        return res
    for o in res.orphans:
        report.info(f"deleting resource group {o.id} (cluster {o.cluster_id})")
        try:
            parts.delete_group(o.id)
        except GtrainError as e:
            res.warnings.append(f"{o.id}: {e.message}")
    res.left = [f"resource group {g['name']}" for g in parts.tagged_groups(None)
                if str(g["tags"][api.TAG_CLUSTER]) in {o.cluster_id for o in res.orphans}]
    res.deleted = True
    return res
