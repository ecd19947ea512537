"""``gtrain gc`` for AWS: every resource tagged ``gtrain:cluster`` in the given regions that no live cluster in
state owns — what a lost laptop, a deleted ``$GTRAIN_HOME`` or a killed ``up`` leaves behind. Lists by
default; deletes (instances first, then placement groups, security groups, key pairs, volumes) with
``delete=True``, through the same teardown as ``gtrain down``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.events import SILENT, Reporter
from gtrain.providers.common import GCResult, Orphan
from gtrain.providers.common import live_cluster_ids as _live

__all__ = ["GCResult", "Orphan", "default_regions", "gc", "live_cluster_ids"]

if TYPE_CHECKING:
    from gtrain.state import StateStore


def live_cluster_ids(store: StateStore) -> set[str]:
    """Ids of the aws clusters state still owns (anything not terminated)."""
    return _live(store, "aws")


def default_regions(store: StateStore) -> list[str]:
    """The catalog's AWS regions, plus any region a cluster in state ever used."""
    from gtrain.catalog import regions

    out = list(regions("aws"))
    for c in store.list_clusters(include_terminated=True):
        if c.provider == "aws" and c.region and c.region not in out:
            out.append(c.region)
    return out


def gc(regions: list[str], live_cluster_ids: set[str], delete: bool, *, store: StateStore,
       report: Reporter = SILENT, session: Any = None, profile: str | None = None) -> GCResult:
    from gtrain.providers.aws.provider import AWSProvider

    provider = AWSProvider(store, report, session=session)
    res = GCResult(list(regions))

    def unlistable(kind: str, why: str) -> None:
        msg = f"cannot list {kind}s here ({why[:160]}); they are not checked"
        if msg not in res.warnings:
            res.warnings.append(msg)
            report.warn(msg)

    for region in regions:
        for kind_cluster, rid in provider.list_tagged(region, None, profile, on_unlistable=unlistable):
            kind, _, cid = kind_cluster.partition(":")
            if cid not in live_cluster_ids:
                res.orphans.append(Orphan(region, cid, kind, rid))
    if res.orphans:
        report.info(f"{len(res.orphans)} orphaned resource(s) of {len(res.clusters)} cluster(s)")
    if not delete or not res.orphans:
        return res
    for region, cid in sorted({(o.region, o.cluster_id) for o in res.orphans}):
        report.info(f"{region}: deleting what cluster {cid} left")
        res.left += provider.teardown(region, cid, profile)
    res.deleted = True
    return res
