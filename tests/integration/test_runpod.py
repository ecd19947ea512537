"""provider runpod on the fake RunPod API v2 (tests/fixtures/fake_runpod.py, written from RunPod's OpenAPI
document): up on one pod whose published SSH port is a real sshd host (the fake hands the hosts of
tests/fixtures/sshd.py out as the pods' ``ssh.direct`` endpoints and installs each pod's ``PUBLIC_KEY``), a
one-line job launched, waited for and its logs read, the price frozen from the pod's own ``cost``, down leaving
nothing; two nodes as one Instant Cluster running a 2-node torchrun job; a pod RunPod takes away mid-job recovered
on a new pod; gc of an orphaned pod and an orphaned Instant Cluster by tag with the local state gone; ``any_of``
pricing runpod beside lambda; the errors at the edge (bad key, 402, no capacity anywhere, 429 and 503 ridden out,
spot and a COMMUNITY cluster refused with exit 2); ``gtrain check runpod`` with a good, missing, revoked key; the
fake refusing what RunPod refuses."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.errors import CapacityError, ConfigError, CredentialsError, QuotaError
from gtrain.providers import check_providers, get_provider
from gtrain.remote import ssh as sshmod
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_runpod import API_KEY, FakeRunPod

TARGET = "gtrain.providers.runpod:RunPodProvider"


@pytest.fixture(autouse=True)
def _runpod_registered() -> Any:
    """The provider by name, whether or not gtrain/registry.py lists it yet (registered at run time if not)."""
    from gtrain.providers import register, unregister
    from gtrain.registry import REGISTRY

    if "runpod" in REGISTRY:
        yield
        return
    register("runpod", TARGET)
    try:
        yield
    finally:
        unregister("runpod")


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``gtrain ARGS`` in a new process, the provider registered there too when the registry does not list it."""
    boot = ("import sys; from gtrain.registry import REGISTRY; from gtrain.providers import register\n"
            f"'runpod' in REGISTRY or register('runpod', {TARGET!r})\n"
            "sys.argv = ['gtrain', *sys.argv[1:]]; from gtrain.cli.app import main; main()")
    return subprocess.run([sys.executable, "-c", boot, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def spec(name: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "provider": "runpod", "num_nodes": 1,
                         "resources": {"accelerators": "RTX4090:1", "region": "US-TX-3"},
                         "runpod": {"wait_ssh": False, "poll_s": 0.05}}
    d.update(over)
    return d


def live(fake: FakeRunPod) -> list[str]:
    with fake.lock:
        fake._tick()
        return sorted(p["name"] for p in fake.pods.values() if p["status"] != "TERMINATED")


def two_hosts(ssh_hosts: Any) -> list[Any]:
    return [ssh_hosts[2], ssh_hosts[3]] if len(ssh_hosts) >= 4 else [ssh_hosts[0], ssh_hosts[1]]


def test_up_launch_logs_price_frozen_then_down_leaves_nothing(fake_runpod: FakeRunPod, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path, gtrain_home: Path) -> None:
    sshmod.close_all()
    hosts = two_hosts(ssh_hosts)
    fake_runpod.use_hosts(hosts)
    fake_runpod.fail["EU-RO-1"] = "capacity"  # the first data center cannot place it: the pod lands in the second
    fake_runpod.cost_factor = 1.1  # the pod bills $0.759/h against a list price of $0.69/h
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("import os; print('hello from runpod node', os.environ['GTRAIN_NODE_RANK'])\n")
    s = spec("rp-e2e", resources={"accelerators": "RTX4090:1", "regions": ["EU-RO-1", "US-TX-3"]},
             job={"workdir": str(work), "run": "hello.py", "python": sys.executable, "launcher": "python"})
    s["runpod"] = {"ssh_user": hosts[0].user, "ssh_timeout_s": 30, "poll_s": 0.1}
    before = live(fake_runpod)
    plan = gtrain.up(parse_spec(s), dry_run=True).plan
    assert plan.price_per_hour == 0.69 and plan.instance_type == "NVIDIA GeForce RTX 4090", plan
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    try:
        assert [b.get("dataCenterIds") for b in fake_runpod.creates[-2:]] == [["EU-RO-1"], ["US-TX-3"]]
        body = fake_runpod.creates[-1]
        assert body["ports"] == ["22/tcp"] and body["env"]["GTRAIN_CLUSTER_ID"] == res.cluster.id
        assert body["env"]["PUBLIC_KEY"].startswith("ssh-ed25519 ") and "RUNPOD_API_KEY" not in json.dumps(body)
        store = StateStore()
        try:
            c = store.get_cluster_by_id(res.cluster.id)
            assert c.price_per_hour == pytest.approx(0.759) and c.region == "US-TX-3"  # the pod's cost, frozen
        finally:
            store.close()
        gtrain.launch(cluster="rp-e2e")
        lines: list[Any] = []
        job = gtrain.wait("rp-e2e", on_line=lines.append)
        assert (job.status, job.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-20:]
        again: list[Any] = []
        gtrain.logs("rp-e2e", on_line=again.append)
        assert any("hello from runpod node 0" in ln.text for ln in again), [ln.text for ln in again][-20:]
    finally:
        down = gtrain.down("rp-e2e")
    assert down.cost.lines and down.cost.lines[0].cost_usd > 0
    assert live(fake_runpod) == before  # no pod left
    assert not any(API_KEY.encode() in p.read_bytes() for p in gtrain_home.rglob("*") if p.is_file())


def test_two_nodes_are_one_instant_cluster_end_to_end(fake_runpod: FakeRunPod, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                       tmp_path: Path, gtrain_home: Path) -> None:
    """num_nodes 2: one RunPod Instant Cluster (POST /v2/clusters), its two members' SSH ports two sshd hosts, a
    2-node torchrun job across them, each member priced at its own cost; a member cannot be replaced alone; down
    deletes the cluster and its pods."""
    sshmod.close_all()
    hosts = two_hosts(ssh_hosts)
    fake_runpod.use_hosts(hosts)
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("import os; print('hello from node', os.environ['GTRAIN_NODE_RANK'], 'rank', "
                                   "os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n")
    s = spec("rp-two", num_nodes=2, resources={"accelerators": "H100:8", "regions": ["EU-RO-1", "US-TX-3"]},
             job={"workdir": str(work), "run": "hello.py", "python": sys.executable, "nproc_per_node": 1,
                  "env": {"OMP_NUM_THREADS": "1"}})
    s["runpod"] = {"ssh_user": hosts[0].user, "ssh_timeout_s": 30, "poll_s": 0.1}
    fake_runpod.fail["EU-RO-1"] = "capacity"
    before = live(fake_runpod)
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    cid = res.cluster.id
    try:
        made = fake_runpod.creates[-1]
        assert made["name"] == f"gtrain-{cid}" and made["type"] == "TRAINING" and made["dataCenterIds"] == ["US-TX-3"]
        assert made["compute"] == {"gpuTypeId": "NVIDIA H100 PCIe", "gpuCountPerPod": 8, "podCount": 2}, made
        assert live(fake_runpod) == before + [f"gtrain-{cid}-0", f"gtrain-{cid}-1"]
        store = StateStore()
        try:
            p = get_provider("runpod", store)
            cluster = store.get_cluster_by_id(cid)
            assert cluster.price_per_hour == pytest.approx(19.12)
            assert [s.status for s in p.describe(cluster)] == ["running", "running"]
            with pytest.raises(ConfigError, match="Instant Cluster"):
                p.replace_nodes(cluster, [1])
        finally:
            store.close()
        gtrain.launch(cluster="rp-two")
        lines: list[Any] = []
        job = gtrain.wait("rp-two", on_line=lines.append)
        texts = [ln.text for ln in lines]
        assert (job.status, job.exit_code) == ("succeeded", 0), texts[-20:]
        assert sorted(t.split(" rank")[0] for t in texts if t.startswith("hello from node")) == \
            ["hello from node 0", "hello from node 1"], texts[-20:]
    finally:
        down = gtrain.down("rp-two")
    assert sorted(ln.node_rank for ln in down.cost.lines) == [0, 1]
    assert live(fake_runpod) == before and not [c for c in fake_runpod.clusters.values() if not c.get("_deleted")]


def test_gc_finds_an_orphaned_instant_cluster(fake_runpod: FakeRunPod, gtrain_home: Path) -> None:
    before = live(fake_runpod)
    res = gtrain.up(parse_spec(spec("rp-orph2", num_nodes=3, resources={"accelerators": "A40:2"})))
    assert res.cluster is not None
    cid = res.cluster.id
    (gtrain_home / "state.db").unlink()
    store = StateStore()
    try:
        p = get_provider("runpod", store)
        with fake_runpod.lock:
            others = {str(x["env"].get("GTRAIN_CLUSTER_ID")) for x in fake_runpod.pods.values()} - {cid}
        found = p.gc(None, others, delete=False)
        assert [(o.kind, o.cluster_id) for o in found.orphans] == [("pod-cluster", cid)], found.orphans
        done = p.gc(None, others, delete=True)
        assert done.deleted and done.left == []
    finally:
        store.close()
    assert live(fake_runpod) == before


def test_a_pod_taken_away_mid_job_is_recovered_on_a_new_pod(fake_runpod: FakeRunPod, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                            tmp_path: Path, gtrain_home: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """RunPod takes the running job's pod away (its machine gone, processes and all): the watcher hears it from
    the provider (``terminated``), makes a new pod for rank 0 on another machine and relaunches the job there."""
    from tests.integration import durable_nodes as dn

    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    hosts = two_hosts(ssh_hosts)
    fake_runpod.use_hosts(hosts)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text("import os, time\na = os.environ['GTRAIN_ATTEMPT']\nprint('attempt', a, flush=True)\n"
                                 "time.sleep(60 if a == '1' else 0)\nprint('finished attempt', a, flush=True)\n")
    s = spec("rp-rec", job={"workdir": str(work), "run": "job.py", "python": sys.executable, "launcher": "python"},
             policies={"recovery": {"max_restarts": 1, "backoff_s": 0}})
    s["runpod"] = {"ssh_user": hosts[0].user, "ssh_timeout_s": 30, "poll_s": 0.1}
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    try:
        store = StateStore()
        try:
            first = store.node_records(res.cluster.id)[0].instance_id
        finally:
            store.close()
        assert first is not None
        job = gtrain.launch(cluster="rp-rec")
        lines: list[Any] = []

        def on_line(ln: Any) -> None:
            lines.append(ln)
            if "attempt 1" in ln.text and first in fake_runpod.pods and fake_runpod.pods[first]["status"] == "RUNNING":
                fake_runpod.reclaim(first)  # RunPod says so; then the machine is gone with what it ran
                dn.kill9(dn.pids_where(dn.of_node(job.job_id, 0)))

        final = gtrain.wait("rp-rec", job_id=job.job_id, on_line=on_line)
        texts = [ln.text for ln in lines]
        assert (final.status, final.exit_code) == ("succeeded", 0), texts[-20:]
        assert any("finished attempt 2" in t for t in texts), texts[-20:]
        (rec,) = final.info["recoveries"]
        assert rec["lost"] == [0] and rec["reprovision"] == [0], rec
        store = StateStore()
        try:
            assert store.node_records(res.cluster.id)[0].instance_id != first
        finally:
            store.close()
    finally:
        gtrain.down("rp-rec")


def test_a_pod_taken_away_is_reported_lost_and_replaced(fake_runpod: FakeRunPod, gtrain_home: Path) -> None:
    before = live(fake_runpod)
    fake_runpod.throttle, fake_runpod.throttled = 2, 0  # HTTP 429 twice: retried after Retry-After
    fake_runpod.unavailable = 1  # and one 503: retried with a backoff
    res = gtrain.up(parse_spec(spec("rp-lost")))
    assert res.cluster is not None and fake_runpod.throttled == 2 and fake_runpod.unavailable == 0
    store = StateStore()
    try:
        p = get_provider("runpod", store)
        cluster = store.get_cluster_by_id(res.cluster.id)
        old = p.node_records(cluster)[0].instance_id
        assert [s.status for s in p.describe(cluster)] == ["running"]
        assert old is not None
        fake_runpod.reclaim(old)  # RunPod takes the pod back (the host failed, the balance ran out)
        assert [s.status for s in p.describe(cluster)] == ["terminated"]
        p.replace_nodes(cluster, [0])  # what recovery does with a lost node
        new = p.node_records(cluster)[0].instance_id
        assert new != old and [s.status for s in p.describe(cluster)] == ["running"]
    finally:
        store.close()
        down = gtrain.down("rp-lost")
    assert sorted(ln.node_rank for ln in down.cost.lines) == [0, 0]  # the lost pod and its replacement, each billed
    assert live(fake_runpod) == before


def test_gc_finds_an_orphan_by_tag_with_the_local_state_gone(fake_runpod: FakeRunPod, gtrain_home: Path) -> None:
    before = live(fake_runpod)
    res = gtrain.up(parse_spec(spec("rp-orphan")))
    assert res.cluster is not None
    cid = res.cluster.id
    (gtrain_home / "state.db").unlink()  # local state lost: only the tags say what is gtrain's
    r = cli("gc", "--provider", "runpod", "--json")
    assert r.returncode == 0, r.stderr
    assert cid in json.loads(r.stdout)["clusters"], r.stdout
    store = StateStore()
    try:
        p = get_provider("runpod", store)
        with fake_runpod.lock:  # another test's cluster in the session's fake is not this test's to sweep
            others = {str(x["env"].get("GTRAIN_CLUSTER_ID")) for x in fake_runpod.pods.values()} - {cid}
        found = p.gc(None, others, delete=False)
        assert [(o.kind, o.cluster_id, o.region) for o in found.orphans] == [("pod", cid, "US-TX-3")]
        assert fake_runpod.of_cluster(cid)  # listing deletes nothing
        done = p.gc(None, others, delete=True)
        assert done.deleted and done.left == []
    finally:
        store.close()
    assert live(fake_runpod) == before


def test_errors_at_the_edge(fake_runpod: FakeRunPod, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before, creates = live(fake_runpod), len(fake_runpod.creates)
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("rp-x", num_nodes=2, runpod={"cloud": "COMMUNITY"})), dry_run=True)
    assert e.value.field == "runpod.cloud" and "Instant Cluster" in e.value.message
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("rp-x", resources={"accelerators": "A40:1", "use_spot": True})), dry_run=True)
    assert e.value.field == "resources.use_spot" and "on-demand pods only" in e.value.message
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("rp-x", resources={"accelerators": "T4:1"})), dry_run=True)
    assert e.value.field == "resources.accelerators" and "RTX 4090" in (e.value.hint or "")
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("rp-x", resources={"accelerators": "H100:8"}, runpod={"cloud": "COMMUNITY"})),
                  dry_run=True)
    assert "not offered on RunPod's COMMUNITY cloud" in e.value.message
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("rp-x", resources={"accelerators": "A40:1", "regions": ["US-TX-3", "mars"]})))
    assert e.value.field == "resources.regions[1]"
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("rp-x", runpod={"ssh_cidr": "203.0.113.7/32"})), dry_run=True)
    assert e.value.field == "runpod.ssh_cidr"
    fake_runpod.fail.update({"US-TX-3": "capacity", "EU-RO-1": "capacity"})
    with pytest.raises(CapacityError) as cap:
        gtrain.up(parse_spec(spec("rp-x", resources={"accelerators": "A40:1", "regions": ["US-TX-3", "EU-RO-1"]})))
    assert [a.split(":")[0] for a in cap.value.attempts] == ["US-TX-3", "EU-RO-1"], cap.value.attempts
    fake_runpod.fail.update({"*": "balance", "US-TX-3": "balance"})
    with pytest.raises(QuotaError) as q:
        gtrain.up(parse_spec(spec("rp-x", resources={"accelerators": "A40:1", "regions": ["US-TX-3", "EU-RO-1"]})))
    assert "insufficient balance" in q.value.message and len(fake_runpod.creates) == creates + 3  # 402: no next
    fake_runpod.fail.clear()
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_wrong_0123456789")
    with pytest.raises(CredentialsError) as c:
        gtrain.up(parse_spec(spec("rp-x")))
    assert "rejected the API key" in c.value.message and "RUNPOD_API_KEY" in (c.value.hint or "")
    assert "rpa_wrong" not in c.value.message + (c.value.hint or "")
    assert live(fake_runpod) == before


