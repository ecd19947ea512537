"""provider vast on the fake Vast.ai API (tests/fixtures/fake_vast.py, written from Vast's API reference and the
vastai CLI): up on one instance whose published SSH port is a real sshd host (the fake hands the hosts of
tests/fixtures/sshd.py out as the instances' ``public_ipaddr``/``ports["22/tcp"]`` and installs the key attached
to each), a job launched, its logs read and its checkpoint pulled, the price frozen from the rented instance's
own rate (live, not a catalog), down leaving nothing; an interruptible bid outbid mid-job and recovered on another
offer; an offer whose instance bills above ``vast.max_usd_per_hour`` destroyed and the next taken; every offer
above what is left of ``policies.max_cost_usd`` skipped (exit 2, nothing rented); ``num_nodes: 2`` refused with
the reason; gc by label with the local state gone; the errors at the edge (bad key, no credit, 429 and 503 ridden
out); ``gtrain check vast`` with a good, missing, file and revoked key; the fake refusing what Vast refuses."""

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
from gtrain.errors import ConfigError, CredentialsError, QuotaError
from gtrain.providers import check_providers, get_provider
from gtrain.remote import ssh as sshmod
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_vast import API_KEY, FakeVast

TARGET = "gtrain.providers.vast:VastProvider"
STORAGE_GB = 100  # resources.disk_gb's default: priced into every offer's dph_total


