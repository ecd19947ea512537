"""Zone failover per node for an elastic cluster (issue 37): ``num_nodes: {min: 1, max: 2}`` starts on one node;
the growth the watcher runs (gtrain.runs.elastic.grow, the job's part on the new node -- ``join`` -- recorded
instead of started over SSH) finds the cluster's zone refusing the second node for capacity (AWS's
InsufficientInstanceCapacity, GCE's ZONE_RESOURCE_POOL_EXHAUSTED, injected for that zone only) and makes node 1
in another zone of the same region: same VPC (and, on aws, security group; outside the cluster placement group,
which cannot span zones), said in the node's record and in what gtrain reports. ``down`` leaves nothing."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from gtrain.context import Context
from gtrain.events import Reporter
from gtrain.providers.aws import TAG_CLUSTER, AWSProvider
from gtrain.providers.aws.network import AWSNetwork
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.runs import cluster as core
from gtrain.runs import elastic
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_gce import FakeGCE

pytestmark = pytest.mark.usefixtures("gtrain_home")


class Said(Reporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)

    def warn(self, msg: str) -> None:
        self.lines.append(msg)


def _grow(ctx: Context, name: str, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The watcher's growth of the cluster's job: node 1 joins."""
    joined: list[list[int]] = []
    monkeypatch.setattr(elastic, "join", lambda _c, _job, _ctx, nodes: joined.append(list(nodes)))
    c = ctx.store.find_cluster(name)
    assert c is not None
    job = ctx.store.create_job(c.id, f"job-{name}", {"elastic": {"min": 1, "max": 2, "mode": "torchrun"},
                                                     "num_nodes": 1, "nproc_per_node": 1})
    assert elastic.grow(c, job, ctx) == [1]
    info = ctx.store.get_job(job.id).info
    assert "elastic_grow" not in info and [int(x[1]) for x in info["world_sizes"]] == [1, 2]
    ctx.store.update_job(job.id, status="succeeded", exit_code=0)
    monkeypatch.setattr("gtrain.runlog.archive.archive_cluster", lambda _ctx, _cluster: None)
    return joined


# ---------------------------------------------------------------------------------------------------- aws


def _refuse_zone(session: boto3.Session, refused: set[str]) -> list[str]:
    """RunInstances in a zone of ``refused`` answers InsufficientInstanceCapacity (AWS's own answer when the AZ has
    no room); returns the zones asked, in order."""
    seen: list[str] = []

    def hook(params: dict[str, Any], model: Any, **_: Any) -> Any:
        body = params.get("body") or {}
        zone = body.get("Placement.AvailabilityZone", "") if isinstance(body, dict) else ""
        group = body.pop("Placement.GroupName", None) if isinstance(body, dict) else None
        seen.append(f"{zone} {group}" if group else zone)  # the group: moto here holds none (see below)
        if zone not in refused:
            return None
        http = AWSResponse(params.get("url", ""), 500, {}, None)
        return http, {"Error": {"Code": "InsufficientInstanceCapacity",
                                "Message": f"We currently do not have sufficient g5.xlarge capacity in {zone}"},
                      "ResponseMetadata": {"HTTPStatusCode": 500}}

    session.events.register("before-call.ec2.RunInstances", hook)
    return seen


def _aws(monkeypatch: pytest.MonkeyPatch, name: str, **aws: Any
         ) -> tuple[Context, Said, ClusterSpec, set[str], list[str]]:
    session = boto3.Session()
    refused: set[str] = set()
    seen = _refuse_zone(session, refused)
    said = Said()
    ctx = Context(store=StateStore(), report=said)
    ctx._providers["aws"] = AWSProvider(ctx.store, ctx.report, session=session)

    def pg(_net: Any, _ec2: Any, cluster: Any, reg: Any, *_: Any) -> None:  # moto cannot make one: as if it had
        reg.pg_name = f"gtrain-{cluster.id}"
    monkeypatch.setattr(AWSNetwork, "_ensure_pg", pg)
    spec = parse_spec({"name": name, "provider": "aws", "num_nodes": {"min": 1, "max": 2},
                       "resources": {"accelerators": "A10G:1", "region": "us-east-1", "disk_gb": 100},
                       "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05, **aws}})
    return ctx, said, spec, refused, seen


def _aws_left(ctx: Context, cid: str) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    live = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]},
                                           {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert not [i for r in live["Reservations"] for i in r["Instances"]]
    assert not ec2.describe_security_groups(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]}])[
        "SecurityGroups"]
    assert all(r.status in ("deleted", "not-created") for r in ctx.store.resources(cid))


