"""The azure provider against the fake Azure Resource Manager (tests/fixtures/fake_arm.py): plan and its errors,
one resource group per cluster (all tagged, deleted whole by `down`), long-running operations and 429s, region
failover on capacity answers (each failed region's group deleted), quota and credential errors as one message,
Spot eviction as a preemption, `gc` of an orphaned group, the price of a node interval. Nodes are not reached
over SSH here (``wait_ssh: false``); test_azure_e2e.py does that."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.errors import CapacityError, ConfigError, CredentialsError, QuotaError
from gtrain.providers import get_provider
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_arm import Failure, FakeARM

CIDR = "198.51.100.7/32"


def spec(name: str, **res: Any) -> dict[str, Any]:
    resources = {"accelerators": "T4:1", "region": "eastus", "disk_gb": 64, **res}
    return {"name": name, "provider": "azure", "num_nodes": 2, "resources": resources,
            "azure": {"ssh_cidr": CIDR, "wait_ssh": False, "poll_s": 0.05}}


def plan(data: dict[str, Any]) -> Any:
    store = StateStore()
    try:
        return get_provider("azure", store).plan(parse_spec(data))
    finally:
        store.close()


def test_plan_prices_from_the_catalog_and_names_bad_fields(fake_arm: FakeARM, gtrain_home: Path) -> None:
    p = plan(spec("az-plan"))
    assert (p.instance_type, p.region, p.market, p.price_per_hour) == ("Standard_NC4as_T4_v3", "eastus",
                                                                     "on-demand", 0.526)
    s = plan(spec("az-plan", accelerators="H100:8", region=None, use_spot=True))
    assert (s.instance_type, s.market, s.price_per_hour, s.gpus_per_node) == ("Standard_ND96isr_H100_v5", "spot",
                                                                             19.664, 8)
    assert any("evictionPolicy Delete" in n for n in s.notes)
    with pytest.raises(ConfigError) as e:
        plan(spec("az-plan", region="mars-1"))
    assert e.value.field == "resources.region" and "mars-1" in e.value.message
    with pytest.raises(ConfigError) as e:
        plan(spec("az-plan", accelerators=None, instance_type="Standard_NC999"))
    assert e.value.field == "resources.instance_type"
    with pytest.raises(ConfigError) as e:
        plan(spec("az-plan", accelerators="H100:8", region="westus2"))
    assert e.value.field == "resources.region"
    with pytest.raises(ConfigError) as e:
        plan({**spec("az-plan"), "azure": {"vnet_cidr": "8.8.0.0/16"}})
    assert e.value.field == "azure.vnet_cidr"
    assert fake_arm.requests == []  # a plan touches nothing


def test_up_makes_one_tagged_group_through_lro_and_429_and_down_deletes_it(fake_arm: FakeARM,
                                                                            gtrain_home: Path) -> None:
    fake_arm.throttle_every = 4  # every 4th request is throttled (Retry-After: 0)
    res = gtrain.up(parse_spec(spec("az-up")))
    assert res.created and res.cluster is not None
    cid = res.cluster.id
    assert fake_arm.of_cluster(cid) == [f"gtrain-{cid}"]
    assert fake_arm.throttled > 0
    with fake_arm.lock:
        mine = [r for (g, _, _), r in fake_arm.resources.items() if g == f"gtrain-{cid}".lower()]
    kinds = sorted(r["type"].split("/")[1] for r in mine)
    assert kinds == ["networkInterfaces"] * 2 + ["networkSecurityGroups"] + ["publicIPAddresses"] * 2 \
        + ["virtualMachines"] * 2 + ["virtualNetworks"]
    assert all(r["tags"]["gtrain-cluster"] == cid for r in mine)
    nsg = next(r for r in mine if r["type"].endswith("networkSecurityGroups"))
    rules = nsg["properties"]["securityRules"]
    assert [(x["properties"]["sourceAddressPrefix"], x["properties"]["destinationPortRange"]) for x in rules] \
        == [(CIDR, "22")]
    vm = fake_arm.vm(f"{cid}-0")
    assert vm is not None and vm["properties"]["hardwareProfile"]["vmSize"] == "Standard_NC4as_T4_v3"
    assert "priority" not in vm["properties"]
    assert any(r.startswith("GET ") and "/operations/" in r for r in fake_arm.requests)  # LRO polled
    st = gtrain.status("az-up")[0]
    assert [n["status"] for n in st["nodes"]] == ["running", "running"]
    down = gtrain.down("az-up")
    assert not down.already_down and len(down.cost.lines) == 2
    assert fake_arm.of_cluster(cid) == []
    assert any(r == f"DELETE /subscriptions/{fake_arm_sub()}/resourcegroups/gtrain-{cid}" for r in fake_arm.requests)


def fake_arm_sub() -> str:
    from tests.fixtures.fake_arm import SUBSCRIPTION

    return SUBSCRIPTION


def test_capacity_moves_to_the_next_region_and_leaves_nothing_behind(fake_arm: FakeARM, gtrain_home: Path) -> None:
    fake_arm.fail_vms.append(Failure("eastus", "AllocationFailed", "Allocation failed. We do not have sufficient "
                                     "capacity for the requested VM size in this region.", as_op=True))
    fake_arm.fail_vms.append(Failure("westus2", "SkuNotAvailable", "The requested size is not available."))
    res = gtrain.up(parse_spec(spec("az-fo", region=None, regions=["eastus", "westus2", "westeurope"],
                                    use_spot=True)))
    assert res.cluster is not None
    cid = res.cluster.id
    with fake_arm.lock:
        locs = {g["location"] for g in fake_arm.groups.values() if g["tags"].get("gtrain-cluster") == cid}
    assert locs == {"westeurope"}  # eastus and westus2's groups were deleted
    vm = fake_arm.vm(f"{cid}-1")
    assert vm is not None and vm["properties"]["priority"] == "Spot"
    assert vm["properties"]["evictionPolicy"] == "Delete" and vm["properties"]["billingProfile"]["maxPrice"] == -1
    # a Spot eviction (evictionPolicy Delete): the node is preempted, not missing
    fake_arm.evict(f"{cid}-1")
    store = StateStore()
    try:
        cl = store.get_cluster_by_id(cid)
        assert [(s.rank, s.status) for s in get_provider("azure", store).describe(cl)] == [(0, "running"),
                                                                                          (1, "preempted")]
    finally:
        store.close()
    gtrain.down("az-fo")
    assert fake_arm.of_cluster(cid) == []


def test_no_capacity_anywhere_or_no_quota_is_one_error_and_nothing_is_left(fake_arm: FakeARM,
                                                                             gtrain_home: Path) -> None:
    fake_arm.fail_vms.append(Failure(None, "ZonalAllocationFailed", "Allocation failed."))
    with pytest.raises(CapacityError) as e:
        gtrain.up(parse_spec(spec("az-nocap", region=None, regions=["eastus", "westus2"])))
    assert "eastus" in str(e.value.attempts) and "westus2" in str(e.value.attempts)
    with fake_arm.lock:
        assert fake_arm.groups == {} and fake_arm.resources == {}
    fake_arm.fail_vms[:] = [Failure(None, "OperationNotAllowed", "Operation could not be completed as it results "
                                    "in exceeding approved standardNCASv3_T4 Family Cores quota.")]
    with pytest.raises(QuotaError) as q:
        gtrain.up(parse_spec(spec("az-noquota")))
    assert "quota" in q.value.message.lower() and "Usage + quotas" in (q.value.hint or "")
    with fake_arm.lock:
        assert fake_arm.groups == {}


def test_bad_credentials_are_one_clear_message_exit_1(fake_arm: FakeARM, gtrain_home: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_AZURE_ACCESS_TOKEN", "expired")
    with pytest.raises(CredentialsError) as e:
        gtrain.up(parse_spec(spec("az-cred")))
    assert "InvalidAuthenticationToken" in e.value.message and "az login" in (e.value.hint or "")
    f = tmp_path / "s.json"
    f.write_text(json.dumps(spec("az-cred2")))
    r = subprocess.run([sys.executable, "-m", "gtrain", "up", str(f), "--yes"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "InvalidAuthenticationToken" in r.stderr and "expired" not in r.stderr
    with fake_arm.lock:
        assert fake_arm.groups == {}
    f.write_text(json.dumps(spec("az-bad", region="eastus9")))
    r = subprocess.run([sys.executable, "-m", "gtrain", "up", str(f), "--dry-run"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "resources.region" in r.stderr and "eastus9" in r.stderr
    assert "Traceback" not in r.stderr


def test_gc_finds_an_orphaned_group_by_tag_and_deletes_it(fake_arm: FakeARM, gtrain_home: Path) -> None:
    res = gtrain.up(parse_spec(spec("az-gc")))
    assert res.cluster is not None
    cid = res.cluster.id
    (gtrain_home / "state.db").unlink()  # state lost: only the tags know
    for extra in ("state.db-wal", "state.db-shm"):
        (gtrain_home / extra).unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-m", "gtrain", "gc", "--provider", "azure", "--json"], capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["clusters"] == [cid] and not doc["deleted"]
    store = StateStore()
    try:
        p = get_provider("azure", store)
        found = p.gc(None, set(), delete=False)
        assert [(o.cluster_id, o.kind, o.id, o.region) for o in found.orphans] == [
            (cid, "resource-group", f"gtrain-{cid}", "eastus")]
        assert p.gc(["westus2"], set(), delete=False).orphans == []
        assert p.gc(None, {cid}, delete=False).orphans == []  # a live cluster's group is not an orphan
        done = p.gc(None, set(), delete=True)
        assert done.deleted and done.left == []
    finally:
        store.close()
    assert fake_arm.of_cluster(cid) == []


def test_interval_price_and_catalog_listing(fake_arm: FakeARM, gtrain_home: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gtrain", "catalog", "--provider", "azure", "--gpu", "H100"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Standard_ND96isr_H100_v5" in r.stdout, r.stderr
    from gtrain.providers.azure import AzureProvider
    from gtrain.state import CostInterval

    store = StateStore()
    try:
        res = gtrain.up(parse_spec(spec("az-price", use_spot=True)))
        assert res.cluster is not None
        p = AzureProvider(store)
        iv = CostInterval(id=0, cluster_id=res.cluster.id, node_rank=0, instance_type="Standard_NC4as_T4_v3",
                          market="spot", price_per_hour=0.0789, started_at=1000.0, stopped_at=1000.0 + 3600,
                          cost_usd=None, estimate=True, note=None)
        cost = p.price(res.cluster, iv)
        assert cost.cost_usd == pytest.approx(0.0789 + 64 * 0.15 / 730, abs=1e-6) and cost.estimate
    finally:
        store.close()
        gtrain.down("az-price")


def test_help_and_status_import_no_azure_sdk(fake_arm: FakeARM, gtrain_home: Path) -> None:
    res = gtrain.up(parse_spec(spec("az-fast")))
    assert res.cluster is not None
    try:
        for args in (["status"], ["--help"], ["status", "--json"]):
            r = subprocess.run([sys.executable, "-X", "importtime", "-m", "gtrain", *args], capture_output=True,
                               text=True, timeout=60, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, r.stderr[-2000:]
            mods = {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines()
                    if ln.startswith("import time:") and "|" in ln}
            assert "gtrain" in mods and not [m for m in mods if m.split(".")[0] in ("azure", "msal", "paramiko")]
            assert "az-fast" in r.stdout or args == ["--help"]
    finally:
        gtrain.down("az-fast")


def test_arm_client_waits_out_retry_after_and_follows_location(fake_arm: FakeARM) -> None:
    """429 + Retry-After: 1 is waited out (not hammered); a 202 + Location delete is polled until 200."""
    import time

    from gtrain.providers.azure.api import V_RESOURCES, ARM_Client

    arm = ARM_Client(fake_arm_sub())
    arm.put(arm.sub("/resourcegroups/gtrain-lro"), V_RESOURCES, {"location": "eastus", "tags": {}}, "rg")
    fake_arm.throttle_every, fake_arm.retry_after = 2, "1"
    fake_arm.requests.clear()
    t0 = time.monotonic()
    got = arm.get(arm.sub("/resourcegroups/gtrain-lro"), V_RESOURCES)  # request 1: answered
    got = arm.get(arm.sub("/resourcegroups/gtrain-lro"), V_RESOURCES)  # request 2: 429, then answered
    assert got is not None and got["location"] == "eastus"
    assert arm.throttled >= 1 and time.monotonic() - t0 >= 1.0 * arm.throttled  # each 429 waited its Retry-After
    fake_arm.throttle_every = 0
    fake_arm.op_delay = 0.3
    try:
        arm.delete(arm.sub("/resourcegroups/gtrain-lro"), V_RESOURCES, "rg delete")
    finally:
        fake_arm.op_delay = 0.05
    assert any("/operationresults/" in r for r in fake_arm.requests)  # polled at its Location
    assert arm.get(arm.sub("/resourcegroups/gtrain-lro"), V_RESOURCES) is None


def test_a_replacement_without_capacity_keeps_the_other_nodes(fake_arm: FakeARM, gtrain_home: Path) -> None:
    """A node replaced (launch --replace-bad, recovery) where Azure has no capacity: a CapacityError, the new
    VM's attempt removed, and the cluster's other node and its group left as they were."""
    res = gtrain.up(parse_spec(spec("az-repl")))
    assert res.cluster is not None
    cid = res.cluster.id
    fake_arm.fail_vms.append(Failure("eastus", "AllocationFailed", "Allocation failed.", as_op=True))
    store = StateStore()
    try:
        with pytest.raises(CapacityError):
            get_provider("azure", store).replace_nodes(store.get_cluster_by_id(cid), [1])
    finally:
        store.close()
    assert fake_arm.of_cluster(cid) == [f"gtrain-{cid}"]
    assert fake_arm.vm(f"{cid}-0") is not None and fake_arm.vm(f"{cid}-1") is None
    with fake_arm.lock:
        names = sorted(n for (_, t, n) in fake_arm.resources if t in ("networkinterfaces", "publicipaddresses"))
    assert names == [f"{cid}-0-ip", f"{cid}-0-nic"]
    fake_arm.fail_vms.clear()
    gtrain.down("az-repl")
    assert fake_arm.of_cluster(cid) == []


def test_no_credentials_at_all_is_one_message(fake_arm: FakeARM, gtrain_home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No GTRAIN_AZURE_ACCESS_TOKEN: DefaultAzureCredential (or, without azure-identity, its absence) decides, and
    finding nothing is one CredentialsError naming `az login`, with nothing created."""
    for k in ("GTRAIN_AZURE_ACCESS_TOKEN", "AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET",
              "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT", "MSI_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(gtrain_home / "no-az-cli"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(CredentialsError) as e:
        gtrain.up(parse_spec(spec("az-nocred")))
    assert "az login" in (e.value.hint or "") and "\n" not in e.value.message
    with fake_arm.lock:
        assert fake_arm.groups == {} and fake_arm.requests == []
