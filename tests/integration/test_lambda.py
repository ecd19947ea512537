"""provider lambda on the fake Lambda Cloud API (tests/fixtures/fake_lambda.py, written from Lambda's OpenAPI
document): a 2-node x 2-process torchrun run end to end over SSH (the relay hands the instances sshd hosts and
installs the key they were launched with), region failover on "insufficient capacity", the errors at the edge
(bad key, quota, unknown type/region, spot, capacity everywhere), ``gc`` by name, and the offline dry run."""

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
from gtrain.remote import ssh as sshmod
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_lambda import API_KEY, FakeLambda
from tests.integration.node_relay import relay_hosts

JOBS = Path(__file__).parent / "jobs"
RELAY = Path(__file__).parent / "node_relay.py"


def spec(name: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "provider": "lambda", "num_nodes": 2,
                         "resources": {"accelerators": "A10:1", "region": "us-east-1"},
                         "lambda": {"wait_ssh": False, "poll_s": 0.05}}
    d.update(over)
    return d


def everything(fake: FakeLambda) -> tuple[list[str], list[str]]:
    with fake.lock:
        fake._tick()
        return sorted(i["name"] for i in fake.instances.values()), sorted(k["name"] for k in fake.keys.values())


@pytest.mark.slow
def test_run_two_nodes_torchrun_end_to_end_then_nothing_left(fake_lambda: FakeLambda, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                             gtrain_home: Path) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    work = tmp_path / "work"
    work.mkdir()
    (work / "probe.py").write_text((JOBS / "probe.py").read_text())
    s = spec("lambda-e2e", resources={"accelerators": "A10:1", "regions": ["us-west-2", "us-east-1"]},
             job={"workdir": str(work), "run": "probe.py", "nproc_per_node": 2, "checkpoint_dir": "ckpt",
                  "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}})
    s["lambda"] = {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} lambda {relay_dir} %h",
                   "ssh_timeout_s": 60, "poll_s": 0.2}
    fake_lambda.fail["us-west-2"] = "capacity"  # the first region is sold out: the run lands in the second
    lines: list[Any] = []
    res = gtrain.run(parse_spec(s), to=tmp_path / "ck", on_line=lines.append)
    assert (res.status, res.exit_code) == ("succeeded", 0), (res.errors, [ln.text for ln in lines][-30:])
    assert sorted(ln.rank for ln in lines if ln.text.startswith("hello from rank")) == [0, 1, 2, 3]
    assert res.pulled is not None and "sub/model.bin" in res.pulled.transferred
    assert (tmp_path / "ck" / "sub" / "model.bin").stat().st_size == 1 << 20
    regions = [b["region_name"] for b in fake_lambda.launches[-3:]]
    assert regions == ["us-west-2", "us-east-1", "us-east-1"], regions
    assert res.down is not None and len(res.down.cost.lines) == 2
    assert all(ln.cost_usd > 0 for ln in res.down.cost.lines)
    assert everything(fake_lambda) == ([], [])  # no instance, no key
    assert len(json.loads((relay_dir / "map.json").read_text())) == 2  # each instance reached its own host


def test_failover_capacity_everywhere_quota_and_nothing_left(fake_lambda: FakeLambda, gtrain_home: Path) -> None:
    before = everything(fake_lambda)
    two = {"accelerators": "A10:1", "regions": ["us-east-1", "us-west-1"]}
    fake_lambda.fail.update({"us-east-1": "capacity", "us-west-1": "capacity"})
    with pytest.raises(CapacityError) as e:
        gtrain.up(parse_spec(spec("lam-cap", resources=two)))
    assert "no capacity for 2x gpu_1x_a10" in e.value.message
    assert [a.split(":")[0] for a in e.value.attempts] == ["us-east-1", "us-west-1"], e.value.attempts
    assert all("insufficient-capacity" in a for a in e.value.attempts)
    assert everything(fake_lambda) == before  # the key uploaded for the attempt is gone too

    fake_lambda.fail.update({"us-east-1": "quota", "us-west-1": "quota"})
    with pytest.raises(QuotaError) as q:
        gtrain.up(parse_spec(spec("lam-quota", resources=two)))
    assert "global/quota-exceeded" in q.value.message
    assert everything(fake_lambda) == before

    # a region that fails after a rank was launched there: that rank is terminated before the next region
    fake_lambda.fail.clear()
    fake_lambda.capacity.clear()  # nothing listed with capacity and no region given: refused before any launch
    n = len(fake_lambda.launches)
    with pytest.raises(CapacityError, match="no capacity"):
        gtrain.up(parse_spec(spec("lam-none", resources={"accelerators": "A10:1"})))
    assert len(fake_lambda.launches) == n and everything(fake_lambda) == before


def test_a_rank_launched_before_the_region_ran_out_is_terminated(fake_lambda: FakeLambda, gtrain_home: Path) -> None:
    before = everything(fake_lambda)
    real = fake_lambda._launch

    def second_fails(b: dict[str, Any]) -> list[str]:
        if b["region_name"] == "us-east-1" and str(b.get("name", "")).endswith("-1"):
            fake_lambda.fail["us-east-1"] = "capacity"
        try:
            return real(b)
        finally:
            fake_lambda.fail.pop("us-east-1", None)

    fake_lambda._launch = second_fails  # type: ignore[method-assign]
    try:
        res = gtrain.up(parse_spec(spec("lam-half", resources={"accelerators": "A10:1",
                                                              "regions": ["us-east-1", "us-west-1"]})))
        assert res.cluster is not None
        with fake_lambda.lock:
            live = [(i["name"], i["region"]["name"]) for i in fake_lambda.instances.values()
                    if i["status"] != "terminating" and i["name"].startswith(f"gtrain-{res.cluster.id}-")]
        cid = res.cluster.id
        assert sorted(live) == [(f"gtrain-{cid}-0", "us-west-1"), (f"gtrain-{cid}-1", "us-west-1")]
    finally:
        fake_lambda._launch = real  # type: ignore[method-assign]
        gtrain.down("lam-half")
    assert everything(fake_lambda) == before


def test_errors_at_the_edge(fake_lambda: FakeLambda, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before, launches = everything(fake_lambda), len(fake_lambda.launches)
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("lam-x", resources={"accelerators": "T4:1", "region": "us-east-1"})), dry_run=True)
    assert e.value.field == "resources.accelerators" and "A10:1, H100:1" in (e.value.hint or "")
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("lam-x", resources={"instance_type": "gpu_9x_nope", "region": "us-east-1"})))
    assert e.value.field == "resources.instance_type" and "gpu_1x_a10" in (e.value.hint or "")
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("lam-x", resources={"accelerators": "A10:1", "regions": ["us-east-1", "mars-1"]})))
    assert e.value.field == "resources.regions[1]" and "'mars-1' is not a Lambda Cloud region" in e.value.message
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("lam-x", resources={"accelerators": "A10:1", "use_spot": True})), dry_run=True)
    assert e.value.field == "resources.use_spot" and "no spot" in e.value.message
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("lam-x", **{"lambda": {"ssh_cidr": "203.0.113.7/32"}})), dry_run=True)
    assert e.value.field == "lambda.ssh_cidr"
    monkeypatch.setenv("LAMBDA_API_KEY", "secret_wrong_0123456789")
    with pytest.raises(CredentialsError) as c:
        gtrain.up(parse_spec(spec("lam-x")))
    assert "rejected the API key" in c.value.message and "LAMBDA_API_KEY" in (c.value.hint or "")
    assert "secret_wrong" not in c.value.message + (c.value.hint or "")
    assert everything(fake_lambda) == before and len(fake_lambda.launches) == launches  # nothing was created