@pytest.mark.usefixtures("moto_server")
def test_aws_growth_goes_to_another_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, said, spec, refused, seen = _aws(monkeypatch, "el-aws-az")
    c = core.up(spec, ctx).cluster  # moto makes MinCount: one node, in the first zone offering the type
    assert c is not None and c.num_nodes == 1, said.lines
    home = ctx.store.nodes(c.id)[0].zone
    assert home and home.startswith("us-east-1")
    assert ctx.store.node_records(c.id)[0].extra["placement_group"] == f"gtrain-{c.id}"
    refused.add(home)  # the cluster's zone has no room for the second node now
    del seen[:]

    assert _grow(ctx, "el-aws-az", monkeypatch) == [[1]]
    # the cluster's zone in its placement group, then another zone without it
    assert len(seen) == 2 and seen[0] == f"{home} gtrain-{c.id}" and " " not in seen[1], seen
    nodes = {n.rank: n for n in ctx.store.node_records(c.id)}
    other = seen[1]
    assert other != home and other.startswith("us-east-1")
    assert nodes[0].zone == home and nodes[1].zone == other and nodes[1].extra["zone"] == other
    assert nodes[1].extra["region"] == "us-east-1" and nodes[1].extra["placement_group"] is None
    assert nodes[0].extra["placement_group"] == f"gtrain-{c.id}"
    assert "no cluster placement group" in nodes[1].extra["note"]
    assert "note" not in nodes[0].extra
    assert any(f"node(s) 1 in {other}, not {home}" in x and "placement group" in x for x in said.lines), said.lines
    ec2 = boto3.client("ec2", region_name="us-east-1")
    insts = {i["InstanceId"]: i for r in ec2.describe_instances(InstanceIds=[n.instance_id or "" for n in
                                                                             nodes.values()])["Reservations"]
             for i in r["Instances"]}
    i0, i1 = insts[nodes[0].instance_id or ""], insts[nodes[1].instance_id or ""]
    assert i1["Placement"]["AvailabilityZone"] == other and not i1["Placement"].get("GroupName")
    assert i1["VpcId"] == i0["VpcId"]  # same VPC and security group: the torch world reaches it
    assert {g["GroupId"] for g in i1["SecurityGroups"]} == {g["GroupId"] for g in i0["SecurityGroups"]}
    assert ctx.store.get_cluster_by_id(c.id).num_nodes == 2

    core.down("el-aws-az", ctx)
    _aws_left(ctx, c.id)


