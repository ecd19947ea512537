"""The spec's ``volumes:`` on azure (managed disks), against the session's fake Azure Resource Manager
(tests/fixtures/fake_arm.py): made once in a resource group of their own, attached to node 0 through the VM's data
disks, left by ``down`` (whose resource group delete detaches them; a standing charge in the cost report), reused by
the next cluster, refused to a second live cluster, in another region or smaller than it is; grown while unattached;
deleted only by ``gtrain volume delete``. The fake mounts nothing: the mount script is run in test_volumes_gcp.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gtrain.context import Context
from gtrain.costs.report import cluster_cost
from gtrain.errors import ConfigError, ProviderError
from gtrain.providers.azure import AzureProvider, azure_options
from gtrain.providers.azure.volumes import V_DISKS
from gtrain.runs import cluster as core
from gtrain.runs import volumes as vol_ops
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_arm import SUBSCRIPTION, FakeARM

REGION = "eastus"
CIDR = "198.51.100.7/32"


def spec(name: str, volumes: list[dict[str, Any]], *, nodes: int = 1, region: str = REGION) -> ClusterSpec:
    return parse_spec({"name": name, "provider": "azure", "num_nodes": nodes,
                       "resources": {"accelerators": "T4:1", "region": region, "disk_gb": 64}, "volumes": volumes,
                       "azure": {"ssh_cidr": CIDR, "wait_ssh": False, "poll_s": 0.05}})


def context() -> Context:
    ctx = Context(store=StateStore())
    ctx._providers["azure"] = AzureProvider(ctx.store, ctx.report)
    return ctx


def disks(fake: FakeARM, name: str) -> list[dict[str, Any]]:
    with fake.lock:
        return [json.loads(json.dumps(r)) for (_, t, _), r in fake.resources.items()
                if t == "disks" and r["tags"].get("gtrain-volume") == name]


def vms(fake: FakeARM) -> set[str]:
    with fake.lock:
        return {n for (_, t, n) in fake.resources if t == "virtualmachines"}


def test_made_once_kept_by_down_reused_and_deleted_only_by_volume_delete(fake_arm: FakeARM) -> None:
    ctx = context()
    vols = [{"name": "av-data", "size_gb": 64, "mount": "/data"}]
    s1 = spec("avol-a", vols, nodes=2)
    assert any("pin the cluster to eastus" in n for n in ctx.provider("azure").plan(s1).notes)
    c1 = core.up(s1, ctx).cluster
    assert c1 is not None
    [d] = disks(fake_arm, "av-data")
    assert d["id"].split("/")[4] == "gtrain-volumes-eastus" and d["location"] == REGION  # not the cluster's group
    assert (d["sku"]["name"], d["properties"]["diskSizeGB"], d["properties"]["diskState"]) == ("Premium_LRS", 64,
                                                                                            "Attached")
    vm0 = fake_arm.vm(f"{c1.id}-0")
    assert vm0 is not None and d["managedBy"] == vm0["id"]  # node 0 only
    [dd] = vm0["properties"]["storageProfile"]["dataDisks"]
    assert (dd["lun"], dd["createOption"], dd["deleteOption"]) == (0, "Attach", "Detach")
    assert not fake_arm.vm(f"{c1.id}-1")["properties"]["storageProfile"].get("dataDisks")  # type: ignore[index]
    assert "gtrain-cluster" not in d["tags"]
    # a second live cluster may not have it: refused before anything is made
    before = vms(fake_arm)
    with pytest.raises(ConfigError, match="attached to cluster avol-a") as e:
        core.up(spec("avol-b", vols), ctx)
    assert e.value.field == "volumes[0].name" and e.value.exit_code == 2 and vms(fake_arm) == before
    report = core.down("avol-a", ctx).cost
    [left] = disks(fake_arm, "av-data")
    assert left["id"] == d["id"] and "managedBy" not in left and left["properties"]["diskState"] == "Unattached"
    assert report.volumes == [{"name": "av-data", "id": "gtrain-av-data", "type": "Premium_LRS", "region": REGION,
                               "size_gb": 64, "usd_per_gb_month": 0.15, "usd_per_month": 9.6}]
    assert report.to_dict()["standing_usd_per_month"] == 9.6
    # the next cluster finds it by tag and attaches the same disk
    c2 = core.up(spec("avol-b", vols), ctx).cluster
    assert c2 is not None
    [again] = disks(fake_arm, "av-data")
    assert again["id"] == d["id"] and again["managedBy"].endswith(f"/virtualMachines/{c2.id}-0")
    listed = vol_ops.ls(ctx, "azure", [REGION])
    assert [(i.name, i.id, i.attached_to, i.state) for i in listed if i.name == "av-data"] == [
        ("av-data", "gtrain-av-data", "avol-b", "in-use")]
    with pytest.raises(ConfigError, match="attached to cluster avol-b"):
        vol_ops.delete(ctx, "azure", "av-data", [REGION])
    core.down("avol-b", ctx)
    assert cluster_cost(ctx.store, ctx.store.get_cluster_by_id(c2.id), ctx.provider("azure")).volumes
    assert disks(fake_arm, "av-data")  # down never deletes it
    swept = vol_ops.sweep(ctx.provider("azure"), [], None, False)  # type: ignore[arg-type]  # gtrain gc's listing
    assert [(v.name, v.usd_per_month) for v in swept.orphans] == [("av-data", 9.6)]
    gone = vol_ops.delete(ctx, "azure", "av-data", [REGION])
    assert gone is not None and gone.id == "gtrain-av-data" and not disks(fake_arm, "av-data")
    assert vol_ops.delete(ctx, "azure", "av-data") is None


def test_refused_in_another_region_or_smaller_nothing_made_and_grown_when_larger(fake_arm: FakeARM) -> None:
    ctx = context()
    west = vol_ops.create(ctx, spec("avol-w", [{"name": "av-west", "size_gb": 32, "mount": "/d"}],
                                    region="westus2"), "av-west")
    assert (west.region, west.size_gb, west.type, west.state) == ("westus2", 32, "Premium_LRS", "available")
    here = vol_ops.create(ctx, spec("avol-h", [{"name": "av-here", "size_gb": 32, "mount": "/d",
                                                "type": "StandardSSD_LRS"}]), "av-here")
    assert (here.usd_per_gb_month, here.usd_per_month) == (0.075, 2.4)
    before = vms(fake_arm)
    cases = [
        (spec("avol-x", [{"name": "av-west", "size_gb": 32, "mount": "/d"}]),
         "is in westus2, the cluster goes to eastus", "volumes[0].name"),
        (spec("avol-s", [{"name": "av-here", "size_gb": 16, "mount": "/d"}]),
         "16 is below volume av-here's 32 GiB", "volumes[0].size_gb"),
        (spec("avol-t", [{"name": "av-tiny", "size_gb": 2, "mount": "/d"}]),
         "a managed disk is 4..32767 GiB", "volumes[0].size_gb"),
        (spec("avol-n", [{"name": "av-nosize", "mount": "/d"}]), "required for a managed disk", "volumes[0].size_gb"),
    ]
    for s, msg, fld in cases:
        with pytest.raises(ConfigError, match=msg) as e:
            core.up(s, ctx)
        assert e.value.field == fld and e.value.exit_code == 2
        assert ctx.store.find_cluster(s.name) is None or ctx.store.find_cluster(s.name).status == "terminated"
    assert vms(fake_arm) == before and not disks(fake_arm, "av-tiny")
    with pytest.raises(ConfigError, match="'PremiumV2_LRS' is not a volume type of azure"):
        spec("avol-v2", [{"name": "av-v2", "size_gb": 32, "mount": "/d", "type": "PremiumV2_LRS"}])
    # a larger size_gb grows it while it is unattached (Disks - Update), then it is attached
    c = core.up(spec("avol-g", [{"name": "av-here", "size_gb": 48, "mount": "/d"}]), ctx).cluster
    assert c is not None
    [d] = disks(fake_arm, "av-here")
    assert d["properties"]["diskSizeGB"] == 48 and d["managedBy"].endswith(f"{c.id}-0")
    [rec] = ctx.store.get_cluster_by_id(c.id).extra["volumes"]
    assert (rec["size_gb"], rec["grow"], rec["type"], rec["device"]) == (48, True, "StandardSSD_LRS",
                                                                         "/dev/disk/azure/scsi1/lun0")
    core.down("avol-g", ctx)
    for name in ("av-west", "av-here"):
        assert vol_ops.delete(ctx, "azure", name) is not None


def test_the_fake_refuses_what_arm_refuses(fake_arm: FakeARM) -> None:
    """Shrinking, resizing an attached disk, attaching one held by another VM (OperationNotAllowed), deleting an
    attached one, a bad sku, PremiumV2 without a zone, the VMs' api-version for a disk: each refused as ARM
    answers, translated at the edge."""
    ctx = context()
    p: AzureProvider = ctx.provider("azure")  # type: ignore[assignment]
    c = core.up(spec("avol-f", [{"name": "av-fake", "size_gb": 8, "mount": "/f"}], nodes=2), ctx).cluster
    assert c is not None
    arm = p.arm(None)
    [d] = disks(fake_arm, "av-fake")
    path = d["id"]
    try:
        with pytest.raises(ProviderError, match="cannot be resized down") as e:
            arm.request("PATCH", arm.url(path, V_DISKS), {"properties": {"diskSizeGB": 4}})
        with pytest.raises(ProviderError, match="while it is attached") as e:
            arm.request("PATCH", arm.url(path, V_DISKS), {"properties": {"diskSizeGB": 16}})
        assert getattr(e.value, "code", "") == "OperationNotAllowed"
        vm1 = fake_arm.vm(f"{c.id}-1")
        assert vm1 is not None
        with pytest.raises(ProviderError, match="is already attached to VM") as e:
            arm.request("PATCH", arm.url(vm1["id"], "2024-07-01"), {"properties": {"storageProfile": {"dataDisks": [
                {"lun": 0, "createOption": "Attach", "managedDisk": {"id": path}}]}}})
        assert getattr(e.value, "code", "") == "OperationNotAllowed"
        with pytest.raises(ProviderError, match="is attached to VM"):
            arm.request("DELETE", arm.url(path, V_DISKS))
        new = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/gtrain-volumes-eastus/providers/Microsoft.Compute/disks/x"
        body = {"location": REGION, "properties": {"creationData": {"createOption": "Empty"}, "diskSizeGB": 8}}
        for b, version, msg in [({**body, "sku": {"name": "Premium_XRS"}}, V_DISKS, "is not one of"),
                                ({**body, "sku": {"name": "PremiumV2_LRS"}}, V_DISKS, "can only be zonal"),
                                ({**body, "sku": {"name": "Premium_LRS"}}, "2024-07-01",
                                 "api-versions are '2024-03-02'"),
                                ({**body, "properties": {**body["properties"], "bogus": 1}}, V_DISKS, "unknown field")]:
            with pytest.raises(ProviderError, match=msg):
                arm.request("PUT", arm.url(new, version), b)
    finally:
        core.down("avol-f", ctx)
        vol_ops.delete(ctx, "azure", "av-fake")


def test_cli_ls_create_delete(tmp_path: Path, fake_arm: FakeARM) -> None:
    def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gtrain", "volume", *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, env={**os.environ})

    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"name": "avol-cli", "provider": "azure", "resources": {"accelerators": "T4:1",
                                                                                   "region": REGION},
                             "volumes": [{"name": "av-cli", "size_gb": 100, "mount": "/data",
                                          "type": "Standard_LRS"}]}))
    r = gtrain("create", "-f", str(p), "av-cli")
    assert r.returncode == 0 and "volume av-cli: gtrain-av-cli in eastus, 100 GB Standard_LRS" in r.stdout, r.stderr
    r = gtrain("ls", "--provider", "azure", "--json")
    assert r.returncode == 0, r.stderr
    [v] = [v for v in json.loads(r.stdout)["volumes"] if v["name"] == "av-cli"]
    assert (v["region"], v["state"], v["usd_per_month"]) == (REGION, "available", 4.5)
    r = gtrain("delete", "av-cli", "--provider", "azure", "--yes")
    assert r.returncode == 0 and "deleted volume av-cli (gtrain-av-cli, eastus)" in r.stdout, r.stderr
    r = gtrain("delete", "av-cli", "--provider", "azure", "--yes")
    assert r.returncode == 2 and "no volume av-cli" in r.stderr and "Traceback" not in r.stderr


def test_mount_runs_on_node_0_by_lun() -> None:
    class R:
        def __init__(self) -> None:
            self.scripts: list[str] = []

        def run(self, script: str, timeout: float = 0) -> None:
            self.scripts.append(script)

    store = StateStore()
    try:
        vols = AzureProvider(store).volumes(azure_options({"subscription": SUBSCRIPTION}))
        r = R()
        vols.mount(lambda: [r], [{"name": "d", "id": "gtrain-d", "mount": "/d", "read_only": False, "lun": 2,
                                  "device": "/dev/disk/azure/scsi1/lun2"}], reachable=True)  # type: ignore[list-item]
        [s] = r.scripts
        assert "/dev/disk/azure/scsi1/lun2" in s and "/dev/disk/azure/data/by-lun/2" in s and "mkfs.ext4" in s
    finally:
        store.close()