@pytest.fixture(autouse=True)
def _vast_registered() -> Any:
    """The provider by name, whether or not gtrain/registry.py lists it yet (registered at run time if not)."""
    from gtrain.providers import register, unregister
    from gtrain.registry import REGISTRY

    if "vast" in REGISTRY:
        yield
        return
    register("vast", TARGET)
    try:
        yield
    finally:
        unregister("vast")


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    boot = ("import sys; from gtrain.registry import REGISTRY; from gtrain.providers import register\n"
            f"'vast' in REGISTRY or register('vast', {TARGET!r})\n"
            "sys.argv = ['gtrain', *sys.argv[1:]]; from gtrain.cli.app import main; main()")
    return subprocess.run([sys.executable, "-c", boot, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def spec(name: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "provider": "vast", "num_nodes": 1,
                         "resources": {"accelerators": "RTX4090:1"}, "vast": {"wait_ssh": False, "poll_s": 0.05}}
    d.update(over)
    return d


def on_demand(base: float, storage_cost: float) -> float:
    return round(base + storage_cost * STORAGE_GB / 730.0, 6)


def live(fake: FakeVast) -> list[str]:
    with fake.lock:
        return sorted(str(i["label"]) for i in fake.instances.values())


def two_hosts(ssh_hosts: Any) -> list[Any]:
    return [ssh_hosts[2], ssh_hosts[3]] if len(ssh_hosts) >= 4 else [ssh_hosts[0], ssh_hosts[1]]


def test_up_launch_logs_pull_price_frozen_live_then_down(fake_vast: FakeVast, ssh_hosts: Any, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          gtrain_home: Path) -> None:
    sshmod.close_all()
    hosts = two_hosts(ssh_hosts)
    fake_vast.use_hosts(hosts)
    fake_vast.take.add(7001)  # the cheapest reliable offer is rented by someone else before us: the next one
    fake_vast.drift[7002] = 1.1  # its host re-priced: the instance bills 10% over what the offer said
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text(
        "import os, pathlib\nprint('hello from vast node', os.environ['GTRAIN_NODE_RANK'], flush=True)\n"
        "d = pathlib.Path(os.environ['GTRAIN_CHECKPOINT_DIR']); d.mkdir(parents=True, exist_ok=True)\n"
        "(d / 'model.txt').write_text('weights')\n")
    s = spec("vast-e2e", job={"workdir": str(work), "run": "hello.py", "python": sys.executable,
                              "launcher": "python"})
    s["vast"] = {"ssh_user": hosts[0].user, "ssh_timeout_s": 30, "poll_s": 0.1}
    before = live(fake_vast)
    plan = gtrain.up(parse_spec(s), dry_run=True).plan
    # 7003 is cheaper but its host's reliability (0.80) is under vast.min_reliability's 0.95
    assert plan.price_per_hour == on_demand(0.30, 0.15) and plan.instance_type == "1x RTX 4090", plan
    assert plan.region == "CA" and any("offer 7001" in n for n in plan.notes), plan.notes
    q = fake_vast.searches[-1]
    assert q["gpu_name"] == {"eq": "RTX 4090"} and q["allocated_storage"] == STORAGE_GB and q["type"] == "on-demand"
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    try:
        body = fake_vast.creates[-1]
        assert body["runtype"] == "ssh_direct" and body["label"] == f"gtrain-{res.cluster.id}-0"
        assert body["env"] == {"GTRAIN_CLUSTER_ID": res.cluster.id} and "price" not in body
        assert API_KEY not in json.dumps(fake_vast.creates)
        billed = (0.35 + 0.10 * STORAGE_GB / 730) * 1.1  # what the rented instance reports, not the offer's price
        store = StateStore()
        try:
            c = store.get_cluster_by_id(res.cluster.id)
            assert c.price_per_hour == pytest.approx(billed, abs=1e-6) and c.region == "US"
            assert c.extra["price_live"] is True and c.extra["price_source"].startswith("live (vast offer 7002, US")
            (iv,) = store.intervals(res.cluster.id)
            assert iv.price_per_hour == pytest.approx(billed, abs=1e-6)
        finally:
            store.close()
        gtrain.launch(cluster="vast-e2e")
        lines: list[Any] = []
        job = gtrain.wait("vast-e2e", on_line=lines.append)
        assert (job.status, job.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-20:]
        again: list[Any] = []
        gtrain.logs("vast-e2e", on_line=again.append)
        assert any("hello from vast node 0" in ln.text for ln in again), [ln.text for ln in again][-20:]
        pulled = gtrain.pull("vast-e2e", to=tmp_path / "ck")
        assert pulled.transferred == ["model.txt"] and (tmp_path / "ck" / "model.txt").read_text() == "weights"
    finally:
        down = gtrain.down("vast-e2e")
    (line,) = down.cost.lines
    assert line.cost_usd > 0 and not line.estimate
    assert live(fake_vast) == before  # no instance left
    assert not any(API_KEY.encode() in p.read_bytes() for p in gtrain_home.rglob("*") if p.is_file())


def test_an_outbid_interruptible_instance_is_recovered_on_another_offer(fake_vast: FakeVast, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                                        tmp_path: Path, gtrain_home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """use_spot: a bid at the offer's min_bid. A higher bid stops the instance mid-job (its machine gone with what
    it ran): describe says preempted, the watcher destroys it, rents the next offer and relaunches the job."""
    from tests.integration import durable_nodes as dn

    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    hosts = two_hosts(ssh_hosts)
    fake_vast.use_hosts(hosts)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text("import os, time\na = os.environ['GTRAIN_ATTEMPT']\nprint('attempt', a, flush=True)\n"
                                 "time.sleep(60 if a == '1' else 0)\nprint('finished attempt', a, flush=True)\n")
    s = spec("vast-rec", resources={"accelerators": "RTX4090:1", "use_spot": True, "regions": ["US", "CA"]},
             job={"workdir": str(work), "run": "job.py", "python": sys.executable, "launcher": "python"},
             policies={"recovery": {"max_restarts": 1, "backoff_s": 0}})
    s["vast"] = {"ssh_user": hosts[0].user, "ssh_timeout_s": 30, "poll_s": 0.1}
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    try:
        assert fake_vast.searches[-1]["type"] == "bid" and fake_vast.searches[-1]["geolocation"] == {"in": ["US", "CA"]}
        assert fake_vast.creates[-1]["price"] == 0.12  # offer 7001's min_bid
        store = StateStore()
        try:
            first = store.node_records(res.cluster.id)[0].instance_id
            assert store.get_cluster_by_id(res.cluster.id).price_per_hour == pytest.approx(0.12 + 0.15 * 100 / 730,
                                                                                          abs=1e-6)
        finally:
            store.close()
        assert first is not None
        job = gtrain.launch(cluster="vast-rec")
        lines: list[Any] = []

        def on_line(ln: Any) -> None:
            lines.append(ln)
            inst = fake_vast.instances.get(int(first))
            if "attempt 1" in ln.text and inst is not None and inst["actual_status"] == "running":
                fake_vast.outbid(int(first))  # Vast says so; then the machine is gone with what it ran
                dn.kill9(dn.pids_where(dn.of_node(job.job_id, 0)))

        final = gtrain.wait("vast-rec", job_id=job.job_id, on_line=on_line)
        texts = [ln.text for ln in lines]
        assert (final.status, final.exit_code) == ("succeeded", 0), texts[-20:]
        assert any("finished attempt 2" in t for t in texts), texts[-20:]
        (rec,) = final.info["recoveries"]
        assert rec["lost"] == [0] and rec["reprovision"] == [0], rec
        store = StateStore()
        try:
            node = store.node_records(res.cluster.id)[0]
            assert node.instance_id != first and int(first) not in fake_vast.instances  # the outbid one destroyed
            assert fake_vast.creates[-1]["price"] == 0.14  # the next offer (7002)'s min_bid
        finally:
            store.close()
    finally:
        gtrain.down("vast-rec")
    assert not fake_vast.of_cluster(res.cluster.id)


def test_offers_above_the_caps_are_skipped(fake_vast: FakeVast, gtrain_home: Path, tmp_path: Path) -> None:
    before, creates = live(fake_vast), len(fake_vast.creates)
    # vast.max_usd_per_hour: the server filters dph_total; an instance billing above it (its host re-priced
    # between the search and the rent) is destroyed and the next offer rented
    fake_vast.drift[7002] = 1.5
    s = spec("vast-cap", resources={"accelerators": "RTX4090:1", "regions": ["US"]},
             vast={"max_usd_per_hour": 0.45, "wait_ssh": False, "poll_s": 0.05})
    plan = gtrain.up(parse_spec(s), dry_run=True).plan
    assert fake_vast.searches[-1]["dph_total"] == {"lte": 0.45}
    assert plan.price_per_hour == on_demand(0.35, 0.10)  # offer 7002: 7004 (Berlin) is not in the US
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    try:
        store = StateStore()
        try:
            c = store.get_cluster_by_id(res.cluster.id)
            assert c.price_per_hour == pytest.approx(on_demand(0.41, 0.10))  # offer 7005: under the cap
            assert "vast offer 7005" in c.extra["price_source"]
        finally:
            store.close()
        assert live(fake_vast) == sorted([*before, f"gtrain-{res.cluster.id}-0"])  # 7002's instance destroyed
        assert len(fake_vast.creates) == creates + 2
    finally:
        gtrain.down("vast-cap")
    # policies.max_cost_usd: an hour of every US offer costs more than the $0.30 budget: nothing is rented
    f = tmp_path / "cap.json"
    f.write_text(json.dumps(spec("vast-cap2", resources={"accelerators": "RTX4090:1", "regions": ["US"]},
                                 policies={"max_cost_usd": 0.30})))
    r = cli("up", str(f), "--yes")
    assert r.returncode == 2 and "policies.max_cost_usd" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "offer 7002" in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    assert live(fake_vast) == before and len(fake_vast.creates) == creates + 2


def test_budget_left_after_spending_skips_offers(fake_vast: FakeVast, gtrain_home: Path) -> None:
    """What is left of max_cost_usd, not the whole budget: a replacement must fit what the cluster has not spent."""
    s = parse_spec(spec("vast-left", resources={"accelerators": "RTX4090:1", "regions": ["US"]},
                        policies={"max_cost_usd": 0.5}))
    res = gtrain.up(s)
    assert res.cluster is not None
    store = StateStore()
    try:
        p = get_provider("vast", store)
        cluster = store.get_cluster_by_id(res.cluster.id)
        (iv,) = store.intervals(cluster.id)
        store.conn.execute("UPDATE cost_intervals SET started_at=? WHERE id=?", (iv.started_at - 1800, iv.id))
        store.conn.commit()  # half an hour at $0.36/h spent: $0.32 of $0.50 left, less than an hour of any offer
        with pytest.raises(ConfigError) as e:
            p.replace_nodes(cluster, [0])
        assert e.value.field == "policies.max_cost_usd" and "left of policies.max_cost_usd" in e.value.message
    finally:
        store.close()
        gtrain.down("vast-left")


def test_two_nodes_refused_exit_2_nothing_created(fake_vast: FakeVast, tmp_path: Path, gtrain_home: Path) -> None:
    before, creates = live(fake_vast), len(fake_vast.creates)
    f = tmp_path / "two.json"
    f.write_text(json.dumps(spec("vast-two", num_nodes=2)))
    r = cli("up", str(f), "--yes")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "num_nodes" in r.stderr and "no cluster product with a private network" in r.stderr, r.stderr
    assert live(fake_vast) == before and len(fake_vast.creates) == creates
    f.write_text(json.dumps(spec("vast-two", resources={"accelerators": "RTX4090:1", "region": "usa"})))
    r = cli("up", str(f), "--dry-run")
    assert r.returncode == 2 and "resources.region" in r.stderr and "country code" in r.stderr, r.stderr


def test_gc_finds_an_orphan_by_label_with_the_local_state_gone(fake_vast: FakeVast, gtrain_home: Path) -> None:
    before = live(fake_vast)
    res = gtrain.up(parse_spec(spec("vast-orphan", resources={"accelerators": "H100:1"})))
    assert res.cluster is not None
    cid = res.cluster.id
    assert fake_vast.searches[-1]["gpu_name"] == {"in": ["H100 NVL", "H100 PCIE", "H100 SXM"]}
    (gtrain_home / "state.db").unlink()  # local state lost: only the labels say what is gtrain's
    r = cli("gc", "--provider", "vast", "--json")
    assert r.returncode == 0, r.stderr
    assert cid in json.loads(r.stdout)["clusters"], r.stdout
    store = StateStore()
    try:
        p = get_provider("vast", store)
        with fake_vast.lock:
            others = {str(i["label"]).split("-")[1] for i in fake_vast.instances.values()} - {cid}
        found = p.gc(None, others, delete=False)
        assert [(o.kind, o.cluster_id, o.region) for o in found.orphans] == [("instance", cid, "SE")]
        assert fake_vast.of_cluster(cid)  # listing deletes nothing
        done = p.gc(["SE"], others, delete=True)
        assert done.deleted and done.left == []
    finally:
        store.close()
    assert live(fake_vast) == before


def test_errors_at_the_edge(fake_vast: FakeVast, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = live(fake_vast)
    fake_vast.throttle, fake_vast.throttled, fake_vast.unavailable = 2, 0, 1  # 429 twice (no Retry-After), a 503
    plan = gtrain.up(parse_spec(spec("vast-x")), dry_run=True).plan
    assert plan.provider == "vast" and fake_vast.throttled == 2 and fake_vast.unavailable == 0
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("vast-x", resources={"accelerators": "RTX4090:1"}, vast={"bid_usd_per_hour": 0.2})),
                  dry_run=True)
    assert e.value.field == "vast.bid_usd_per_hour"
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("vast-x", resources={"accelerators": "B200:8"})), dry_run=True)
    assert e.value.field == "resources.accelerators" and "no Vast.ai offer" in e.value.message
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("vast-x", vast={"min_reliability": 1.5})), dry_run=True)
    assert e.value.field == "vast.min_reliability"
    fake_vast.credit = 0.01
    with pytest.raises(QuotaError) as q:
        gtrain.up(parse_spec(spec("vast-x")))
    assert "lacks credit" in q.value.message
    fake_vast.credit = 500.0
    monkeypatch.setenv("VAST_API_KEY", "vast_wrong_0123456789")
    with pytest.raises(CredentialsError) as c:
        gtrain.up(parse_spec(spec("vast-x")))
    assert "rejected the API key" in c.value.message and "VAST_API_KEY" in (c.value.hint or "")
    assert "vast_wrong" not in c.value.message + (c.value.hint or "")
    assert live(fake_vast) == before


