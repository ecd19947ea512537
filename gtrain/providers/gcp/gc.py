"""``gtrain gc --provider gcp``: every instance labelled ``gtrain-cluster`` and every ``gtrain-<id>-ssh|-int``
firewall rule in the project that no live cluster in state owns. Lists by default; deletes (instances first,
then firewall rules) with ``delete=True``, through the same teardown as ``gtrain down``
(:class:`~.teardown.GCPTeardown`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gtrain.providers.base import GCResult, Orphan
from gtrain.providers.gcp import api

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.gcp.teardown import GCPTeardown

__all__ = ["sweep"]


def sweep(teardown: GCPTeardown, project: str, live_ids: set[str], delete: bool, regions: list[str] | None,
          report: Reporter) -> GCResult:
    """Sweep one project. ``regions`` limits the instances looked at to zones of those regions (firewall rules
    are global and always looked at)."""
    res = GCResult([project] + [f"{r}-*" for r in regions or []])
    for kind_cluster, ref in teardown.list_owned(project, None):
        kind, _, cid = kind_cluster.partition(":")
        where = ref.split("/", 1)[0] if kind == "instance" else "global"
        if regions and kind == "instance" and api.region_of_zone(where) not in regions:
            continue
        if cid not in live_ids:
            res.orphans.append(Orphan(where, cid, kind, ref.rsplit("/", 1)[-1]))
    if res.orphans:
        report.info(f"{len(res.orphans)} orphaned resource(s) of {len(res.clusters)} cluster(s)")
    if not delete or not res.orphans:
        return res
    for cid in res.clusters:
        report.info(f"{project}: deleting what cluster {cid} left")
        known = [(o.region, o.id) for o in res.orphans if o.cluster_id == cid and o.kind == "instance"]
        res.left += teardown.teardown(project, cid, known=known)
    res.deleted = True
    return res