@pytest.mark.usefixtures("moto_server")
def test_aws_replacement_goes_to_another_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost node 1 (its instance terminated) whose zone now refuses is made again in another zone of the region
    (gtrain.runs.elastic's re-provisioning, what ``replace`` runs), outside the placement group."""
    ctx, said, spec, refused, seen = _aws(monkeypatch, "el-aws-rz")
    monkeypatch.setattr(AWSProvider, "start_nodes", lambda *_a, **_k: None)  # nothing stopped to start
    c = core.up(spec, ctx).cluster  # moto makes MinCount: one node; the growth makes node 1 in the same zone
    assert c is not None and c.num_nodes == 1
    monkeypatch.setattr(elastic, "join", lambda *_a: None)
    job = ctx.store.create_job(c.id, "job-rz", {"elastic": {"min": 1, "max": 2, "mode": "torchrun"},
                                                "num_nodes": 1, "nproc_per_node": 1})
    assert elastic.grow(c, job, ctx) == [1]
    ctx.store.update_job(job.id, status="succeeded", exit_code=0)
    monkeypatch.setattr("gtrain.runlog.archive.archive_cluster", lambda _ctx, _cluster: None)
    nodes = {n.rank: n for n in ctx.store.node_records(c.id)}
    home = nodes[0].zone or ""
    assert nodes[1].zone == home
    ec2 = boto3.client("ec2", region_name="us-east-1")
    ec2.terminate_instances(InstanceIds=[nodes[1].instance_id or ""])  # preempted
    refused.add(home)
    del seen[:]
    elastic._reprovision(ctx.store.get_cluster_by_id(c.id), ctx, {"reprovision": [1], "detected_at": time.time()})
    nodes = {n.rank: n for n in ctx.store.node_records(c.id)}
    assert seen[0] == f"{home} gtrain-{c.id}" and nodes[1].zone == seen[-1] != home, seen
    assert nodes[0].zone == home and nodes[1].extra["placement_group"] is None and "note" in nodes[1].extra
    assert any(f"node(s) 1 in {nodes[1].zone}, not {home}" in x for x in said.lines), said.lines
    core.down("el-aws-rz", ctx)
    _aws_left(ctx, c.id)


@pytest.mark.usefixtures("moto_server")
def test_aws_efa_cluster_stays_in_its_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """EFA's OS-bypass traffic does not leave a subnet (one zone): an EFA cluster's missing node waits for its
    zone instead of landing where the others cannot reach it over EFA."""
    ctx, said, spec, refused, seen = _aws(monkeypatch, "el-aws-efa", efa=True)
    c = core.up(spec, ctx).cluster
    assert c is not None and c.num_nodes == 1, said.lines
    home = ctx.store.nodes(c.id)[0].zone or ""
    refused.add(home)
    del seen[:]
    monkeypatch.setattr(elastic, "join", lambda *_a: None)
    job = ctx.store.create_job(c.id, "job-efa", {"elastic": {"min": 1, "max": 2, "mode": "torchrun"},
                                                 "num_nodes": 1, "nproc_per_node": 1})
    assert elastic.grow(c, job, ctx) == []  # refused in its zone, no other tried: tried again later
    assert seen == [f"{home} gtrain-{c.id}"], seen
    assert "InsufficientInstanceCapacity" in ctx.store.get_job(job.id).info["elastic_grow"]["last_error"]
    assert any("EFA cluster" in x for x in said.lines), said.lines
    ctx.store.update_job(job.id, status="succeeded", exit_code=0)
    monkeypatch.setattr("gtrain.runlog.archive.archive_cluster", lambda _ctx, _cluster: None)
    core.down("el-aws-efa", ctx)
    _aws_left(ctx, c.id)


# ---------------------------------------------------------------------------------------------------- gcp


def test_gcp_growth_goes_to_another_zone(fake_gce: FakeGCE, monkeypatch: pytest.MonkeyPatch) -> None:
    said = Said()
    ctx = Context(store=StateStore(), report=said)
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report, max_workers=1)
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", after=1)  # room for one node in -a
    spec = parse_spec({"name": "el-gcp-az", "provider": "gcp", "num_nodes": {"min": 1, "max": 2},
                       "resources": {"accelerators": "T4:1", "region": "us-central1",
                                     "zones": ["us-central1-a", "us-central1-b"], "disk_gb": 50},
                       "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    c = core.up(spec, ctx).cluster
    assert c is not None and c.num_nodes == 1, said.lines
    assert [n.zone for n in ctx.store.nodes(c.id)] == ["us-central1-a"]

    assert _grow(ctx, "el-gcp-az", monkeypatch) == [[1]]  # -a still refuses: node 1 in -b
    nodes = {n.rank: n for n in ctx.store.node_records(c.id)}
    assert nodes[0].zone == "us-central1-a" and nodes[1].zone == "us-central1-b"
    assert nodes[1].extra["zone"] == "us-central1-b" and "crosses zones" in nodes[1].extra["note"]
    assert "note" not in nodes[0].extra
    assert ("us-central1-b", f"{c.id}-1") in fake_gce.instances and ("us-central1-a", f"{c.id}-0") in fake_gce.instances
    body = next(b for b in fake_gce.inserts if b["name"] == f"{c.id}-1")
    first = next(b for b in fake_gce.inserts if b["name"] == f"{c.id}-0")
    assert body["networkInterfaces"][0].get("network") == first["networkInterfaces"][0].get("network")
    assert any("node(s) 1 in us-central1-b, not us-central1-a" in x for x in said.lines), said.lines
    assert ctx.store.get_cluster_by_id(c.id).num_nodes == 2

    core.down("el-gcp-az", ctx)
    assert fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}


def test_gcp_replacement_goes_to_another_zone(fake_gce: FakeGCE) -> None:
    """A lost node 1 (its instance gone) whose zone now refuses is made again in another zone of the region
    (gtrain.runs.elastic's re-provisioning, what ``replace`` runs); node 0 stays where it is."""
    said = Said()
    ctx = Context(store=StateStore(), report=said)
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report, max_workers=1)
    spec = parse_spec({"name": "el-gcp-rz", "provider": "gcp", "num_nodes": {"min": 1, "max": 2},
                       "resources": {"accelerators": "T4:1", "region": "us-central1",
                                     "zones": ["us-central1-a", "us-central1-b"], "disk_gb": 50},
                       "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    c = core.up(spec, ctx).cluster
    assert c is not None and [n.zone for n in ctx.store.nodes(c.id)] == ["us-central1-a"] * 2
    with fake_gce.lock:
        fake_gce.instances.pop(("us-central1-a", f"{c.id}-1"))  # preempted: GCE deleted it
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a")
    elastic._reprovision(c, ctx, {"reprovision": [1], "detected_at": time.time()})
    nodes = {n.rank: n for n in ctx.store.node_records(c.id)}
    assert nodes[0].zone == "us-central1-a" and nodes[1].zone == "us-central1-b" and "note" in nodes[1].extra
    assert ("us-central1-b", f"{c.id}-1") in fake_gce.instances
    fake_gce.reset_failures()
    core.down("el-gcp-rz", ctx)
    assert fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}