# ---------------------------------------------------------------------------------------------- gtrain check


def test_check_good_key_file_missing_and_revoked(fake_vast: FakeVast, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (r,) = check_providers(["vast"], 10.0)
    assert r.ok and r.credentials == "VAST_API_KEY" and (r.call or "").startswith("GET /api/v0/instances/: "), r
    monkeypatch.delenv("VAST_API_KEY")
    monkeypatch.setenv("HOME", str(tmp_path))
    (r,) = check_providers(["vast"], 10.0)
    assert not r.ok and "no API key" in r.reason and (r.fix or "").startswith("export VAST_API_KEY="), r
    (tmp_path / ".config" / "vastai").mkdir(parents=True)
    (tmp_path / ".config" / "vastai" / "vast_api_key").write_text(API_KEY + "\n")
    (r,) = check_providers(["vast"], 10.0)
    assert r.ok and r.credentials == "~/.config/vastai/vast_api_key", r
    monkeypatch.setenv("VAST_API_KEY", "vast_revoked_0123456789abcdef")
    (r,) = check_providers(["vast"], 10.0)
    assert not r.ok and "rejected the API key" in r.reason and "vast_revoked" not in r.reason, r


# ---------------------------------------------------------------------------------------------- the fake


def call(fake: FakeVast, path: str, body: Any = None, method: str = "POST", key: str | None = API_KEY
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
        try:
            return e.code, json.loads(raw) if raw else None
        except ValueError:
            return e.code, raw.decode()


def test_the_fake_refuses_what_vast_refuses(fake_vast: FakeVast) -> None:
    q = {"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"eq": 1}, "order": [["dph_total", "asc"]], "type": "on-demand"}
    code, doc = call(fake_vast, "/bundles/", {**q, "gpu_model": {"eq": "x"}})
    assert (code, doc["error"]) == (400, "invalid_args") and "gpu_model" in doc["msg"] and doc["success"] is False
    code, doc = call(fake_vast, "/bundles/", {**q, "num_gpus": {"approx": 1}})
    assert code == 400 and "op one of" in doc["msg"], doc
    code, doc = call(fake_vast, "/bundles/", {**q, "type": "interruptible"})  # the CLI's alias, not the API's
    assert code == 400 and "type" in doc["msg"], doc
    code, doc = call(fake_vast, "/bundles/", q, key=None)
    assert code == 401 and doc["success"] is False, doc
    code, doc = call(fake_vast, "/bundles/", q, key="not-the-key")
    assert code == 401, doc
    fake_vast.throttle = 1
    code, doc = call(fake_vast, "/bundles/", q)
    assert (code, doc) == (429, "API requests too frequent")
    code, doc = call(fake_vast, "/bundles/", q)
    assert code == 200 and [o["id"] for o in doc["offers"]][:2] == [7003, 7001], doc
    good = {"image": "vastai/base-image:@vastai-automatic-tag", "label": "gtrain-fakecheck-0", "disk": 20,
            "runtype": "ssh_direct", "env": {"A": "1"}}
    code, doc = call(fake_vast, "/asks/7005/", {**good, "bogus": 1}, method="PUT")
    assert code == 400 and doc["msg"] == "Unrecognized field: bogus", doc
    code, doc = call(fake_vast, "/asks/7005/", {**good, "runtype": "ssh_direc ssh_proxy"}, method="PUT")
    assert code == 400 and "runtype" in doc["msg"], doc
    code, doc = call(fake_vast, "/asks/7005/", {**good, "disk": "20"}, method="PUT")
    assert code == 400 and "disk" in doc["msg"], doc
    code, doc = call(fake_vast, "/asks/7005/", {**good, "price": 0.01}, method="PUT")
    assert code == 400 and "min_bid" in doc["msg"], doc
    code, doc = call(fake_vast, "/asks/999/", good, method="PUT")
    assert code == 400 and doc["error"] == "no_such_ask", doc
    code, made = call(fake_vast, "/asks/7005/", good, method="PUT")  # the valid request beside them
    assert code == 200 and made["success"] is True and isinstance(made["new_contract"], int), made
    iid = made["new_contract"]
    code, doc = call(fake_vast, "/asks/7005/", good, method="PUT")  # rented now
    assert code == 400 and doc["error"] == "no_such_ask", doc
    code, doc = call(fake_vast, f"/instances/{iid}/ssh/", {"ssh_key": "not a key"})
    assert code == 400, doc
    code, doc = call(fake_vast, f"/instances/{iid}/", {}, method="DELETE")
    assert code == 200 and doc["success"] is True
    code, doc = call(fake_vast, f"/instances/{iid}/", {}, method="DELETE")
    assert code == 404, doc


def test_any_of_prices_vast_beside_runpod_and_picks_the_cheaper(fake_vast: FakeVast, fake_runpod: Any,
                                                                   gtrain_home: Path) -> None:
    from gtrain.providers import register, unregister
    from gtrain.registry import REGISTRY

    added = "runpod" not in REGISTRY
    if added:
        register("runpod", "gtrain.providers.runpod:RunPodProvider")
    try:
        s = parse_spec({"name": "vast-any", "num_nodes": 1, "resources": {"any_of": [
            {"provider": "runpod", "accelerators": "RTX4090:1", "region": "US-TX-3"},
            {"provider": "vast", "accelerators": "RTX4090:1", "regions": ["US"]}]}})
        res = gtrain.up(s, dry_run=True)
    finally:
        if added:
            unregister("runpod")
    assert res.cluster is None and res.placement is not None
    got = [(c["provider"], c["cluster_price_per_hour"], c["outcome"]) for c in res.placement["candidates"]]
    assert got == [("vast", round(on_demand(0.35, 0.10), 4), "chosen"), ("runpod", 0.69, "untried")], got
    assert not any(lb.startswith("gtrain-vast-any") for lb in live(fake_vast))  # a dry run rents nothing
