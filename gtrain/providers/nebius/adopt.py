"""``gtrain attach NAME --provider nebius --region PROJECT``: a cluster's record rebuilt from its instances (and its
GPU cluster), on a machine that never ran its ``up``. Each instance is named ``gtrain-<cluster id>-<rank>`` and
labelled ``gtrain-cluster``/``gtrain-rank``, a multi-node cluster's GPU cluster ``gtrain-<cluster id>`` with the
same ``gtrain-cluster`` label (``InstanceService.List`` / ``GpuClusterService.List`` of a project); a cluster id is
``<name>-<8 hex>``, so the name finds it. ``--region`` is the project id (default the spec's
``nebius.project_id``). The price is frozen as at ``up``: Nebius's calculator quote for the instance's own
platform and preset, else gtrain's table; each node is billed from the instance's ``metadata.created_at``.

The instances hold the cluster's key only (in their cloud-init): the second machine reaches them with the same
private key, ``GTRAIN_SSH_KEY`` on both (gtrain.providers.cloud.keys.team_key).

API reference: https://docs.nebius.com/api (compute/v1 InstanceService.List, GpuClusterService.List),
https://github.com/nebius/api (compute/v1/instance.proto, gpu_cluster.proto)
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Protocol

from gtrain.errors import ConfigError
from gtrain.providers.cloud.billing import freeze_price
from gtrain.providers.cloud.keys import key_path, public_key
from gtrain.providers.cloud.ssh_access import wait_ssh
from gtrain.providers.nebius.options import nebius_options
from gtrain.providers.nebius.teardown import owner_of

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.base import Plan
    from gtrain.providers.cloud.billing import FrozenPrice
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.nebius import gpus as ng
    from gtrain.providers.nebius.options import NebiusOptions
    from gtrain.providers.nebius.teardown import NebiusTeardown
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, StateStore


class AdoptHost(Protocol):
    """What attach uses of the provider (:class:`~gtrain.providers.nebius.provider.NebiusProvider` is one)."""

    store: StateStore
    ledger: Ledger
    report: Reporter
    max_workers: int
    teardown: NebiusTeardown

    def _choose(self, spec: ClusterSpec, opts: NebiusOptions) -> tuple[ng.Platform, str]: ...

    def _price(self, spec: ClusterSpec, cluster: Cluster, opts: NebiusOptions, plat: ng.Platform, preset: str,
               pub: str, group: str | None) -> FrozenPrice: ...

    def _record(self, cluster: Cluster, plan: Plan, opts: NebiusOptions, insts: dict[int, dict[str, Any]],
                price: FrozenPrice) -> None: ...


def find_by_name(p: AdoptHost, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
    """(cluster id, project) of the instances labelled for a cluster named ``spec.name`` (``regions``: those
    projects; default the spec's)."""
    opts = nebius_options(spec.section("nebius"))
    want = re.compile(rf"^{re.escape(spec.name)}-[0-9a-f]{{8}}$")
    found: dict[str, str | None] = {}
    for project in regions or [opts.project_id]:
        for inst in p.teardown.instances(project, None):
            own = owner_of(inst)
            if own and want.match(own[0]):
                found.setdefault(own[0], project)
    if len(found) > 1:
        raise ConfigError(f"more than one cluster named {spec.name!r} runs: {sorted(found)}", field="NAME",
                          hint="`gtrain gc --provider nebius` lists them by id; `gtrain down` the one you know")
    return next(iter(found.items()), None)


def adopt(p: AdoptHost, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
    opts = nebius_options(spec.section("nebius"))
    if region and region != opts.project_id:
        raise ConfigError(f"--region {region}: the spec says nebius.project_id: {opts.project_id}",
                          field="--region", hint=f"set nebius.project_id: {region} in the spec (the cluster's project)")
    nodes: dict[int, dict[str, Any]] = {}
    for inst in p.teardown.instances(opts.project_id, cluster.id):
        own = owner_of(inst)
        if own is not None:
            nodes[own[1]] = inst
    if sorted(nodes) != list(range(spec.num_nodes)):
        raise ConfigError(f"cluster {cluster.name!r} ({cluster.id}) has instance(s) of rank {sorted(nodes)}, the "
                          f"spec says num_nodes: {spec.num_nodes}", field="num_nodes",
                          hint="attach with the spec the cluster was made from, or `gtrain down` it")
    idle = [f"{i.get('id')} ({i.get('state')})" for i in nodes.values() if i.get("state") != "RUNNING"]
    if idle:
        raise ConfigError(f"cluster {cluster.name!r}: instance(s) not running: {', '.join(idle)}", field="NAME",
                          hint="attach again once Nebius lists them RUNNING; `gtrain gc --provider nebius --region "
                               f"{opts.project_id} --yes` deletes what cluster {cluster.id} left")
    plat, preset = p._choose(spec, opts)
    have = {(i.get("platform"), i.get("preset")) for i in nodes.values()}
    if have != {(plat.id, preset)}:
        raise ConfigError(f"cluster {cluster.name!r} runs {sorted(f'{a}/{b}' for a, b in have)}, the spec "
                          f"resolves to {plat.id}/{preset}", field="resources",
                          hint="attach with the spec the cluster was made from")
    key = key_path(cluster.id)
    if not key.exists():
        raise ConfigError(f"GTRAIN_SSH_KEY: no key file for cluster {cluster.id} here ({key}); its instances hold "
                          "the cluster's key only", field="GTRAIN_SSH_KEY",
                          hint="set GTRAIN_SSH_KEY to the key file `up` used (the same file on both machines)")
    groups = p.teardown.groups(opts.project_id, cluster.id) if spec.num_nodes > 1 else []
    for g in groups:
        rid = p.ledger.record(cluster, "gpu-cluster", str(g.get("name")), opts.project_id)
        p.ledger.mark(rid, "created", ref=str(g["id"]))
    for inst in nodes.values():
        rid = p.ledger.record(cluster, "instance", str(inst.get("name")), opts.project_id,
                              meta={"name": inst.get("name")})
        p.ledger.mark(rid, "created", ref=str(inst["id"]), meta={"name": inst.get("name")})
    price = p._price(spec, cluster, opts, plat, preset, public_key(key), str(groups[0]["id"]) if groups else None)
    freeze_price(p.store, cluster, plan, price, p.report)
    p._record(cluster, plan, opts, nodes, price)
    for rec in p.store.node_records(cluster.id):  # billed from the instance's creation, not from now
        made = nodes[rec.rank].get("created_at")
        if isinstance(made, int | float) and made > 0:
            p.ledger.put_node(cluster.id, dataclasses.replace(rec, launched_at=float(made)))
    if opts.wait_ssh:
        wait_ssh(cluster, p.ledger, p.report, host_keys=lambda node: [], host_key_wait_s=0,
                 ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=p.max_workers,
                 key_source="Nebius (it publishes none)",
                 hint="the instances hold the cluster's key only: set GTRAIN_SSH_KEY to the key file `up` used")
