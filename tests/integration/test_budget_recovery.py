"""policies.max_hours / max_cost_usd hold for the whole run, not per replacement node: a node made for a
cluster that has run a while gets what is left of its slot (GCE's maxRunDuration on the fake Compute Engine,
the EC2 shutdown in UserData on moto), and a spent budget makes no node and keeps the old one."""

from __future__ import annotations

import base64
import re
import time
from typing import Any

import boto3
import pytest

from gtrain.context import Context
from gtrain.providers.aws import AWSProvider
from gtrain.providers.cloud.lifetime import BudgetSpent, node_lifetime_s
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.runs import cluster as core
from gtrain.spec import Policies, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_gce import FakeGCE


def test_a_nodes_lifetime_is_what_is_left_of_the_runs_budget() -> None:
    from gtrain.state import Cluster

    now = 1_000_000.0
    c = Cluster("c1", "b", "aws", "up", 2, {}, None, None, None, 2.0, now, None)
    hours = Policies(max_hours=2)
    assert node_lifetime_s(hours, 2, 2.0, c, now=now) == 7200  # a first node: the whole lifetime
    assert node_lifetime_s(hours, 2, 2.0, c, now=now + 300) == 7200  # still the first `up`
    assert node_lifetime_s(hours, 2, 2.0, c, now=now + 5400) == 1800  # 90 min in: 30 min left
    cost = Policies(max_cost_usd=10)  # $10 over 2 nodes at $2/h: 2.5 h a slot
    assert node_lifetime_s(cost, 2, 2.0, c, now=now + 7200) == 1800
    with pytest.raises(BudgetSpent, match="budget is spent"):
        node_lifetime_s(cost, 2, 2.0, c, now=now + 9000 - 30)
    assert node_lifetime_s(Policies(), 2, 2.0, c, now=now + 10**6) is None  # no limits: none


def test_gcp_replacement_gets_what_is_left_and_none_once_spent(fake_gce: FakeGCE) -> None:
    ctx = Context(store=StateStore())
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report)
    s = parse_spec({"name": "gcp-budget", "provider": "gcp", "num_nodes": 2, "policies": {"max_hours": 2},
                    "resources": {"accelerators": "T4:1", "region": "us-central1", "disk_gb": 100},
                    "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    c = core.up(s, ctx).cluster
    assert c is not None
    provider = ctx.provider("gcp")

    def max_run(rank: int) -> int:
        return int(fake_gce.instances[next(k for k in fake_gce.instances if k[1] == f"{c.id}-{rank}")]
                   ["scheduling"]["maxRunDuration"]["seconds"])

    try:
        assert max_run(0) == max_run(1) == 7200
        ctx.store.update_cluster(c.id, created_at=time.time() - 5400)  # the run is 90 minutes in
        c = ctx.store.find_cluster("gcp-budget")
        assert c is not None
        provider.replace_nodes(c, [1])
        assert 1700 <= max_run(1) <= 1800 and max_run(0) == 7200
        ctx.store.update_cluster(c.id, created_at=time.time() - 7200 + 30)  # less than a minute left
        c = ctx.store.find_cluster("gcp-budget")
        assert c is not None
        before = {k: v["id"] for k, v in fake_gce.instances.items()}
        with pytest.raises(BudgetSpent):
            provider.replace_nodes(c, [0])
        assert {k: v["id"] for k, v in fake_gce.instances.items()} == before  # the old node is kept
    finally:
        core.down("gcp-budget", ctx)


@pytest.mark.usefixtures("moto_server")
def test_aws_replacement_ends_itself_when_its_slot_would_have() -> None:
    session = boto3.Session()
    sent: list[dict[str, Any]] = []
    session.events.register("before-parameter-build.ec2.RunInstances", lambda params, **_: sent.append(dict(params)))
    ctx = Context(store=StateStore())
    ctx._providers["aws"] = AWSProvider(ctx.store, ctx.report, session=session)
    s = parse_spec({"name": "aws-budget", "provider": "aws", "num_nodes": 2, "policies": {"max_hours": 2},
                    "resources": {"accelerators": "A10G:1", "region": "us-east-1", "disk_gb": 100},
                    "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.2}})

    def minutes(params: dict[str, Any]) -> int:
        data = str(params["UserData"])
        if "shutdown" not in data:
            data = base64.b64decode(data).decode()
        m = re.search(r"shutdown -h \+(\d+) ", data)
        assert m, data
        return int(m.group(1))

    c = core.up(s, ctx).cluster
    assert c is not None
    try:
        assert [minutes(p) for p in sent] == [120] * len(sent) and sent
        sent.clear()
        ctx.store.update_cluster(c.id, created_at=time.time() - 5400)
        c = ctx.store.find_cluster("aws-budget")
        assert c is not None
        ctx.provider("aws").replace_nodes(c, [1])
        assert sent and [minutes(p) for p in sent] == [30] * len(sent)
    finally:
        core.down("aws-budget", ctx)
