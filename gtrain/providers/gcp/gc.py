"""``gtrain gc --provider gcp``: every instance labelled ``gtrain-cluster`` and every ``gtrain-<id>-ssh|-int``
firewall rule in the project that no live cluster in state owns. Lists by default; deletes (instances first,
then firewall rules) with ``delete=True``, through the same teardown as ``gtrain down``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.events import SILENT, Reporter
from gtrain.providers.common import GCResult, Orphan, live_cluster_ids

if TYPE_CHECKING:
    from gtrain.state import StateStore

__all__ = ["gc", "live_cluster_ids"]


def gc(project: str | None, live_ids: set[str], delete: bool, *, store: StateStore, report: Reporter = SILENT,
       regions: list[str] | None = None, clients: Any = None) -> GCResult:
    """Sweep one project (``None``: the environment's). ``regions`` limits the instances looked at to zones of
    those regions (firewall rules are global and always looked at)."""
    from gtrain.providers.gcp import api
    from gtrain.providers.gcp.provider import GCPProvider, gcp_options

    provider = GCPProvider(store, report, clients=clients)
    proj = provider.project(gcp_options({"project": project} if project else {}))
    res = GCResult([proj] + [f"{r}-*" for r in regions or []])
    for kind_cluster, ref in provider.list_owned(proj, None):
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
        report.info(f"{proj}: deleting what cluster {cid} left")
        known = [(o.region, o.id) for o in res.orphans if o.cluster_id == cid and o.kind == "instance"]
        res.left += provider.teardown(proj, cid, known=known)
    res.deleted = True
    return res
