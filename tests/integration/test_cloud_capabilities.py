"""The capabilities of the VM clouds, asked of the provider (not of its name): ``confirms_cost``, ``gc_scope``,
``gc()`` and ``ended_at()``, against the session's moto server and fake GCE."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from gtrain.providers import get_provider, provider_class
from gtrain.providers.aws import AWSProvider
from gtrain.providers.gcp import GCPProvider
from gtrain.runs import cluster as core
from gtrain.runs.cluster import Context
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_gce import FakeGCE

LIFE_S = int(0.5 * 3600)  # policies.max_hours 0.5


def test_capabilities_are_on_the_class() -> None:
    assert provider_class("aws").confirms_cost and provider_class("aws").gc_scope == "region"
    assert provider_class("gcp").confirms_cost and provider_class("gcp").gc_scope == "zone"
    for free in ("local", "ssh"):
        assert not provider_class(free).confirms_cost and provider_class(free).gc_scope is None


def test_gc_refuses_a_provider_without_gc_scope(gtrain_home: Path) -> None:
    env = {**os.environ, "GTRAIN_HOME": str(gtrain_home), "NO_COLOR": "1"}
    res = subprocess.run([sys.executable, "-m", "gtrain", "gc", "--provider", "ssh"], capture_output=True,
                         text=True, env=env, timeout=120, check=False)
    assert res.returncode == 2, res.stderr
    assert "--provider ssh: gc knows aws and azure and gcp" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.usefixtures("moto_server")
def test_aws_gc_and_ended_at() -> None:
    ctx = Context(store=StateStore())
    provider = AWSProvider(ctx.store, ctx.report)
    ctx._providers["aws"] = provider
    s = parse_spec({"name": "caps-aws", "provider": "aws", "num_nodes": 2,
                    "resources": {"accelerators": "A10G:1", "region": "us-east-1"}, "policies": {"max_hours": 0.5},
                    "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.2}})
    c = core.up(s, ctx).cluster
    assert c is not None
    try:
        assert provider.ended_at(c) == {}  # both still run
        # a live cluster is no orphan; the same call through the registry, as `gtrain gc` makes it
        swept = get_provider("aws", ctx.store).gc(["us-east-1"], {c.id}, False)
        assert c.id not in swept.clusters and swept.regions == ["us-east-1"]
        assert c.id in get_provider("aws", ctx.store).gc(["us-east-1"], set(), False).clusters
        # node 1 ends itself at its time limit (shutdown from inside = terminate)
        node1 = next(n for n in ctx.store.node_records(c.id) if n.rank == 1)
        boto3.client("ec2", region_name="us-east-1").terminate_instances(InstanceIds=[node1.instance_id])
        starts = {i.node_rank: i.started_at for i in ctx.store.intervals(c.id)}
        assert provider.ended_at(c) == {1: starts[1] + LIFE_S + 60}
    finally:
        core.down(s.name, ctx)


@pytest.mark.usefixtures("fake_gce")
def test_gcp_gc_and_ended_at(fake_gce: FakeGCE) -> None:
    ctx = Context(store=StateStore())
    provider = GCPProvider(ctx.store, ctx.report)
    ctx._providers["gcp"] = provider
    s = parse_spec({"name": "caps-gcp", "provider": "gcp", "num_nodes": 2,
                    "resources": {"accelerators": "T4:1", "region": "us-central1", "use_spot": True},
                    "policies": {"max_hours": 0.5},
                    "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    c = core.up(s, ctx).cluster
    assert c is not None
    try:
        assert provider.ended_at(c) == {}
        swept = get_provider("gcp", ctx.store).gc(["us-central1"], set(), False)
        assert c.id in swept.clusters and swept.regions[-1] == "us-central1-*"
        assert c.id not in get_provider("gcp", ctx.store).gc(None, {c.id}, False).clusters
        fake_gce.preempt(f"{c.id}-0")
        starts = {i.node_rank: i.started_at for i in ctx.store.intervals(c.id)}
        assert provider.ended_at(c) == {0: starts[0] + LIFE_S + 60}
    finally:
        core.down(s.name, ctx)
