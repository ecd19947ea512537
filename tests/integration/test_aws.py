"""The AWS provider against the one moto server of the session (real HTTP, boto3 untouched).

Failures are injected at the HTTP edge only: a botocore ``before-call`` hook registered on the boto3 session
the provider is given answers RunInstances with the error AWS would send, before anything goes on the wire.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from gtrain.context import Context
from gtrain.errors import CapacityError, ConfigError, QuotaError
from gtrain.events import Reporter
from gtrain.providers.aws import (
    EBS_GP3_USD_PER_GB_MONTH,
    HOURS_PER_MONTH,
    TAG_CLUSTER,
    AWSProvider,
    host_keys_from_console,
    key_path,
)
from gtrain.runs import cluster as core
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import CostInterval, StateStore

pytestmark = pytest.mark.usefixtures("moto_server")

REGION = "us-east-1"


def spec(name: str, nodes: int = 1, *, resources: dict[str, Any] | None = None, **aws: Any) -> ClusterSpec:
    res = {"accelerators": "A10G:1", "region": REGION, "disk_gb": 100, **(resources or {})}
    return parse_spec({"name": name, "provider": "aws", "num_nodes": nodes, "resources": res,
                       "policies": {"max_hours": 2},
                       "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.2, **aws}})


def context(session: Any = None) -> Context:
    ctx = Context(store=StateStore())
    ctx._providers["aws"] = AWSProvider(ctx.store, ctx.report, session=session)
    return ctx


def ec2(region: str = REGION) -> Any:
    return boto3.client("ec2", region_name=region)


def everything(region: str = REGION) -> dict[str, dict[str, dict[str, str]]]:
    """Every resource moto holds in the region that could cost money or hold a name: kind -> id -> tags."""
    c = ec2(region)
    tags = lambda o: {t["Key"]: t["Value"] for t in o.get("Tags") or []}  # noqa: E731
    out: dict[str, dict[str, dict[str, str]]] = {
        "instance": {i["InstanceId"]: tags(i) for r in c.describe_instances()["Reservations"] for i in r["Instances"]
                     if i["State"]["Name"] != "terminated"},
        "security-group": {g["GroupId"]: tags(g) for g in c.describe_security_groups()["SecurityGroups"]
                           if g["GroupName"] != "default"},
        "key-pair": {k["KeyName"]: tags(k) for k in c.describe_key_pairs()["KeyPairs"]},
        "volume": {v["VolumeId"]: tags(v) for v in c.describe_volumes()["Volumes"]},
        "network-interface": {n["NetworkInterfaceId"]: tags(n)
                              for n in c.describe_network_interfaces()["NetworkInterfaces"]},
    }
    return out


def of_cluster(cid: str, region: str = REGION) -> dict[str, list[str]]:
    return {k: sorted(i for i, t in v.items() if t.get(TAG_CLUSTER) == cid) for k, v in everything(region).items()}


def assert_clean(before: dict[str, dict[str, dict[str, str]]], cid: str, region: str = REGION) -> None:
    now = everything(region)
    new = {k: sorted(set(now[k]) - set(before.get(k, {}))) for k in now}
    assert all(not v for v in new.values()), f"left after down: {new}"
    assert all(not v for v in of_cluster(cid, region).values())


def fail_run_instances(session: boto3.Session, code: str, when: Any) -> list[str]:
    """Answer RunInstances with ``code`` when ``when(zone, n)`` (n: calls so far for that zone) is true."""
    seen: list[str] = []
    counts: dict[str, int] = {}

    def hook(params: dict[str, Any], model: Any, **_: Any) -> Any:
        body = params.get("body") or {}
        zone = body.get("Placement.AvailabilityZone", "") if isinstance(body, dict) else ""
        counts[zone] = counts.get(zone, 0) + 1
        seen.append(zone)
        if not when(zone, counts[zone]):
            return None
        http = AWSResponse(params.get("url", ""), 500 if code.startswith("Insufficient") else 400, {}, None)
        return http, {"Error": {"Code": code, "Message": f"injected {code} in {zone}"},
                      "ResponseMetadata": {"HTTPStatusCode": http.status_code}}

    session.events.register("before-call.ec2.RunInstances", hook)
    return seen


# ---------------------------------------------------------------------------------------------- up / down


@pytest.mark.parametrize("nodes", [1, 4])
def test_up_down_leaves_nothing(nodes: int) -> None:
    before = everything()
    ctx = context()
    s = spec(f"aws-updown-{nodes}", nodes)
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None and c.status == "up" and res.created
    assert res.plan.instance_type == "g5.xlarge" and res.plan.market == "on-demand"
    nodes_ = ctx.store.nodes(c.id)
    assert [n.rank for n in nodes_] == list(range(nodes))
    assert len({n.instance_id for n in nodes_}) == nodes and len({n.zone for n in nodes_}) == 1
    assert all(n.address and n.address.startswith("172.31.") for n in nodes_)
    mine = of_cluster(c.id)
    assert len(mine["instance"]) == nodes and len(mine["volume"]) == nodes
    assert len(mine["security-group"]) == 1 and len(mine["key-pair"]) == 1
    key = key_path(c.id)
    assert key.exists() and (key.stat().st_mode & 0o777) == 0o600
    # the security group: 22 from the CIDR asked for, and everything from itself
    sg = ec2().describe_security_groups(GroupIds=mine["security-group"])["SecurityGroups"][0]
    ssh = [p for p in sg["IpPermissions"] if p.get("FromPort") == 22]
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == ["198.51.100.7/32"]
    selfref = [p for p in sg["IpPermissions"] if p["IpProtocol"] == "-1"]
    assert selfref[0]["UserIdGroupPairs"][0]["GroupId"] == sg["GroupId"]
    assert not any(r.get("CidrIp") == "0.0.0.0/0" for p in sg["IpPermissions"] for r in p.get("IpRanges", []))
    # each node's status as AWS sees it
    assert [s.status for s in ctx.provider("aws").describe(c)] == ["running"] * nodes
    down = core.down(s.name, ctx)
    assert not down.already_down and len(down.cost.lines) == nodes
    assert_clean(before, c.id)
    assert not key.exists()
    assert core.down(s.name, ctx).already_down  # idempotent


def test_tags_on_every_resource() -> None:
    ctx = context()
    s = spec("aws-tags", 2, tags={"team": "ml"})
    c = core.up(s, ctx).cluster
    assert c is not None
    try:
        found = {k: {i: t for i, t in v.items() if t.get(TAG_CLUSTER) == c.id} for k, v in everything().items()}
        # (network interfaces get the same TagSpecification; moto does not apply it to them)
        for kind in ("instance", "volume", "security-group", "key-pair"):
            assert found[kind], kind
            for rid, tags in found[kind].items():
                for key in ("gtrain:cluster", "gtrain:cluster-name", "gtrain:owner", "gtrain:created", "Name", "team"):
                    assert key in tags, (kind, rid, key, tags)
                assert tags["gtrain:cluster-name"] == "aws-tags"
        names = sorted(t["Name"] for t in found["instance"].values())
        assert names == ["aws-tags-0", "aws-tags-1"]
        assert sorted(t["Name"] for t in found["volume"].values()) == names
        assert {t["Name"] for t in found["security-group"].values()} == {f"gtrain-{c.id}"}
    finally:
        core.down(s.name, ctx)


def test_spot_and_preempted_in_status() -> None:
    ctx = context()
    s = spec("aws-spot", 2, resources={"use_spot": True})
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None and res.plan.market == "spot" and c.market == "spot"
    nodes = ctx.store.nodes(c.id)
    insts = ec2().describe_instances(InstanceIds=[n.instance_id for n in nodes])["Reservations"]
    assert {i.get("InstanceLifecycle") for r in insts for i in r["Instances"]} == {"spot"}
    # AWS takes node 1 back: from gtrain's side, a terminate it did not ask for
    ec2().terminate_instances(InstanceIds=[nodes[1].instance_id])
    st = core.status(ctx, s.name)[0]
    assert [n["status"] for n in st["nodes"]] == ["running", "preempted"]
    assert nodes[1].instance_id in st["nodes"][1]["detail"]
    core.down(s.name, ctx)
    assert all(not v for v in of_cluster(c.id).values())


def test_real_spot_interruption_record_reads_preempted() -> None:
    # the record AWS returns after a spot interruption (as moto's backend writes it, see shared recipe 01)
    inst = {"InstanceId": "i-0abc", "State": {"Name": "terminated"}, "InstanceLifecycle": "spot",
            "StateReason": {"Code": "Server.SpotInstanceTermination",
                            "Message": "Server.SpotInstanceTermination: Spot instance termination"}}
    assert AWSProvider._node_status(0, inst, "10.0.0.1", by_gtrain=True).status == "preempted"
    inst["StateReason"] = {"Code": "Client.UserInitiatedShutdown", "Message": "by user"}
    assert AWSProvider._node_status(0, inst, None, by_gtrain=True).status == "terminated"
    inst["InstanceLifecycle"] = "normal"
    assert AWSProvider._node_status(0, inst, None, by_gtrain=False).status == "terminated"


def test_rerun_of_up_makes_only_what_is_missing() -> None:
    ctx = context()
    s = spec("aws-rerun", 3)
    c = core.up(s, ctx).cluster
    assert c is not None
    first = {n.rank: n.instance_id for n in ctx.store.nodes(c.id)}
    sgs, keys = of_cluster(c.id)["security-group"], of_cluster(c.id)["key-pair"]
    # as after a crash in the middle of `up`: node 2 never came up, the cluster is not "up"
    ec2().terminate_instances(InstanceIds=[first[2]])
    ctx.store.update_cluster(c.id, status="failed")
    again = core.up(s, ctx)
    assert again.created and again.cluster is not None and again.cluster.id == c.id
    second = {n.rank: n.instance_id for n in ctx.store.nodes(c.id)}
    assert second[0] == first[0] and second[1] == first[1] and second[2] != first[2]
    mine = of_cluster(c.id)
    assert len(mine["instance"]) == 3
    assert mine["security-group"] == sgs and mine["key-pair"] == keys
    # and a plain re-run with the cluster up changes nothing
    assert not core.up(s, ctx).created
    assert of_cluster(c.id)["instance"] == mine["instance"]
    core.down(s.name, ctx)
    assert all(not v for v in of_cluster(c.id).values())


def test_nodes_left_without_a_rank_by_a_crash_are_adopted() -> None:
    session = boto3.Session()

    class Crash(BaseException):  # as Ctrl+C would, without pytest taking it for the user's own
        pass

    armed = [True]

    def crash(**_: Any) -> None:  # `up` dies after RunInstances answered, before any rank was tagged
        if armed[0]:
            raise Crash

    session.events.register("before-call.ec2.CreateTags", crash)
    ctx = context(session)
    s = spec("aws-adopt", 3)
    with pytest.raises(Crash):
        core.up(s, ctx)
    c = ctx.store.find_cluster(s.name)
    assert c is not None
    made = of_cluster(c.id)["instance"]
    assert len(made) == 3  # tagged with the cluster (found by down / gc), no rank yet
    armed[0] = False  # (clients copy the session's handlers when made: unregistering would not reach them)
    ctx.store.update_cluster(c.id, status="failed")
    calls = run_instances_calls(session)
    again = core.up(s, ctx)
    assert again.cluster is not None and again.cluster.id == c.id
    assert calls == []  # adopted, not made again
    assert sorted(n.instance_id or "" for n in ctx.store.nodes(c.id)) == sorted(made)
    found = everything()
    names = sorted(t["Name"] for i, t in found["instance"].items() if t.get(TAG_CLUSTER) == c.id)
    assert names == ["aws-adopt-0", "aws-adopt-1", "aws-adopt-2"]
    ranks = sorted(t["gtrain:rank"] for i, t in found["instance"].items() if t.get(TAG_CLUSTER) == c.id)
    assert ranks == ["0", "1", "2"]
    core.down(s.name, ctx)
    assert all(not v for v in of_cluster(c.id).values())


@pytest.mark.parametrize("proxy", [True, False], ids=["private-nodes", "public-address"])
def test_efa_on_every_network_card_when_nodes_are_private(proxy: bool) -> None:
    session = boto3.Session()
    sent: list[dict[str, Any]] = []
    session.events.register("before-parameter-build.ec2.RunInstances",
                            lambda params, **_: sent.append(json.loads(json.dumps(params, default=str))))
    warned: list[str] = []

    class Warns(Reporter):
        def warn(self, msg: str) -> None:
            warned.append(msg)

    ctx = Context(store=StateStore(), report=Warns())
    ctx._providers["aws"] = AWSProvider(ctx.store, ctx.report, session=session)
    extra = {"ssh_proxy_command": "ssm-proxy %h"} if proxy else {}
    s = spec(f"aws-efa-{int(proxy)}", 2, resources={"accelerators": None, "instance_type": "p4d.24xlarge"}, **extra)
    try:
        core.up(s, ctx)
        nics = sent[0]["NetworkInterfaces"]
        if proxy:  # p4d.24xlarge: 4 network cards, an EFA on each, no public address (AWS allows none here)
            assert [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in nics] == [
                (0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
            assert not any("AssociatePublicIpAddress" in n for n in nics) and not [w for w in warned if "EFA" in w]
        else:
            assert len(nics) == 1 and nics[0]["InterfaceType"] == "efa" and nics[0]["AssociatePublicIpAddress"]
            assert any("4 EFA network cards" in w and "ssh_proxy_command" in w for w in warned), warned
    finally:
        core.down(s.name, ctx)


# ---------------------------------------------------------------------------------------------- failover


def run_instances_calls(session: boto3.Session) -> list[tuple[int, int]]:
    """(MinCount, MaxCount) of every RunInstances the session sends."""
    calls: list[tuple[int, int]] = []

    def hook(params: dict[str, Any], **_: Any) -> None:
        body = params.get("body") or {}
        calls.append((int(body.get("MinCount", 0)), int(body.get("MaxCount", 0))))

    session.events.register("before-call.ec2.RunInstances", hook)
    return calls


def test_capacity_failover_to_next_zone_is_all_or_nothing_per_zone() -> None:
    session = boto3.Session()
    # us-east-1a cannot hold the 4 nodes (AWS then makes none: MinCount = 4)
    calls = run_instances_calls(session)  # first: the injected failure answers before later hooks run
    seen = fail_run_instances(session, "InsufficientInstanceCapacity", lambda z, n: z == "us-east-1a")
    ctx = context(session)
    s = spec("aws-failover", 4, resources={"zones": ["us-east-1a", "us-east-1b"]})
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None
    nodes = ctx.store.nodes(c.id)
    assert {n.zone for n in nodes} == {"us-east-1b"} and res.plan.zone == "us-east-1b"
    assert seen == ["us-east-1a", "us-east-1b"]  # one request per zone for the whole cluster
    assert calls == [(4, 4), (4, 4)]
    # nothing was made (or billed) in 1a
    live = ec2().describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [c.id]},
                                             {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    zones = [i["Placement"]["AvailabilityZone"] for r in live["Reservations"] for i in r["Instances"]]
    assert sorted(zones) == ["us-east-1b"] * 4
    core.down(s.name, ctx)
    assert all(not v for v in of_cluster(c.id).values())


def test_capacity_failover_to_next_region() -> None:
    session = boto3.Session()
    fail_run_instances(session, "InsufficientInstanceCapacity", lambda z, n: z.startswith("us-east-1"))
    ctx = context(session)
    s = spec("aws-region-failover", 1, resources={"region": None, "regions": ["us-east-1", "us-west-2"],
                                                  "zones": ["us-east-1a", "us-west-2a"]})
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None and c.region == "us-west-2" and res.plan.region == "us-west-2"
    assert ctx.store.nodes(c.id)[0].zone == "us-west-2a"
    assert all(not v for v in of_cluster(c.id, "us-east-1").values())  # nothing left where it failed
    core.down(s.name, ctx)
    assert all(not v for v in of_cluster(c.id, "us-west-2").values())


def test_capacity_error_lists_attempts_and_leaves_nothing() -> None:
    before = everything()
    session = boto3.Session()
    fail_run_instances(session, "InsufficientInstanceCapacity", lambda z, n: True)
    ctx = context(session)
    s = spec("aws-nocap", 2, resources={"zones": ["us-east-1a", "us-east-1b", "us-east-1c"]})
    with pytest.raises(CapacityError) as ei:
        core.up(s, ctx)
    err = ei.value
    assert [a.split(":")[0] for a in err.attempts] == ["us-east-1/us-east-1a", "us-east-1/us-east-1b",
                                                         "us-east-1/us-east-1c"]
    assert all("InsufficientInstanceCapacity" in a for a in err.attempts)
    assert "us-east-1c" in err.message
    c = ctx.store.find_cluster(s.name)
    assert c is not None and c.status == "terminated"  # nothing made, nothing owned: the name is free
    assert_clean(before, c.id)
    assert not key_path(c.id).exists()


def test_quota_error_skips_the_rest_of_the_region() -> None:
    session = boto3.Session()
    seen = fail_run_instances(session, "VcpuLimitExceeded", lambda z, n: True)
    ctx = context(session)
    s = spec("aws-quota", 1, resources={"zones": ["us-east-1a", "us-east-1b"]})
    with pytest.raises(QuotaError) as ei:
        core.up(s, ctx)
    assert seen == ["us-east-1a"]  # a regional limit: the next zone would fail the same way
    assert "VcpuLimitExceeded" in ei.value.message and "us-east-1a" in ei.value.message


# ---------------------------------------------------------------------------------------------- gc


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GTRAIN_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_gc_finds_orphans_after_state_is_lost(gtrain_home: Path) -> None:
    ctx = context()
    s = spec("aws-orphan", 2)
    c = core.up(s, ctx).cluster
    assert c is not None
    ctx.store.close()
    for p in gtrain_home.glob("state.db*"):
        p.unlink()  # the laptop is gone
    listed = run_cli("gc", "--region", REGION, "--json", home=gtrain_home)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert c.id in doc["clusters"] and not doc["deleted"]
    kinds = sorted({o["kind"] for o in doc["orphans"] if o["cluster_id"] == c.id})
    assert {"instance", "security-group", "key-pair", "volume"} <= set(kinds)
    assert of_cluster(c.id)["instance"]  # listing deletes nothing
    swept = run_cli("gc", "--region", REGION, "--yes", "--json", home=gtrain_home)
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["deleted"]
    assert all(not v for v in of_cluster(c.id).values())
    again = json.loads(run_cli("gc", "--region", REGION, "--json", home=gtrain_home).stdout)
    assert c.id not in again["clusters"]


def test_gc_spares_live_clusters(gtrain_home: Path) -> None:
    ctx = context()
    s = spec("aws-live", 1)
    c = core.up(s, ctx).cluster
    assert c is not None
    try:
        doc = json.loads(run_cli("gc", "--region", REGION, "--json", home=gtrain_home).stdout)
        assert c.id not in doc["clusters"]
    finally:
        core.down(s.name, ctx)


# ---------------------------------------------------------------------------------------------- cost


def test_cost_report_minimum_spot_fallback_and_ebs() -> None:
    ctx = context()
    s = spec("aws-cost", 2, resources={"use_spot": True, "disk_gb": 200})
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None
    report = core.down(s.name, ctx).cost
    ebs = 200 * EBS_GP3_USD_PER_GB_MONTH / HOURS_PER_MONTH * 60 / 3600
    spot_catalog = 0.4024  # g5.xlarge us-east-1 price_spot in the catalog
    for line in report.lines:
        assert line.hours < 60 / 3600  # up and down in seconds ...
        assert line.cost_usd == pytest.approx(60 * spot_catalog / 3600 + ebs, abs=1e-6)  # ... billed 60 s
        assert line.estimate and "implausible" in (line.note or "") and "catalog" in (line.note or "")
        assert "EBS gp3 200 GB" in (line.note or "")
    assert report.estimate
    # a two-hour on-demand interval: per-second price stored at start, plus the disk
    provider = ctx.provider("aws")
    iv = CostInterval(0, c.id, 0, "g5.xlarge", "on-demand", 1.006, 1000.0, 1000.0 + 7200.5, None, False, None)
    priced = provider.price(c, iv)
    assert priced.cost_usd == pytest.approx(7201 * 1.006 / 3600 + 200 * 0.08 / 730 * 7201 / 3600, abs=1e-6)
    assert priced.estimate and "catalog" in (priced.note or "")  # a catalog list price, not the bill


def test_catalog_price_matches() -> None:
    from gtrain.catalog import lookup

    assert lookup("aws", "g5.xlarge", REGION)[0].price_spot == 0.4024


# ---------------------------------------------------------------------------------------------- bad input


def write_spec(tmp_path: Path, resources: dict[str, Any], aws: dict[str, Any] | None = None) -> Path:
    import yaml

    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"name": "bad", "provider": "aws", "resources": resources,
                                 "aws": aws or {"ssh_cidr": "198.51.100.7/32"}}))
    return p


@pytest.mark.parametrize(("resources", "aws", "field"), [
    ({"instance_type": "p9.mega"}, None, "resources.instance_type"),
    ({"accelerators": "A100:3"}, None, "resources.accelerators"),
    ({"instance_type": "p4de.24xlarge", "region": "eu-west-1"}, None, "resources.region"),
    ({"accelerators": "A10G:1", "regions": ["us-east-1", "eu-north-1"]}, None, "resources.regions[1]"),
    ({"accelerators": "A10G:1", "zones": ["us-west-2a"], "region": "us-east-1"}, None, "resources.zones[0]"),
    ({"accelerators": "A10G:1"}, {"ssh_cidr": "everyone"}, "aws.ssh_cidr"),
    ({"accelerators": "A10G:1"}, {"ssh_cidr": "auto", "ssh_proxy_command": "nc %p"}, "aws.ssh_proxy_command"),
    ({"accelerators": "A10G:1"}, {"sshcidr": "auto"}, "aws.sshcidr"),
])
def test_bad_input_is_a_config_error_naming_the_field(tmp_path: Path, gtrain_home: Path, resources: dict[str, Any],
                                                      aws: dict[str, Any] | None, field: str) -> None:
    r = run_cli("up", str(write_spec(tmp_path, resources, aws)), "--dry-run", "--json", home=gtrain_home)
    assert r.returncode == 2, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["error"] == "ConfigError" and doc["field"] == field, doc
    assert field.split("[")[0].split(".")[-1] in doc["message"]


def test_dry_run_plan(tmp_path: Path, gtrain_home: Path) -> None:
    p = write_spec(tmp_path, {"accelerators": "A100:8", "use_spot": True, "regions": ["us-west-2", "us-east-1"]})
    r = run_cli("up", str(p), "--dry-run", "--json", home=gtrain_home)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan["instance_type"] == "p4d.24xlarge" and plan["market"] == "spot" and plan["region"] == "us-west-2"
    assert plan["gpus_per_node"] == 8 and plan["price_per_hour"] > 0
    assert any("EFA" in n for n in plan["notes"]) and any("us-east-1" in n for n in plan["notes"])
    assert not any(everything()["instance"].get(i, {}).get("gtrain:cluster-name") == "bad"
                   for i in everything()["instance"])


def test_ssh_cidr_auto_fails_soft_without_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_CHECKIP_URL", "http://127.0.0.1:9/")  # nothing listens on the discard port
    ctx = context()
    s = spec("aws-cidr", 1, ssh_cidr="auto")
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as ei:
        core.up(s, ctx)
    assert ei.value.field == "aws.ssh_cidr" and "0.0.0.0/0" in (ei.value.hint or "")
    assert time.monotonic() - t0 < 10
    c = ctx.store.find_cluster("aws-cidr")
    assert c is not None and c.status == "terminated"


def test_console_host_key_parsing() -> None:
    text = ("cloud-init ...\n-----BEGIN SSH HOST KEY KEYS-----\n"
            "ecdsa-sha2-nistp256 AAAAE2VjZHNh root@ip-172-31-0-4\nssh-ed25519 AAAAC3NzaC1 root@ip-172-31-0-4\n"
            "-----END SSH HOST KEY KEYS-----\n")
    assert host_keys_from_console(text) == ["ecdsa-sha2-nistp256 AAAAE2VjZHNh", "ssh-ed25519 AAAAC3NzaC1"]
    assert host_keys_from_console("Linux version 2.6.16-xenU") == []


def test_custom_vpc_subnets() -> None:
    e = ec2()
    vpc = e.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    sa = e.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    sb = e.create_subnet(VpcId=vpc, CidrBlock="10.42.2.0/24", AvailabilityZone="us-east-1c")["Subnet"]["SubnetId"]
    ctx = context()
    s = spec("aws-vpc", 2, subnet_ids=[sb, sa])
    try:
        c = core.up(s, ctx).cluster
        assert c is not None
        mine = of_cluster(c.id)
        insts = [i for r in e.describe_instances(InstanceIds=mine["instance"])["Reservations"] for i in r["Instances"]]
        assert {i["SubnetId"] for i in insts} == {sb} and {i["VpcId"] for i in insts} == {vpc}  # the first given
        sg = e.describe_security_groups(GroupIds=mine["security-group"])["SecurityGroups"][0]
        assert sg["VpcId"] == vpc
        assert all(n.address and n.address.startswith("10.42.2.") for n in ctx.store.nodes(c.id))
    finally:
        core.down(s.name, ctx)
    # subnets of two VPCs, a subnet of another region, a VPC list with two regions: exit-2 errors naming the field
    other = e.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]["SubnetId"]
    for bad, fld, match in ([{"subnet_ids": [sa, other]}, "aws.subnet_ids", "one VPC"],
                            [{"subnet_ids": ["subnet-0123456789abcdef0"]}, "aws.subnet_ids", "one region"],
                            [{"vpc_id": vpc, "resources": {"region": None, "regions": ["us-east-1", "us-west-2"]}},
                             "aws.vpc_id", "belong to one region"]):
        resources = bad.pop("resources", None)
        with pytest.raises(ConfigError) as ei:
            core.up(spec("aws-vpc-bad", 1, resources=resources, **bad), ctx)
        assert ei.value.field == fld and match in f"{ei.value.message} {ei.value.hint}", ei.value.message


def test_time_and_cost_limits_make_the_nodes_end_themselves() -> None:
    import base64

    session = boto3.Session()
    sent: list[dict[str, Any]] = []
    session.events.register("before-parameter-build.ec2.RunInstances",
                            lambda params, **_: sent.append(dict(params)))
    ctx = context(session)
    s = spec("aws-limits", 2)  # policies.max_hours 2 (spec()), no cost cap
    plan = core.up(s, ctx, dry_run=True).plan
    assert any("deletes itself 2.00 h" in n for n in plan.notes), plan.notes
    try:
        core.up(s, ctx)
        data = str(sent[0]["UserData"])
        if "shutdown" not in data:  # base64 already (botocore encodes it in the same event)
            data = base64.b64decode(data).decode()
        assert data.startswith("#!/bin/bash\n") and "shutdown -h +120 " in data, data
        assert sent[0]["InstanceInitiatedShutdownBehavior"] == "terminate"  # so the shutdown ends the billing
    finally:
        core.down(s.name, ctx)
    sent.clear()
    s2 = parse_spec({"name": "aws-nolimit", "provider": "aws", "num_nodes": 1,
                     "resources": {"accelerators": "A10G:1", "region": REGION},
                     "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.2}})
    try:
        core.up(s2, ctx)
        assert "UserData" not in sent[0]
    finally:
        core.down(s2.name, ctx)


def test_a_node_that_ended_at_its_limit_is_not_billed_until_down() -> None:
    ctx = context()
    s = spec("aws-ended", 2)  # policies.max_hours 2: the nodes end themselves 2 h after they start
    c = core.up(s, ctx).cluster
    assert c is not None
    # three hours later (the intervals moved back), node 1 is gone: its own shutdown terminated it
    with ctx.store.tx() as db:
        db.execute("UPDATE cost_intervals SET started_at = started_at - 3 * 3600 WHERE cluster_id = ?", (c.id,))
    ec2().terminate_instances(InstanceIds=[ctx.store.nodes(c.id)[1].instance_id or ""])
    down = core.down(s.name, ctx)
    hours = {ln.node_rank: ln.hours for ln in down.cost.lines}
    assert 2.0 <= hours[1] <= 2.0 + 2 / 60  # its time limit (+ a minute for the shutdown), not 3 h
    assert hours[0] >= 3.0  # node 0 still ran until down