def test_any_of_prices_runpod_beside_lambda_and_picks_the_cheaper(fake_runpod: FakeRunPod, fake_lambda: Any,
                                                                     gtrain_home: Path) -> None:
    s = parse_spec({"name": "rp-any", "num_nodes": 1, "resources": {"any_of": [
        {"provider": "lambda", "accelerators": "A10:1", "region": "us-east-1"},
        {"provider": "runpod", "accelerators": "RTX4090:1", "region": "US-TX-3"}]}})
    res = gtrain.up(s, dry_run=True)
    assert res.cluster is None and res.placement is not None
    got = [(c["provider"], c["cluster_price_per_hour"], c["outcome"]) for c in res.placement["candidates"]]
    assert got == [("runpod", 0.69, "chosen"), ("lambda", 0.75, "untried")], got
    assert res.plan.provider == "runpod" and not fake_runpod.of_cluster("")  # a dry run makes nothing


def test_cli_plans_a_cluster_and_refuses_spot_with_exit_2(fake_runpod: FakeRunPod, tmp_path: Path,
                                                          gtrain_home: Path) -> None:
    f = tmp_path / "rp.json"
    f.write_text(json.dumps(spec("rp-cli", num_nodes=2)))
    r = cli("up", str(f), "--dry-run")
    assert r.returncode == 0 and "Instant Cluster" in r.stdout + r.stderr, r.stdout + r.stderr
    f.write_text(json.dumps(spec("rp-cli", resources={"accelerators": "A40:1", "use_spot": True})))
    r = cli("up", str(f), "--dry-run")
    assert r.returncode == 2 and "resources.use_spot" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------- gtrain check


