"""``gtrain gc`` for AWS: every resource tagged ``gtrain:cluster`` in the given regions that no live cluster in
state owns — what a lost laptop, a deleted ``$GTRAIN_HOME`` or a killed ``up`` leaves behind. Lists by
default; deletes (instances first, then placement groups, security groups, key pairs, volumes) with
``delete=True``, through the same teardown as ``gtrain down`` (:class:`~.teardown.AWSTeardown`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gtrain.providers.base import GCResult, Orphan

__all__ = ["default_regions", "sweep"]

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.aws.teardown import AWSTeardown
    from gtrain.state import StateStore


def default_regions(store: StateStore) -> list[str]:
    """The catalog's AWS regions, plus any region a cluster in state ever used."""
    from gtrain.catalog import regions

    out = list(regions("aws"))
    for c in store.list_clusters(include_terminated=True):
        if c.provider == "aws" and c.region and c.region not in out:
            out.append(c.region)
    return out


def sweep(teardown: AWSTeardown, regions: list[str], live_cluster_ids: set[str], delete: bool,
          profile: str | None, report: Reporter) -> GCResult:
    res = GCResult(list(regions))

    def unlistable(kind: str, why: str) -> None:
        msg = f"cannot list {kind}s here ({why[:160]}); they are not checked"
        if msg not in res.warnings:
            res.warnings.append(msg)
            report.warn(msg)

    for region in regions:
        for kind_cluster, rid in teardown.list_tagged(region, None, profile, on_unlistable=unlistable):
            kind, _, cid = kind_cluster.partition(":")
            if cid not in live_cluster_ids:
                res.orphans.append(Orphan(region, cid, kind, rid))
    if res.orphans:
        report.info(f"{len(res.orphans)} orphaned resource(s) of {len(res.clusters)} cluster(s)")
    if not delete or not res.orphans:
        return res
    for region, cid in sorted({(o.region, o.cluster_id) for o in res.orphans}):
        report.info(f"{region}: deleting what cluster {cid} left")
        res.left += teardown.teardown(region, cid, profile)
    res.deleted = True
    return res
