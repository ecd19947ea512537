"""``gtrain attach NAME --provider vast``: a cluster's record rebuilt from its instance, on a machine that never ran
its ``up``. A gtrain instance is labelled ``gtrain-<cluster id>-<rank>`` and carries ``GTRAIN_CLUSTER_ID`` in its
env (``label`` and ``extra_env`` of ``GET /api/v0/instances/``); a cluster id is ``<name>-<8 hex>``, so the name
finds it. Its rate is the instance's own billed ``dph_total``, frozen as at ``up``; its start, ``start_date``.

Vast.ai holds the cluster's key only (attached to the instance, ``POST /api/v0/instances/{id}/ssh/``): the second
machine reaches it with the same private key, ``GTRAIN_SSH_KEY`` on both (gtrain.providers.cloud.keys.team_key).

API reference: https://docs.vast.ai/api-reference/instances/show-instances, https://docs.vast.ai/api-reference
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Protocol

from gtrain.errors import ConfigError
from gtrain.providers.cloud.keys import key_path
from gtrain.providers.cloud.ssh_access import wait_ssh
from gtrain.providers.vast.options import vast_options
from gtrain.providers.vast.teardown import country, owner

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.base import Plan
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.providers.vast import offers as vo
    from gtrain.providers.vast.options import VastOptions
    from gtrain.providers.vast.teardown import VastTeardown
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, StateStore


class AdoptHost(Protocol):
    """What attach uses of the provider (:class:`~gtrain.providers.vast.provider.VastProvider` is one)."""

    store: StateStore
    ledger: Ledger
    report: Reporter
    max_workers: int
    teardown: VastTeardown

    def _refuse(self, spec: ClusterSpec, opts: VastOptions) -> None: ...

    def _record(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: VastOptions, inst: dict[str, Any],
                pick: vo.Pick | None) -> None: ...


def find_by_name(p: AdoptHost, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
    """(cluster id, country) of the instance tagged for a cluster named ``spec.name`` (``regions``: those
    countries only)."""
    want = re.compile(rf"^{re.escape(spec.name)}-[0-9a-f]{{8}}$")
    found: dict[str, str | None] = {}
    for inst in p.teardown.instances(None):
        own = owner(inst)
        where = country(inst)
        if own and want.match(own[0]) and (not regions or where in regions):
            found.setdefault(own[0], where if where != "?" else None)
    if len(found) > 1:
        raise ConfigError(f"more than one cluster named {spec.name!r} runs: {sorted(found)}", field="NAME",
                          hint="`gtrain gc --provider vast` lists them by id; `gtrain down` the one you know")
    return next(iter(found.items()), None)


def adopt(p: AdoptHost, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
    opts = vast_options(spec.section("vast"))
    p._refuse(spec, opts)
    nodes: dict[int, dict[str, Any]] = {}
    for inst in p.teardown.instances(cluster.id):
        own = owner(inst)
        if own is not None:
            nodes[own[1]] = inst
    if sorted(nodes) != list(range(spec.num_nodes)):
        raise ConfigError(f"cluster {cluster.name!r} ({cluster.id}) has instance(s) of rank {sorted(nodes)}, the "
                          f"spec says num_nodes: {spec.num_nodes}", field="num_nodes",
                          hint="attach with the spec the cluster was made from, or `gtrain down` it")
    inst = nodes[0]
    if inst.get("actual_status") != "running":
        raise ConfigError(f"cluster {cluster.name!r}: instance {inst.get('id')} is "
                          f"{inst.get('actual_status') or 'loading'}, not running",
                          field="NAME", hint="attach again once Vast.ai lists it running; `gtrain gc --provider "
                                             f"vast --yes` destroys the instance of cluster {cluster.id}")
    key = key_path(cluster.id)
    if not key.exists():
        raise ConfigError(f"GTRAIN_SSH_KEY: no key file for cluster {cluster.id} here ({key}); its instance hold "
                          "the cluster's key only", field="GTRAIN_SSH_KEY",
                          hint="set GTRAIN_SSH_KEY to the key file `up` used (the same file on both machines)")
    rid = p.ledger.record(cluster, "instance", str(inst.get("label")), country(inst),
                          meta={"label": inst.get("label"), "offer": inst.get("ask_id")})
    p.ledger.mark(rid, "created", ref=str(inst["id"]), meta={"label": inst.get("label"), "offer": inst.get("ask_id")})
    p._record(spec, cluster, plan, opts, inst, None)
    start = inst.get("start_date")
    if isinstance(start, int | float) and not isinstance(start, bool) and start > 0:
        for rec in p.store.node_records(cluster.id):  # billed from the instance's start, not from now
            p.ledger.put_node(cluster.id, dataclasses.replace(rec, launched_at=float(start)))
    if opts.wait_ssh:
        wait_ssh(cluster, p.ledger, p.report, host_keys=lambda node: [], host_key_wait_s=0,
                 ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=p.max_workers,
                 key_source="Vast.ai (it publishes none)",
                 hint="the instance holds the cluster's key only: set GTRAIN_SSH_KEY to the key file `up` used")
