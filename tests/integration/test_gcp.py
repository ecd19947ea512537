"""The GCP provider against the session's fake Compute Engine (tests/fixtures/fake_gce.py): the real
google-cloud-compute client over HTTP, pointed there by CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE. The fake checks
request bodies like the API; failures (capacity, quota) and Spot preemptions are injected in the fake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gtrain.context import Context
from gtrain.errors import CapacityError, ConfigError, QuotaError
from gtrain.providers.cloud.billing import HOURS_PER_MONTH
from gtrain.providers.cloud.keys import key_path
from gtrain.providers.gcp.api import compute_endpoint
from gtrain.providers.gcp.provider import PD_USD_PER_GB_MONTH, GCPProvider
from gtrain.runs import cluster as core
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import CostInterval, StateStore
from tests.fixtures.fake_gce import PROJECT, FakeGCE

pytestmark = pytest.mark.usefixtures("fake_gce")

REGION = "us-central1"
LABELS = ("gtrain-cluster", "gtrain-cluster-name", "gtrain-owner", "gtrain-created", "gtrain-rank")


def spec(name: str, nodes: int = 1, *, resources: dict[str, Any] | None = None, **gcp: Any) -> ClusterSpec:
    res = {"accelerators": "T4:1", "region": REGION, "disk_gb": 100, **(resources or {})}
    return parse_spec({"name": name, "provider": "gcp", "num_nodes": nodes, "resources": res,
                       "policies": {"max_hours": 2},
                       "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05, **gcp}})


def context() -> Context:
    ctx = Context(store=StateStore())
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report)
    return ctx


def gone(fake: FakeGCE, cid: str) -> bool:
    return fake.of_cluster(cid) == {"instance": [], "firewall": []}


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GTRAIN_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


# ---------------------------------------------------------------------------------------------- up / down


def test_endpoint_override_in_gclouds_form() -> None:
    assert os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"].endswith("/compute/v1/")
    assert compute_endpoint() is not None and not compute_endpoint().endswith("/")  # type: ignore[union-attr]


@pytest.mark.parametrize("nodes", [1, 4])
def test_up_down_leaves_nothing(fake_gce: FakeGCE, nodes: int) -> None:
    ctx = context()
    s = spec(f"gcp-updown-{nodes}", nodes)
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None and c.status == "up" and res.created
    assert res.plan.instance_type == "n1-standard-4" and res.plan.market == "on-demand"
    nodes_ = ctx.store.nodes(c.id)
    assert [n.rank for n in nodes_] == list(range(nodes))
    assert [n.instance_id for n in nodes_] == [f"{c.id}-{r}" for r in range(nodes)]
    assert len({n.zone for n in nodes_}) == 1 and nodes_[0].zone == "us-central1-a"
    assert all(n.address and n.address.startswith("10.128.") for n in nodes_)
    assert all(n.meta["ssh"]["host"].startswith("34.1.") for n in nodes_)  # the external address, port 22
    mine = fake_gce.of_cluster(c.id)
    assert len(mine["instance"]) == nodes and mine["firewall"] == [f"gtrain-{c.id}-int", f"gtrain-{c.id}-ssh"]
    key = key_path(c.id)
    assert key.exists() and (key.stat().st_mode & 0o777) == 0o600
    # the firewall: 22 from the CIDR asked for only, everything between the cluster's own instances (by tag)
    ssh, internal = fake_gce.firewalls[f"gtrain-{c.id}-ssh"], fake_gce.firewalls[f"gtrain-{c.id}-int"]
    assert ssh["sourceRanges"] == ["198.51.100.7/32"] and ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh["targetTags"] == [f"gtrain-{c.id}"] and "sourceTags" not in ssh
    assert internal["sourceTags"] == internal["targetTags"] == [f"gtrain-{c.id}"]
    assert internal["allowed"] == [{"IPProtocol": "all"}] and "sourceRanges" not in internal
    # what was sent: the T4 attached to the N1 type, TERMINATE on maintenance, the key in metadata
    body = next(b for b in fake_gce.inserts if b["name"] == f"{c.id}-0")
    assert body["guestAccelerators"] == [{"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
                                          "acceleratorCount": 1}]
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["scheduling"].get("provisioningModel") == "STANDARD"
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["ssh-keys"].startswith("gtrain:ssh-ed25519 ")
    assert meta["ssh-keys"].split()[1] == key.with_suffix(".pub").read_text().split()[1]
    assert body["tags"]["items"] == [f"gtrain-{c.id}"]
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "100" and body["disks"][0]["autoDelete"]
    assert [s.status for s in ctx.provider("gcp").describe(c)] == ["running"] * nodes
    down = core.down(s.name, ctx)
    assert not down.already_down and len(down.cost.lines) == nodes
    assert gone(fake_gce, c.id)
    assert not key.exists()
    assert all(r.status == "deleted" for r in ctx.store.resources(c.id))
    assert core.down(s.name, ctx).already_down  # idempotent


def test_labels_on_everything_and_accelerator_optimized_types(fake_gce: FakeGCE) -> None:
    ctx = context()
    s = spec("gcp-labels", 2, resources={"accelerators": "A100:8"}, labels={"team": "ml"})
    c = core.up(s, ctx).cluster
    assert c is not None and c.instance_type == "a2-highgpu-8g"
    try:
        bodies = [b for b in fake_gce.inserts if b["name"].startswith(f"{c.id}-")]
        assert len(bodies) == 2
        for b in bodies:
            assert "guestAccelerators" not in b  # A2 has its GPUs built in
            for labels in (b["labels"], b["disks"][0]["initializeParams"]["labels"]):
                assert set(LABELS[:4]) | {"team"} <= set(labels), labels
                assert labels["gtrain-cluster"] == c.id and labels["gtrain-cluster-name"] == "gcp-labels"
            assert b["labels"]["gtrain-rank"] == b["name"].rsplit("-", 1)[1]
        for fw in fake_gce.of_cluster(c.id)["firewall"]:  # firewall rules take no labels: id in name + description
            assert c.id in fake_gce.firewalls[fw]["description"]
    finally:
        core.down(s.name, ctx)
    assert gone(fake_gce, c.id)


def test_spot_and_preempted_in_status(fake_gce: FakeGCE) -> None:
    ctx = context()
    s = spec("gcp-spot", 2, resources={"use_spot": True})
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None and res.plan.market == "spot" and c.market == "spot"
    nodes = ctx.store.nodes(c.id)
    sched = next(b for b in fake_gce.inserts if b["name"] == nodes[0].instance_id)["scheduling"]
    assert sched == {"onHostMaintenance": "TERMINATE", "automaticRestart": False, "provisioningModel": "SPOT",
                     "instanceTerminationAction": "DELETE", "maxRunDuration": {"seconds": "7200"}}  # max_hours 2
    fake_gce.preempt(nodes[1].instance_id or "")  # GCE takes node 1 back: deleted, with a preempted operation
    st = core.status(ctx, s.name)[0]
    assert [n["status"] for n in st["nodes"]] == ["running", "preempted"]
    assert "preempted by Compute Engine" in st["nodes"][1]["detail"]
    core.down(s.name, ctx)
    assert gone(fake_gce, c.id)


def test_rerun_of_up_makes_only_what_is_missing(fake_gce: FakeGCE) -> None:
    ctx = context()
    s = spec("gcp-rerun", 3)
    c = core.up(s, ctx).cluster
    assert c is not None
    ids = {k: v["id"] for k, v in fake_gce.instances.items() if v["labels"]["gtrain-cluster"] == c.id}
    fws = {n: fake_gce.firewalls[n]["id"] for n in fake_gce.of_cluster(c.id)["firewall"]}
    # as after a crash in the middle of `up`: node 2 never came up, the cluster is not "up"
    del fake_gce.instances[("us-central1-a", f"{c.id}-2")]
    ctx.store.update_cluster(c.id, status="failed")
    again = core.up(s, ctx)
    assert again.created and again.cluster is not None and again.cluster.id == c.id
    now = {k: v["id"] for k, v in fake_gce.instances.items() if v["labels"]["gtrain-cluster"] == c.id}
    assert len(now) == 3
    assert all(now[k] == ids[k] for k in ids if k[1] != f"{c.id}-2") and now[("us-central1-a", f"{c.id}-2")] != \
        ids[("us-central1-a", f"{c.id}-2")]
    assert {n: fake_gce.firewalls[n]["id"] for n in fws} == fws  # not made again
    assert not core.up(s, ctx).created  # a plain re-run with the cluster up changes nothing
    core.down(s.name, ctx)
    assert gone(fake_gce, c.id)


# ---------------------------------------------------------------------------------------------- failover


def test_capacity_failover_to_next_zone_cleans_the_failed_zone(fake_gce: FakeGCE) -> None:
    # us-central1-a has room for two nodes, then runs out (the operation ends in ZONE_RESOURCE_POOL_EXHAUSTED)
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", after=2)
    ctx = context()
    s = spec("gcp-failover", 4, resources={"zones": ["us-central1-a", "us-central1-b"]})
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None and res.plan.zone == "us-central1-b"
    assert {n.zone for n in ctx.store.nodes(c.id)} == {"us-central1-b"}
    zones = sorted(z for (z, _), v in fake_gce.instances.items() if v["labels"]["gtrain-cluster"] == c.id)
    assert zones == ["us-central1-b"] * 4  # what 1a made was deleted before moving on
    core.down(s.name, ctx)
    assert gone(fake_gce, c.id)


def test_capacity_failover_to_next_region(fake_gce: FakeGCE) -> None:
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", as_http=True)
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-b")
    ctx = context()
    s = spec("gcp-region-failover", 1, resources={"region": None, "regions": ["us-central1", "us-east1"],
                                                  "zones": ["us-central1-a", "us-central1-b", "us-east1-c"]})
    res = core.up(s, ctx)
    c = res.cluster
    assert c is not None and c.region == "us-east1" and res.plan.region == "us-east1"
    assert ctx.store.nodes(c.id)[0].zone == "us-east1-c"
    assert c.price_per_hour == pytest.approx(res.plan.price_per_hour)
    core.down(s.name, ctx)
    assert gone(fake_gce, c.id)


def test_capacity_error_lists_attempts_and_leaves_nothing(fake_gce: FakeGCE) -> None:
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", after=1)  # half a cluster, then none
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-b")
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-c", as_http=True)
    ctx = context()
    s = spec("gcp-nocap", 2, resources={"zones": ["us-central1-a", "us-central1-b", "us-central1-c"]})
    with pytest.raises(CapacityError) as ei:
        core.up(s, ctx)
    err = ei.value
    assert [a.split(":")[0] for a in err.attempts] == ["us-central1/us-central1-a", "us-central1/us-central1-b",
                                                         "us-central1/us-central1-c"]
    assert all("ZONE_RESOURCE_POOL_EXHAUSTED" in a for a in err.attempts)
    c = ctx.store.find_cluster(s.name)
    assert c is not None and c.status == "terminated"  # nothing made, nothing owned: the name is free
    assert gone(fake_gce, c.id) and not key_path(c.id).exists()
    assert all(r.status in ("deleted", "not-created") for r in ctx.store.resources(c.id))


@pytest.mark.parametrize("as_http", [True, False])
def test_quota_error_skips_the_rest_of_the_region(fake_gce: FakeGCE, as_http: bool) -> None:
    fake_gce.fail_inserts("QUOTA_EXCEEDED", as_http=as_http)
    before = len(fake_gce.inserts)
    ctx = context()
    s = spec(f"gcp-quota-{int(as_http)}", 1, resources={"zones": ["us-central1-a", "us-central1-b"]})
    with pytest.raises(QuotaError) as ei:
        core.up(s, ctx)
    assert "us-central1-a" in ei.value.message and "us-central1-b" not in ei.value.message
    assert "Quota 'NVIDIA_T4_GPUS' exceeded" in ei.value.message and len(fake_gce.inserts) == before
    c = ctx.store.find_cluster(s.name)
    assert c is not None and gone(fake_gce, c.id)


def test_a_zone_without_the_type_is_skipped_and_a_bad_zone_named(fake_gce: FakeGCE) -> None:
    fake_gce.unoffered.add(("us-central1-a", "n1-standard-4"))  # the machine type "is not found" in that zone
    ctx = context()
    s = spec("gcp-nozone", 1, resources={"zones": ["us-central1-a", "us-central1-c"]})
    c = core.up(s, ctx).cluster
    assert c is not None and ctx.store.nodes(c.id)[0].zone == "us-central1-c"
    core.down(s.name, ctx)
    # without resources.zones the zones come from the API's machine type list: 1a is not even tried
    before = len(fake_gce.requests)
    c = core.up(spec("gcp-livezones", 1), ctx).cluster
    assert c is not None and ctx.store.nodes(c.id)[0].zone == "us-central1-b"
    asked = [p for m, p in fake_gce.requests[before:] if m == "POST" and p.endswith("/instances")]
    assert asked == ["/zones/us-central1-b/instances"]
    assert ("GET", "/aggregated/machineTypes") in fake_gce.requests[before:]
    assert ("GET", "/aggregated/acceleratorTypes") in fake_gce.requests[before:]  # N1: the T4 is attached
    core.down("gcp-livezones", ctx)
    with pytest.raises(ConfigError) as ei:  # a zone that does not exist at all
        core.up(spec("gcp-badzone", 1, resources={"zones": ["us-central1-x"]}), ctx)
    assert ei.value.field == "resources.zones" and "us-central1-x" in ei.value.message
    c = ctx.store.find_cluster("gcp-badzone")
    assert c is not None and c.status == "terminated" and gone(fake_gce, c.id)


# ---------------------------------------------------------------------------------------------- gc


def test_gc_finds_orphans_after_state_is_lost(fake_gce: FakeGCE, gtrain_home: Path) -> None:
    ctx = context()
    s = spec("gcp-orphan", 2)
    c = core.up(s, ctx).cluster
    assert c is not None
    ctx.store.close()
    for p in gtrain_home.glob("state.db*"):
        p.unlink()  # the laptop is gone
    listed = run_cli("gc", "--provider", "gcp", "--json", home=gtrain_home)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert c.id in doc["clusters"] and not doc["deleted"]
    mine = sorted((o["kind"], o["id"]) for o in doc["orphans"] if o["cluster_id"] == c.id)
    assert mine == [("firewall", f"gtrain-{c.id}-int"), ("firewall", f"gtrain-{c.id}-ssh"),
                    ("instance", f"{c.id}-0"), ("instance", f"{c.id}-1")]
    assert fake_gce.of_cluster(c.id)["instance"]  # listing deletes nothing
    swept = run_cli("gc", "--provider", "gcp", "--project", PROJECT, "--yes", "--json", home=gtrain_home)
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["deleted"] and gone(fake_gce, c.id)
    again = json.loads(run_cli("gc", "--provider", "gcp", "--json", home=gtrain_home).stdout)
    assert c.id not in again["clusters"]


def test_gc_spares_live_clusters(gtrain_home: Path) -> None:
    ctx = context()
    s = spec("gcp-live", 1)
    c = core.up(s, ctx).cluster
    assert c is not None
    try:
        doc = json.loads(run_cli("gc", "--provider", "gcp", "--json", home=gtrain_home).stdout)
        assert c.id not in doc["clusters"]
    finally:
        core.down(s.name, ctx)


# ---------------------------------------------------------------------------------------------- cost


def test_cost_minimum_spot_estimate_and_disk() -> None:
    ctx = context()
    s = spec("gcp-cost", 2, resources={"use_spot": True, "disk_gb": 200})
    c = core.up(s, ctx).cluster
    assert c is not None
    report = core.down(s.name, ctx).cost
    pd = 200 * PD_USD_PER_GB_MONTH["pd-balanced"] / HOURS_PER_MONTH * 60 / 3600
    spot_catalog = 0.18  # n1-standard-4 + T4, us-central1, price_spot in the catalog
    for line in report.lines:
        assert line.hours < 60 / 3600  # up and down in seconds ...
        assert line.cost_usd == pytest.approx(60 * spot_catalog / 3600 + pd, abs=1e-6)  # ... billed 60 s
        assert line.estimate and "estimate" in (line.note or "") and "pd-balanced 200 GB" in (line.note or "")
    assert report.estimate
    provider = ctx.provider("gcp")  # two hours on-demand, per second, plus the disk
    iv = CostInterval(0, c.id, 0, "n1-standard-4", "on-demand", 0.54, 1000.0, 1000.0 + 7200.5, None, False, None)
    priced = provider.price(c, iv)
    assert priced.cost_usd == pytest.approx(7201 * 0.54 / 3600 + 200 * 0.10 / 730 * 7201 / 3600, abs=1e-6)
    assert priced.estimate and "catalog" in (priced.note or "")  # a catalog list price, not the bill


def test_catalog_prices_and_side_by_side(gtrain_home: Path) -> None:
    from gtrain.catalog import lookup

    t4 = [o for o in lookup("gcp", "n1-standard-4", REGION) if o.gpu_name == "T4"]
    assert t4[0].price_spot == 0.18 and t4[0].price_ondemand == 0.54
    r = run_cli("catalog", "--gpu", "A100", "--json", home=gtrain_home)
    assert r.returncode == 0, r.stderr
    assert {"aws", "gcp"} <= {o["provider"] for o in json.loads(r.stdout)["offers"]}


# ---------------------------------------------------------------------------------------------- bad input


def write_spec(tmp_path: Path, resources: dict[str, Any], gcp: dict[str, Any] | None = None) -> Path:
    import yaml

    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"name": "bad", "provider": "gcp", "resources": resources,
                                 "gcp": gcp or {"ssh_cidr": "198.51.100.7/32"}}))
    return p


@pytest.mark.parametrize(("resources", "gcp", "field"), [
    ({"instance_type": "n9-mega"}, None, "resources.instance_type"),
    ({"accelerators": "H100:3"}, None, "resources.accelerators"),
    ({"accelerators": "H100:8", "region": "asia-east1"}, None, "resources.region"),
    ({"accelerators": "T4:1", "regions": ["us-central1", "eu-north1"]}, None, "resources.regions[1]"),
    ({"accelerators": "T4:1", "zones": ["us-east1-b"], "region": "us-central1"}, None, "resources.zones[0]"),
    ({"accelerators": "T4:1"}, {"ssh_cidr": "everyone"}, "gcp.ssh_cidr"),
    ({"accelerators": "T4:1"}, {"ssh_proxy_command": "nc host 22"}, "gcp.ssh_proxy_command"),
    ({"accelerators": "T4:1"}, {"labels": {"Team": "ml"}}, "gcp.labels"),
    ({"accelerators": "T4:1"}, {"disk_type": "hdd"}, "gcp.disk_type"),
    ({"accelerators": "T4:1"}, {"sshcidr": "auto"}, "gcp.sshcidr"),
])
def test_bad_input_is_a_config_error_naming_the_field(tmp_path: Path, gtrain_home: Path, resources: dict[str, Any],
                                                      gcp: dict[str, Any] | None, field: str) -> None:
    r = run_cli("up", str(write_spec(tmp_path, resources, gcp)), "--dry-run", "--json", home=gtrain_home)
    assert r.returncode == 2, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["error"] == "ConfigError" and doc["field"] == field, doc
    assert field.split("[")[0].split(".")[-1] in doc["message"]


def test_dry_run_plan(tmp_path: Path, gtrain_home: Path, fake_gce: FakeGCE) -> None:
    before = len(fake_gce.inserts)
    p = write_spec(tmp_path, {"accelerators": "H100:8", "use_spot": True, "regions": ["us-east4", "us-central1"]})
    r = run_cli("up", str(p), "--dry-run", "--json", home=gtrain_home)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan["instance_type"] == "a3-highgpu-8g" and plan["market"] == "spot" and plan["region"] == "us-east4"
    assert plan["gpus_per_node"] == 8 and plan["price_per_hour"] > 0 and plan["zone"] == "us-east4-a"
    assert any("us-central1" in n for n in plan["notes"]) and any("estimate" in n for n in plan["notes"])
    assert len(fake_gce.inserts) == before


def test_no_project_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")  # a service account key names its project
    ctx = context()
    with pytest.raises(ConfigError) as ei:
        core.up(spec("gcp-noproj", 1), ctx)
    assert ei.value.field == "gcp.project"
    c = ctx.store.find_cluster("gcp-noproj")
    assert c is not None and c.status == "terminated"


def test_ssh_cidr_auto_fails_soft_without_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_CHECKIP_URL", "http://127.0.0.1:9/")  # nothing listens on the discard port
    ctx = context()
    with pytest.raises(ConfigError) as ei:
        core.up(spec("gcp-cidr", 1, ssh_cidr="auto"), ctx)
    assert ei.value.field == "gcp.ssh_cidr" and "0.0.0.0/0" in (ei.value.hint or "")


# ---------------------------------------------------------------------------------------------- clients


def test_clients_injected_through_the_constructor(fake_gce: FakeGCE, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1
    from google.oauth2.credentials import Credentials

    from gtrain.providers.gcp.api import GCEClients
    from tests.fixtures.fake_gce import GOOGLE_TOKEN

    monkeypatch.delenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE")  # only the injected clients know the fake
    kw: dict[str, Any] = {"credentials": Credentials(token=GOOGLE_TOKEN), "transport": "rest",
                          "client_options": ClientOptions(api_endpoint=fake_gce.endpoint)}
    clients = GCEClients(compute_v1.InstancesClient(**kw), compute_v1.ZoneOperationsClient(**kw),
                         compute_v1.FirewallsClient(**kw), compute_v1.GlobalOperationsClient(**kw))
    ctx = Context(store=StateStore())
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report, clients=clients)
    s = spec("gcp-injected", 1, project=PROJECT)
    c = core.up(s, ctx).cluster
    assert c is not None and fake_gce.of_cluster(c.id)["instance"] == [f"{c.id}-0"]
    core.down(s.name, ctx)
    assert gone(fake_gce, c.id)


def test_no_credentials_is_a_credentials_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from gtrain.errors import CredentialsError

    monkeypatch.delenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE")  # the real endpoint: credentials are needed
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")  # (the fake's service account key: none here)
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # and there is no metadata server here
    ctx = context()
    with pytest.raises(CredentialsError) as ei:
        core.up(spec("gcp-nocreds", 1, project=PROJECT), ctx)
    assert "credentials" in ei.value.message.lower()
    c = ctx.store.find_cluster("gcp-nocreds")
    assert c is not None and c.status == "terminated"


def test_time_and_cost_limits_become_the_vms_own_run_duration(fake_gce: FakeGCE) -> None:
    ctx = context()
    before = len(fake_gce.inserts)
    s = parse_spec({"name": "gcp-limits", "provider": "gcp", "num_nodes": 2,
                    "resources": {"accelerators": "T4:1", "region": REGION, "zones": ["us-central1-a"]},
                    "policies": {"max_hours": 3, "max_cost_usd": 1.0},
                    "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    plan = core.up(s, ctx, dry_run=True).plan
    assert any("deletes itself" in n and "maxRunDuration" in n for n in plan.notes), plan.notes
    try:
        core.up(s, ctx)
        bodies = fake_gce.inserts[before:]
        assert len(bodies) == 2
        # $1 over 2 nodes at the T4 node's $/h is under 3 h: the cost cap is the tighter one
        per_node = plan.price_per_hour or 0.0
        want = int(1.0 / (per_node * 2) * 3600)
        for b in bodies:
            sched = b["scheduling"]
            assert sched["maxRunDuration"]["seconds"] == str(want) and sched["instanceTerminationAction"] == "DELETE"
            assert sched["provisioningModel"] == "STANDARD"
    finally:
        core.down(s.name, ctx)
    # no limit: no run duration
    before = len(fake_gce.inserts)
    s2 = parse_spec({"name": "gcp-nolimit", "provider": "gcp", "num_nodes": 1,
                     "resources": {"accelerators": "T4:1", "region": REGION, "zones": ["us-central1-a"]},
                     "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    try:
        core.up(s2, ctx)
        assert "maxRunDuration" not in fake_gce.inserts[before]["scheduling"]
    finally:
        core.down(s2.name, ctx)
