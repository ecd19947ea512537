"""``gtrain attach NAME --provider gcp``: a cluster's record rebuilt from its instances' labels
(``gtrain-cluster``, ``gtrain-cluster-name``, ``gtrain-rank``), on a machine that never ran its ``up``."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any, Protocol

from gtrain.errors import ConfigError
from gtrain.providers.gcp import api
from gtrain.providers.gcp.api import LABEL_CLUSTER, LABEL_CLUSTER_NAME, LABEL_RANK
from gtrain.providers.gcp.options import gcp_options

if TYPE_CHECKING:
    from gtrain.providers.base import Plan
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.gcp.instances import GCPInstances
    from gtrain.providers.gcp.options import GCPOptions
    from gtrain.providers.gcp.teardown import GCPTeardown
    from gtrain.providers.gcp.zones import GCPZones
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, StateStore


class AdoptHost(Protocol):
    """What attach uses of the provider (:class:`~gtrain.providers.gcp.provider.GCPProvider` is one): its state
    store, ledger, zones, instances and teardown parts, and the project its options name."""

    store: StateStore
    ledger: Ledger
    zones: GCPZones
    instances: GCPInstances
    teardown: GCPTeardown

    def project(self, opts: GCPOptions) -> str: ...


def find_by_name(p: AdoptHost, spec: ClusterSpec, zones: list[str]) -> tuple[str, str | None] | None:
    """(cluster id, zone) of the instances labelled ``gtrain-cluster-name`` = the spec's name (``zones``: only
    those; default every zone of the project)."""
    project = p.project(gcp_options(spec.gcp))
    want = api.label_value(spec.name)
    found: dict[str, str] = {}
    for inst in p.teardown.find_instances(project, None):
        zone = api.zone_of(inst.zone)
        if inst.labels.get(LABEL_CLUSTER_NAME) == want and (not zones or zone in zones):
            found.setdefault(inst.labels[LABEL_CLUSTER], zone)
    if len(found) > 1:
        raise ConfigError(f"more than one cluster named {spec.name!r} runs: {sorted(found)}", field="NAME",
                          hint="`gtrain gc --provider gcp` lists them by id; `gtrain down` the one you know")
    return next(iter(found.items()), None)


def adopt(p: AdoptHost, spec: ClusterSpec, cluster: Cluster, plan: Plan, zone: str | None) -> None:
    opts = gcp_options(spec.gcp)
    project = p.project(opts)
    nodes: dict[int, Any] = {}
    for inst in p.teardown.find_instances(project, cluster.id):
        rank = inst.labels.get(LABEL_RANK, "")
        if rank.isdigit() and (zone is None or api.zone_of(inst.zone) == zone):
            nodes[int(rank)] = inst
    if sorted(nodes) != list(range(spec.num_nodes)):
        raise ConfigError(f"cluster {cluster.name!r} ({cluster.id}) has node(s) {sorted(nodes)}, the spec says "
                          f"num_nodes: {spec.num_nodes}", field="num_nodes",
                          hint="attach with the spec the cluster was made from, or `gtrain down` it")
    zone = api.zone_of(nodes[0].zone)
    offer = p.zones.regional_offer(p.zones.offer(spec, api.region_of_zone(zone)), api.region_of_zone(zone))
    if offer is None:
        raise ConfigError(f"{nodes[0].machine_type}: not in the catalog for {zone}", field="resources")
    for inst in nodes.values():
        rid = p.ledger.record(cluster, "instance", inst.name, zone)
        p.ledger.mark(rid, "created")
    p.instances.record_nodes(spec, cluster, plan, opts, project, zone, nodes, offer)
    for rec in p.store.node_records(cluster.id):  # billed from the instance's creation, not from now
        made = str(getattr(nodes[rec.rank], "creation_timestamp", "") or "")
        if made:
            launched = dt.datetime.fromisoformat(made.replace("Z", "+00:00")).timestamp()
            p.ledger.put_node(cluster.id, dataclasses.replace(rec, launched_at=launched))
    if opts.wait_ssh:
        p.instances.wait_ssh(cluster, opts, project)
