"""The spec's ``volumes:`` on lambda (``type: filesystem``) against tests/fixtures/fake_lambda.py (written from
Lambda's OpenAPI document): a persistent file system made once by ``up`` in the cluster's region and passed to
every node's launch, refused to a second live cluster, left by ``down`` with its standing charge ($0.20 per GiB
used per month), reused by the next cluster (which it pins to its region), deleted only by ``gtrain volume
delete`` (Lambda itself refuses while an instance mounts it); bad input exit 2 with nothing made; the link each
node's ``mount`` becomes, run here in bash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gtrain.context import Context
from gtrain.errors import ConfigError, GtrainError
from gtrain.providers.cloud.errors import code_of
from gtrain.providers.lambda_cloud.volumes import link_script
from gtrain.runs import cluster as core
from gtrain.runs import volumes as vol_ops
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_lambda import FakeLambda

pytestmark = pytest.mark.usefixtures("gtrain_home")


def doc(name: str, vols: list[dict[str, Any]], *, nodes: int = 2, **res: Any) -> dict[str, Any]:
    return {"name": name, "provider": "lambda", "num_nodes": nodes,
            "resources": {"accelerators": "A10:1", **(res or {"region": "us-east-1"})}, "volumes": vols,
            "lambda": {"wait_ssh": False, "poll_s": 0.05}}


def spec(*a: Any, **kw: Any) -> ClusterSpec:
    return parse_spec(doc(*a, **kw))


def fs(fake: FakeLambda, name: str) -> list[dict[str, Any]]:
    with fake.lock:
        return [dict(f) for f in fake.file_systems if f["name"] == name]


def live(fake: FakeLambda) -> list[str]:
    with fake.lock:
        fake._tick()
        return sorted(i["name"] for i in fake.instances.values() if i["status"] != "terminating")


def test_made_once_kept_by_down_reused_and_deleted_only_by_volume_delete(fake_lambda: FakeLambda) -> None:
    ctx = Context(store=StateStore())
    vols = [{"name": "lv-data", "mount": "/data"}]
    plan = ctx.provider("lambda").plan(spec("lv-a", vols))
    assert any("Lambda file system gtrain-lv-data at /data" in n for n in plan.notes), plan.notes
    c1 = core.up(spec("lv-a", vols), ctx).cluster
    assert c1 is not None
    [made] = fs(fake_lambda, "gtrain-lv-data")
    assert made["region"]["name"] == "us-east-1"
    assert [b["file_system_names"] for b in fake_lambda.launches[-2:]] == [["gtrain-lv-data"]] * 2  # every node
    # a second live cluster may not have it: refused before anything is made
    before = live(fake_lambda)
    with pytest.raises(ConfigError, match="mounted by cluster lv-a") as e:
        core.up(spec("lv-b", vols), ctx)
    assert e.value.field == "volumes[0].name" and e.value.exit_code == 2 and live(fake_lambda) == before
    with pytest.raises(ConfigError, match="mounted by cluster lv-a"):
        vol_ops.delete(ctx, "lambda", "lv-data", None)
    with pytest.raises(GtrainError) as api_e:  # and Lambda itself refuses, as its reference says
        ctx.provider("lambda").api.delete_file_system(made["id"])  # type: ignore[attr-defined]
    assert code_of(api_e.value) == "filesystems/filesystem-in-use"
    [listed] = [i for i in vol_ops.ls(ctx, "lambda") if i.name == "lv-data"]
    assert (listed.type, listed.region, listed.attached_to, listed.state) == ("filesystem", "us-east-1", "lv-a",
                                                                              "in-use")
    with fake_lambda.lock:
        next(f for f in fake_lambda.file_systems if f["id"] == made["id"])["bytes_used"] = 10 * 2**30
    report = core.down("lv-a", ctx).cost
    assert [f["id"] for f in fs(fake_lambda, "gtrain-lv-data")] == [made["id"]]  # down never deletes it
    assert [(v["name"], v["size_gb"], v["usd_per_gb_month"], v["usd_per_month"]) for v in report.volumes] == [
        ("lv-data", 10, 0.2, 2.0)]
    assert report.to_dict()["standing_usd_per_month"] == 2.0
    # the next cluster finds it by name and is pinned to its region (its own list starts elsewhere)
    c2 = core.up(spec("lv-b", vols, nodes=1, regions=["us-west-1", "us-east-1"]), ctx).cluster
    assert c2 is not None and [f["id"] for f in fs(fake_lambda, "gtrain-lv-data")] == [made["id"]]
    assert (fake_lambda.launches[-1]["region_name"], fake_lambda.launches[-1]["file_system_names"]) == (
        "us-east-1", ["gtrain-lv-data"])
    core.down("lv-b", ctx)
    gone = vol_ops.delete(ctx, "lambda", "lv-data", None)
    assert gone is not None and gone.id == made["id"] and not fs(fake_lambda, "gtrain-lv-data")
    assert vol_ops.delete(ctx, "lambda", "lv-data", None) is None


def test_refusals_exit_2_nothing_made(fake_lambda: FakeLambda, tmp_path: Path) -> None:
    ctx = Context(store=StateStore())
    info = vol_ops.create(ctx, spec("lv-c", [{"name": "lv-west", "mount": "/w"}], region="us-west-1"), "lv-west")
    assert (info.region, info.type, info.usd_per_gb_month, info.state) == ("us-west-1", "filesystem", 0.2,
                                                                          "available")
    assert vol_ops.create(ctx, spec("lv-c", [{"name": "lv-west", "mount": "/w"}], region="us-west-1"),
                          "lv-west").id == info.id  # once
    before, launches = live(fake_lambda), len(fake_lambda.launches)
    cases = [
        (spec("lv-r", [{"name": "lv-west", "mount": "/w"}]), "is in us-west-1, the cluster goes to us-east-1",
         "volumes[0].name"),
        (spec("lv-o", [{"name": "lv-ro", "mount": "/w", "read_only": True}]), "read-write on every node",
         "volumes[0].read_only"),
        (spec("lv-2", [{"name": "lv-x", "mount": "/x"}, {"name": "lv-y", "mount": "/y"}]),
         "one file system to an instance", "volumes[1]"),
    ]
    for s, msg, fld in cases:
        with pytest.raises(ConfigError, match=msg) as e:
            core.up(s, ctx)
        assert e.value.field == fld and e.value.exit_code == 2
    assert live(fake_lambda) == before and len(fake_lambda.launches) == launches
    assert not fs(fake_lambda, "gtrain-lv-ro") and not fs(fake_lambda, "gtrain-lv-x")
    # the CLI: ls finds it by name (no state needed), delete needs --yes with --json, then deletes it
    def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gtrain", "volume", *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    r = gtrain("ls", "--provider", "lambda", "--json")
    assert r.returncode == 0, r.stderr
    assert [v["id"] for v in json.loads(r.stdout)["volumes"] if v["name"] == "lv-west"] == [info.id]
    g = subprocess.run([sys.executable, "-m", "gtrain", "gc", "--provider", "lambda", "--json"], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)  # no live cluster holds it: an orphan
    assert g.returncode == 0, g.stderr
    assert [v["id"] for v in json.loads(g.stdout)["volumes"]["orphans"] if v["name"] == "lv-west"] == [info.id]
    assert fs(fake_lambda, "gtrain-lv-west")  # listed, not deleted (that takes --delete)
    r = gtrain("delete", "lv-west", "--provider", "lambda", "--json")
    assert r.returncode == 2 and "--json needs --yes" in r.stderr and fs(fake_lambda, "gtrain-lv-west")
    r = gtrain("delete", "lv-west", "--provider", "lambda", "--yes")
    assert r.returncode == 0 and "deleted volume lv-west" in r.stdout and not fs(fake_lambda, "gtrain-lv-west")


def test_fake_validates_file_system_requests(fake_lambda: FakeLambda) -> None:
    ctx = Context(store=StateStore())
    api = ctx.provider("lambda").api  # type: ignore[attr-defined]
    for name, region, said in [("9starts-with-digit", "us-east-1", "does not match"),
                               ("ok-name", "mars-north-1", "Invalid region"), ("x" * 61, "us-east-1", "length 61")]:
        with pytest.raises(GtrainError, match=said) as e:
            api.create_file_system(name, region)
        assert code_of(e.value) == "global/invalid-parameters"
    made = api.create_file_system("lv-dup", "us-east-1")
    assert made["mount_point"] == "/lambda/nfs/lv-dup" and made["is_in_use"] is False
    with pytest.raises(GtrainError) as dup:
        api.create_file_system("lv-dup", "us-east-1")
    assert code_of(dup.value) == "global/duplicate"
    assert api.delete_file_system(made["id"]) == [made["id"]]
    with pytest.raises(GtrainError) as missing:
        api.delete_file_system(made["id"])
    assert code_of(missing.value) == "global/object-does-not-exist"


def test_link_script_links_the_mount_to_lambdas_mount_point(tmp_path: Path) -> None:
    src, mnt = tmp_path / "lambda" / "nfs" / "gtrain-d", tmp_path / "data" / "d"
    src.mkdir(parents=True)
    rec = {"name": "d", "mount_point": str(src), "mount": str(mnt)}
    for _ in range(2):  # idempotent
        r = subprocess.run(["bash", "-c", link_script([rec], wait_s=1)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert mnt.is_symlink() and mnt.resolve() == src.resolve()
    taken = tmp_path / "taken"
    taken.mkdir()
    r = subprocess.run(["bash", "-c", link_script([{**rec, "mount": str(taken)}], wait_s=1)], capture_output=True,
                       text=True)
    assert r.returncode == 3 and "TAKEN d" in r.stdout
    r = subprocess.run(["bash", "-c", link_script([{**rec, "mount_point": str(tmp_path / "none")}], wait_s=1)],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "MISSING d" in r.stdout