def test_check_good_key_file_missing_and_revoked(fake_runpod: FakeRunPod, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (r,) = check_providers(["runpod"], 10.0)
    assert r.ok and r.credentials == "RUNPOD_API_KEY" and (r.call or "").startswith("GET /v2/catalog/gpus: 5 GPU"), r
    monkeypatch.delenv("RUNPOD_API_KEY")
    monkeypatch.setenv("HOME", str(tmp_path))
    (r,) = check_providers(["runpod"], 10.0)
    assert not r.ok and "no API key" in r.reason and (r.fix or "").startswith("export RUNPOD_API_KEY="), r
    (tmp_path / ".runpod").mkdir()
    (tmp_path / ".runpod" / "config.toml").write_text(f'apikey = "{API_KEY}"\napiurl = "https://api.runpod.io/graphql"\n')
    (r,) = check_providers(["runpod"], 10.0)
    assert r.ok and r.credentials == "~/.runpod/config.toml", r
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_revoked_0123456789abcdef")
    (r,) = check_providers(["runpod"], 10.0)
    assert not r.ok and "rejected the API key" in r.reason and "rpa_revoked" not in r.reason, r


# ---------------------------------------------------------------------------------------------- the fake


def call(fake: FakeRunPod, path: str, body: Any = None, method: str = "POST", key: str | None = API_KEY
         ) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(fake.endpoint + path, data=None if body is None else json.dumps(body).encode(),
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def test_the_fake_refuses_what_runpod_refuses(fake_runpod: FakeRunPod) -> None:
    good = {"name": "gtrain-fakecheck-0", "image": "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404",
            "gpu": {"id": "NVIDIA A40", "count": 1}, "cloud": "SECURE", "ports": ["22/tcp"]}
    code, doc = call(fake_runpod, "/pods", {**good, "bogus": 1})
    assert code == 422 and doc["errors"] == ["$: additional properties 'bogus' not allowed"], doc
    code, doc = call(fake_runpod, "/pods", {**good, "gpu": {"id": "NVIDIA A40", "count": 1, "kind": "x"}})
    assert code == 422 and doc["errors"] == ["$.gpu: additional properties 'kind' not allowed"], doc
    code, doc = call(fake_runpod, "/pods", {**good, "cloud": "ALL"})  # GraphQL's cloudType ALL is no v2 Cloud
    assert code == 422 and "cloud" in doc["errors"][0] and doc["title"] == "Unprocessable Entity", doc
    code, doc = call(fake_runpod, "/pods", {**good, "gpu": {"id": "NVIDIA A40", "count": "1"}})
    assert code == 422 and "gpu.count: expected integer" in doc["errors"][0], doc
    code, doc = call(fake_runpod, "/pods", good, key=None)
    assert (code, doc["detail"]) == (401, "missing bearer token"), doc
    code, doc = call(fake_runpod, "/pods", good, key="rpa_not_the_key")
    assert code == 401 and doc["status"] == 401, doc
    code, doc = call(fake_runpod, "/pods/nope/action", {"action": "pause"})
    assert code == 422, doc
    group: dict[str, Any] = {"name": "gtrain-fakecheck", "type": "TRAINING", "image": good["image"],
                             "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1, "podCount": 2}}
    code, doc = call(fake_runpod, "/clusters", {**group, "cloud": "SECURE"})  # no cloud in CreateClusterRequest
    assert code == 422 and doc["errors"] == ["$: additional properties 'cloud' not allowed"], doc
    code, doc = call(fake_runpod, "/clusters", {**group, "type": "MPI"})
    assert code == 422 and "type" in doc["errors"][0], doc
    code, doc = call(fake_runpod, "/clusters", {**group, "compute": {**group["compute"], "podCount": 1}})
    assert code == 422 and "podCount" in doc["errors"][0], doc
    code, pod = call(fake_runpod, "/pods", good)  # the valid request beside them
    assert code == 201 and pod["status"] == "PROVISIONING" and pod["cost"] == 0.4, pod
    code, _ = call(fake_runpod, f"/pods/{pod['id']}", method="DELETE")
    assert code == 204
    code, made = call(fake_runpod, "/clusters", group)
    assert code == 201 and made["pods"]["total"] == 2, made
    member = next(p["id"] for p in fake_runpod.pods.values() if (p.get("cluster") or {}).get("id") == made["id"])
    code, doc = call(fake_runpod, f"/pods/{member}", method="DELETE")  # members go only with their cluster
    assert code == 409, doc
    code, _ = call(fake_runpod, f"/clusters/{made['id']}", method="DELETE")
    assert code == 204
