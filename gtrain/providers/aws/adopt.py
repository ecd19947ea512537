"""``gtrain attach NAME --provider aws``: a cluster's record rebuilt from its resources' tags (``gtrain:cluster``,
``gtrain:cluster-name``, ``gtrain:rank``), on a machine that never ran its ``up``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gtrain.errors import ConfigError
from gtrain.providers.aws import api
from gtrain.providers.aws.api import LIVE_STATES, TAG_CLUSTER, TAG_CLUSTER_NAME, TAG_RANK
from gtrain.providers.aws.network import Region
from gtrain.providers.aws.options import aws_options

if TYPE_CHECKING:
    from gtrain.providers.aws.api import EC2Clients
    from gtrain.providers.aws.instances import AWSInstances
    from gtrain.providers.aws.teardown import AWSTeardown
    from gtrain.providers.base import Plan
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster


class AdoptHost(Protocol):
    """What attach uses of the provider (:class:`~gtrain.providers.aws.provider.AWSProvider` is one): its EC2
    clients, ledger, instances and teardown parts."""

    clients: EC2Clients
    ledger: Ledger
    instances: AWSInstances
    teardown: AWSTeardown


def find_by_name(p: AdoptHost, spec: ClusterSpec, regions: list[str]) -> tuple[str, str] | None:
    """(cluster id, region) of the live instances tagged ``gtrain:cluster-name`` = the spec's name."""
    opts = aws_options(spec.aws)
    found: dict[str, str] = {}
    for region in regions:
        ec2 = p.clients.ec2(region, opts.profile)
        with api.call(f"{region}: describe_instances"):
            for page in ec2.get_paginator("describe_instances").paginate(Filters=[
                    {"Name": f"tag:{TAG_CLUSTER_NAME}", "Values": [spec.name]},
                    {"Name": "instance-state-name", "Values": LIVE_STATES}]):
                for r in page["Reservations"]:
                    for inst in r["Instances"]:
                        cid = api.tagdict(inst).get(TAG_CLUSTER)
                        if cid:
                            found.setdefault(cid, region)
    if len(found) > 1:
        raise ConfigError(f"more than one cluster named {spec.name!r} runs: {sorted(found)}", field="NAME",
                          hint="`gtrain gc --provider aws` lists them by id; `gtrain down` the one you know")
    return next(iter(found.items()), None)


def adopt(p: AdoptHost, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str) -> None:
    """Record the cluster's tagged resources and its nodes (by ``gtrain:rank``), then reach them over SSH."""
    from gtrain.catalog import lookup

    opts = aws_options(spec.aws)
    nodes: dict[int, dict[str, Any]] = {}
    for inst in p.clients.find_instances(region, cluster.id, opts.profile):
        rank = api.tagdict(inst).get(TAG_RANK, "")
        if rank.isdigit():
            nodes[int(rank)] = inst
    if sorted(nodes) != list(range(spec.num_nodes)):
        raise ConfigError(f"cluster {cluster.name!r} ({cluster.id}) has node(s) {sorted(nodes)} in {region}, the "
                          f"spec says num_nodes: {spec.num_nodes}", field="num_nodes",
                          hint="attach with the spec the cluster was made from, or `gtrain down` it")
    for kind, ref in p.teardown.list_tagged(region, cluster.id, opts.profile):
        rid = p.ledger.record(cluster, kind, ref, region)
        p.ledger.mark(rid, "created")
    zone = nodes[0]["Placement"]["AvailabilityZone"]
    offer = lookup("aws", nodes[0]["InstanceType"], region)
    od, spot = (offer[0].price_ondemand, offer[0].price_spot) if offer else (plan.price_per_hour, plan.price_per_hour)
    reg = Region(region, key_name=api.resource_name(cluster.id))
    p.instances.record_nodes(spec, cluster, plan, opts, reg, zone, nodes, od, spot)
    if opts.wait_ssh:
        p.instances.wait_ssh(cluster, opts)
