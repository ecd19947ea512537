"""The spec's ``volumes:`` on aws (EBS), against the session's moto server: made once in the nodes' zone, attached
to node 0, left by ``down`` (a standing charge in the cost report), reused by the next cluster, refused to a
second live cluster, in another zone or region, or smaller than it is; deleted only by ``gtrain volume delete``.
moto mounts nothing: the mount script is tested in tests/unit/test_volumes_mount.py."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from gtrain.context import Context
from gtrain.costs.report import cluster_cost
from gtrain.errors import ConfigError
from gtrain.providers.aws import AWSProvider
from gtrain.runs import cluster as core
from gtrain.runs import volumes as vol_ops
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore

pytestmark = pytest.mark.usefixtures("moto_server")

REGION = "us-east-1"
TAG = "gtrain-volume"


def spec(name: str, volumes: list[dict[str, Any]], *, nodes: int = 1, region: str = REGION,
         zones: list[str] | None = None) -> ClusterSpec:
    res: dict[str, Any] = {"accelerators": "A10G:1", "region": region, "disk_gb": 100}
    if zones:
        res["zones"] = zones
    return parse_spec({"name": name, "provider": "aws", "num_nodes": nodes, "resources": res,
                       "volumes": volumes, "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.2}})


def context() -> Context:
    ctx = Context(store=StateStore())
    ctx._providers["aws"] = AWSProvider(ctx.store, ctx.report)
    return ctx


def ec2(region: str = REGION) -> Any:
    return boto3.client("ec2", region_name=region)


def tagged(name: str, region: str = REGION) -> list[dict[str, Any]]:
    return [v for v in ec2(region).describe_volumes(Filters=[{"Name": f"tag:{TAG}", "Values": [name]}])["Volumes"]
            if v["State"] not in ("deleting", "deleted")]


def instances(region: str = REGION) -> set[str]:
    return {i["InstanceId"] for r in ec2(region).describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"}


def test_made_once_kept_by_down_reused_and_deleted_only_by_volume_delete() -> None:
    ctx = context()
    vols = [{"name": "vt-data", "size_gb": 20, "mount": "/data"}]
    s1 = spec("vol-a", vols, nodes=2)
    assert any("pin the cluster to us-east-1" in n for n in ctx.provider("aws").plan(s1).notes)
    c1 = core.up(s1, ctx).cluster
    assert c1 is not None
    [v] = tagged("vt-data")
    node0 = next(n for n in ctx.store.nodes(c1.id) if n.rank == 0)
    assert v["AvailabilityZone"] == node0.zone and v["Size"] == 20 and v["VolumeType"] == "gp3"
    assert [a["InstanceId"] for a in v["Attachments"]] == [node0.instance_id]  # node 0 only
    assert "gtrain:cluster" not in {t["Key"] for t in v["Tags"]}  # so teardown and gc never take it
    # a second live cluster may not have it (read-write, one node's disk): refused before anything is made
    before = instances()
    with pytest.raises(ConfigError, match="attached to cluster vol-a") as e:
        core.up(spec("vol-b", vols), ctx)
    assert e.value.field == "volumes[0].name" and instances() == before
    report = core.down("vol-a", ctx).cost
    [left] = tagged("vt-data")
    assert left["VolumeId"] == v["VolumeId"] and left["State"] == "available" and not left["Attachments"]
    assert report.volumes == [{"name": "vt-data", "id": v["VolumeId"], "type": "gp3", "region": REGION,
                               "size_gb": 20, "usd_per_gb_month": 0.08, "usd_per_month": 1.6}]
    assert report.to_dict()["standing_usd_per_month"] == 1.6
    # the next cluster finds it by tag, in its zone, and attaches the same volume
    c2 = core.up(spec("vol-b", vols), ctx).cluster
    assert c2 is not None
    [again] = tagged("vt-data")
    assert again["VolumeId"] == v["VolumeId"]
    n0 = next(n for n in ctx.store.nodes(c2.id) if n.rank == 0)
    assert n0.zone == v["AvailabilityZone"] and [a["InstanceId"] for a in again["Attachments"]] == [n0.instance_id]
    listed = vol_ops.ls(ctx, "aws", [REGION])
    assert [(i.name, i.id, i.attached_to) for i in listed if i.name == "vt-data"] == [("vt-data", v["VolumeId"],
                                                                                       "vol-b")]
    with pytest.raises(ConfigError, match="attached to cluster vol-b"):
        vol_ops.delete(ctx, "aws", "vt-data", [REGION])
    core.down("vol-b", ctx)
    assert cluster_cost(ctx.store, ctx.store.get_cluster_by_id(c2.id), ctx.provider("aws")).volumes
    assert tagged("vt-data")  # down never deletes it
    gone = vol_ops.delete(ctx, "aws", "vt-data", [REGION])
    assert gone is not None and gone.id == v["VolumeId"] and not tagged("vt-data")


def test_refused_in_another_zone_region_or_smaller_nothing_made() -> None:
    ctx = context()
    other = ec2().create_volume(AvailabilityZone="us-east-1b", Size=30, VolumeType="gp3", TagSpecifications=[
        {"ResourceType": "volume", "Tags": [{"Key": TAG, "Value": "vt-zone"}]}])
    west = ec2("us-west-2").create_volume(AvailabilityZone="us-west-2a", Size=30, VolumeType="gp3",
                                          TagSpecifications=[{"ResourceType": "volume",
                                                              "Tags": [{"Key": TAG, "Value": "vt-west"}]}])
    try:
        before = instances()
        cases = [
            (spec("vol-z", [{"name": "vt-zone", "size_gb": 30, "mount": "/d"}], zones=["us-east-1a"]),
             "is in us-east-1b, not in resources.zones", "volumes[0].name"),
            (spec("vol-w", [{"name": "vt-west", "size_gb": 30, "mount": "/d"}]),
             "is in us-west-2a, the cluster goes to us-east-1", "volumes[0].name"),
            (spec("vol-s", [{"name": "vt-zone", "size_gb": 10, "mount": "/d"}]),
             "10 is below volume vt-zone's 30 GB", "volumes[0].size_gb"),
        ]
        for s, msg, fld in cases:
            with pytest.raises(ConfigError, match=msg) as e:
                core.up(s, ctx)
            assert e.value.field == fld and e.value.exit_code == 2
            assert ctx.store.find_cluster(s.name) is None or ctx.store.find_cluster(s.name).status == "terminated"
        assert instances() == before
        # an existing volume pins the zone: the nodes go where it is
        c = core.up(spec("vol-p", [{"name": "vt-zone", "size_gb": 30, "mount": "/d"}]), ctx).cluster
        assert c is not None and {n.zone for n in ctx.store.nodes(c.id)} == {"us-east-1b"}
        core.down("vol-p", ctx)
        assert [v["State"] for v in tagged("vt-zone")] == ["available"]
    finally:
        ec2().delete_volume(VolumeId=other["VolumeId"])
        ec2("us-west-2").delete_volume(VolumeId=west["VolumeId"])


def test_volume_create_then_up_uses_it() -> None:
    ctx = context()
    s = spec("vol-c", [{"name": "vt-made", "size_gb": 8, "mount": "/m", "type": "gp2"}], zones=["us-east-1c"])
    info = vol_ops.create(ctx, s, "vt-made")
    assert (info.zone, info.size_gb, info.type, info.state) == ("us-east-1c", 8, "gp2", "available")
    assert info.usd_per_gb_month == 0.1 and vol_ops.create(ctx, s, "vt-made").id == info.id  # once
    with pytest.raises(ConfigError, match="no volume vt-nope"):
        vol_ops.create(ctx, s, "vt-nope")
    assert vol_ops.delete(ctx, "aws", "vt-made", [REGION]) is not None
    assert vol_ops.delete(ctx, "aws", "vt-made", [REGION]) is None


def test_cli_ls_create_delete(tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gtrain", "volume", *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"name": "vol-cli", "provider": "aws", "resources": {"accelerators": "A10G:1",
                                                                                 "region": REGION},
                             "volumes": [{"name": "vt-cli", "size_gb": 3, "mount": "/data"}]}))
    r = gtrain("create", "-f", str(p), "vt-cli", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)["volume"]
    assert (made["name"], made["size_gb"], made["zone"], made["usd_per_month"]) == ("vt-cli", 3, "us-east-1a", 0.24)
    r = gtrain("ls", "--region", REGION, "--json")
    assert r.returncode == 0 and made["id"] in [v["id"] for v in json.loads(r.stdout)["volumes"]], r.stderr
    r = gtrain("ls", "--region", REGION)
    assert r.returncode == 0 and "vt-cli" in r.stdout and "standing charge" in r.stdout
    r = gtrain("delete", "vt-cli", "--json")
    assert r.returncode == 2 and "--json needs --yes" in r.stderr
    r = gtrain("delete", "vt-cli", "--region", REGION)  # no terminal to ask: refused, nothing deleted
    assert r.returncode == 2 and tagged("vt-cli")
    r = gtrain("delete", "vt-cli", "--region", REGION, "--yes")
    assert r.returncode == 0 and f"deleted volume vt-cli ({made['id']}" in r.stdout and not tagged("vt-cli")
    r = gtrain("delete", "vt-cli", "--region", REGION, "--yes")
    assert r.returncode == 2 and "no volume vt-cli" in r.stderr and "Traceback" not in r.stderr


def test_a_replaced_node_0_gets_the_volume_back_and_a_replaced_node_1_leaves_it() -> None:
    """Recovery replaces nodes (`replace_nodes`): the volume follows node 0 to its new instance, and stays put when
    another node is replaced."""
    ctx = context()
    vols = [{"name": "vt-moves", "size_gb": 10, "mount": "/data"}]
    c = core.up(spec("vol-r", vols, nodes=2), ctx).cluster
    assert c is not None
    p = ctx.provider("aws")

    def holder() -> tuple[str, str]:
        [v] = tagged("vt-moves")
        node0 = next(n for n in ctx.store.nodes(c.id) if n.rank == 0 and n.status != "terminated")
        return [a["InstanceId"] for a in v["Attachments"] if a["State"] in ("attaching", "attached")][0], \
            str(node0.instance_id)

    try:
        first, node0 = holder()
        assert first == node0
        p.replace_nodes(ctx.store.get_cluster_by_id(c.id), [1])
        assert holder() == (first, node0)
        p.replace_nodes(ctx.store.get_cluster_by_id(c.id), [0])
        now, new0 = holder()
        assert new0 != node0 and now == new0
        recs = ctx.store.get_cluster_by_id(c.id).extra["volumes"]
        assert [(r["name"], r["instance_id"]) for r in recs] == [("vt-moves", new0)]
    finally:
        core.down("vol-r", ctx)
        vol_ops.delete(ctx, "aws", "vt-moves", [REGION])


def test_start_after_stop_mounts_the_volume_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """EBS stays attached through stop/start, the mount does not survive the boot: `start` runs node 0's mount
    again (here wait_ssh is false, so it says it could not; the mount script itself: test_volumes_mount.py)."""
    from gtrain.runs import stopstart

    ctx = context()
    p = ctx.provider("aws")
    mounted: list[tuple[list[str], bool]] = []
    monkeypatch.setattr(p, "_mount", lambda cluster, vols, reachable: mounted.append(
        ([v["name"] for v in vols], reachable)))
    c = core.up(spec("vol-s", [{"name": "vt-boot", "size_gb": 10, "mount": "/data"}]), ctx).cluster
    assert c is not None
    try:
        assert mounted == [(["vt-boot"], False)]
        stopstart.stop("vol-s", ctx)
        stopstart.start("vol-s", ctx)
        assert mounted == [(["vt-boot"], False)] * 2
        [v] = tagged("vt-boot")
        node0 = next(n for n in ctx.store.nodes(c.id) if n.rank == 0)
        assert [a["InstanceId"] for a in v["Attachments"]] == [node0.instance_id]
    finally:
        core.down("vol-s", ctx)
        vol_ops.delete(ctx, "aws", "vt-boot", [REGION])
