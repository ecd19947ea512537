"""``Provider.replace_nodes`` on GCP, against the session's fake Compute Engine: the one instance of the rank
is deleted and made again under its deterministic name (a new instance: another id), the ledger records both,
the other node is untouched, and the old machine's cost interval ends where the new one's begins."""

from __future__ import annotations

import pytest

from gtrain.context import Context
from gtrain.errors import ConfigError
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.runs import cluster as core
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_gce import FakeGCE


def test_gcp_replaces_one_node_and_bills_each_machine_its_own_time(fake_gce: FakeGCE) -> None:
    ctx = Context(store=StateStore())
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report)
    s = parse_spec({"name": "gcp-rb", "provider": "gcp", "num_nodes": 2,
                    "resources": {"accelerators": "T4:1", "region": "us-central1", "disk_gb": 100},
                    "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    c = core.up(s, ctx).cluster
    assert c is not None
    provider = ctx.provider("gcp")
    assert provider.can_replace_nodes
    ids = {k[1]: v["id"] for k, v in fake_gce.instances.items()}
    try:
        with pytest.raises(ConfigError, match="has no node 5"):
            provider.replace_nodes(c, [5])
        provider.replace_nodes(c, [1])
        now = {k[1]: v["id"] for k, v in fake_gce.instances.items()}
        assert set(now) == set(ids) == {f"{c.id}-0", f"{c.id}-1"}
        assert now[f"{c.id}-0"] == ids[f"{c.id}-0"] and now[f"{c.id}-1"] != ids[f"{c.id}-1"]
        assert [(n.rank, n.status) for n in ctx.store.node_records(c.id)] == [(0, "up"), (1, "up")]
        rows = [(r.ref, r.status) for r in ctx.store.resources(c.id) if r.kind == "instance"]
        assert sorted(st for ref, st in rows if ref.endswith(f"{c.id}-1")) == ["created", "deleted"]
        iv = ctx.store.intervals(c.id)
        assert [(i.node_rank, i.stopped_at is None) for i in iv] == [(0, True), (1, False), (1, True)]
        old, new = iv[1], iv[2]
        assert old.stopped_at is not None and old.stopped_at <= new.started_at
    finally:
        core.down("gcp-rb", ctx)
    assert fake_gce.of_cluster(c.id)["instance"] == []