def test_cli_messages_exit_codes_and_the_key_stays_secret(fake_lambda: FakeLambda, tmp_path: Path,
                                                          gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "l.json"

    def cli(s: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
        f.write_text(json.dumps(s))
        return subprocess.run([sys.executable, "-m", "gtrain", "up", str(f), *args], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    r = cli(spec("lam-cli", resources={"instance_type": "gpu_1x_nope"}), "--dry-run")
    assert r.returncode == 2 and "resources.instance_type" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli(spec("lam-cli"), "--dry-run")
    assert r.returncode == 0 and "gpu_1x_a10" in r.stdout + r.stderr, r.stdout + r.stderr
    monkeypatch.setenv("LAMBDA_API_KEY", "secret_wrong_key_42")
    r = cli(spec("lam-cli"), "--yes")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "rejected the API key" in out and "Traceback" not in out, out
    assert "secret_wrong_key_42" not in out and API_KEY not in out
    home_files = [p.read_bytes() for p in gtrain_home.rglob("*") if p.is_file()]
    assert not any(b"secret_wrong_key_42" in b or API_KEY.encode() in b for b in home_files)


def test_offline_dry_run_plans_from_the_bundled_snapshot(gtrain_home: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.lambda_cloud/lambda_keys
    res = gtrain.up(parse_spec(spec("lam-off", resources={"accelerators": "H100:8"})), dry_run=True)
    assert res.plan.instance_type == "gpu_8x_h100_sxm5" and res.plan.price_per_hour == 23.92
    assert any(n.startswith("OFFLINE") and "snapshot" in n for n in res.plan.notes), res.plan.notes
    # Lambda's own key file is read when there is no environment variable
    (tmp_path / ".lambda_cloud").mkdir()
    (tmp_path / ".lambda_cloud" / "lambda_keys").write_text("api_key = from-the-file\n")
    from gtrain.providers.lambda_cloud.api import api_key

    assert api_key() == "from-the-file"


def test_gc_finds_an_orphan_by_name_and_status_imports_no_provider(fake_lambda: FakeLambda, gtrain_home: Path) -> None:
    before = everything(fake_lambda)
    res = gtrain.up(parse_spec(spec("lam-orphan")))
    assert res.cluster is not None
    cid = res.cluster.id
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "gtrain", "status"], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "lam-orphan" in r.stdout, r.stderr[-2000:]
    assert "gtrain.providers.lambda_cloud" not in r.stderr and "urllib.request" not in r.stderr
    (gtrain_home / "state.db").unlink()  # local state lost: only the names say what is gtrain's
    r = subprocess.run([sys.executable, "-m", "gtrain", "gc", "--provider", "lambda", "--json"], capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert cid in json.loads(r.stdout)["clusters"], r.stdout
    store = StateStore()
    try:
        p = get_provider("lambda", store)
        with fake_lambda.lock:  # another test's cluster in the session's fake is not this test's to sweep
            others = {str(i["name"]).rsplit("-", 1)[0][len("gtrain-"):] for i in fake_lambda.instances.values()}
            others |= {str(k["name"])[len("gtrain-"):] for k in fake_lambda.keys.values()}
        others.discard(cid)
        found = p.gc(None, others, delete=False)
        mine = sorted((o.kind, o.cluster_id) for o in found.orphans if o.cluster_id == cid)
        assert mine == [("instance", cid), ("instance", cid), ("ssh-key", cid)], found.orphans
        assert fake_lambda.of_cluster(cid)["instance"]  # listing deletes nothing
        done = p.gc(None, others, delete=True)
        assert done.deleted and done.left == []
    finally:
        store.close()
    assert everything(fake_lambda) == before


def test_replace_a_node_and_ride_out_the_rate_limit(fake_lambda: FakeLambda, gtrain_home: Path) -> None:
    before = everything(fake_lambda)
    fake_lambda.throttle, fake_lambda.throttled = 3, 0  # HTTP 429 three times: retried after Retry-After
    res = gtrain.up(parse_spec(spec("lam-repl")))
    assert res.cluster is not None and fake_lambda.throttled == 3
    store = StateStore()
    try:
        p = get_provider("lambda", store)
        cluster = store.get_cluster_by_id(res.cluster.id)
        old = {n.rank: n.instance_id for n in p.node_records(cluster)}
        p.replace_nodes(cluster, [1])
        new = {n.rank: n.instance_id for n in p.node_records(cluster)}
        assert new[0] == old[0] and new[1] != old[1]
        assert [s.status for s in p.describe(cluster)] == ["running", "running"]
        with fake_lambda.lock:
            fake_lambda._tick()
            assert old[1] not in fake_lambda.instances or fake_lambda.instances[old[1]]["status"] == "terminating"
    finally:
        store.close()
        down = gtrain.down("lam-repl")
    assert sorted(ln.node_rank for ln in down.cost.lines) == [0, 1, 1]  # rank 1's two machines, each billed
    assert everything(fake_lambda) == before
