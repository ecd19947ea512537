"""provider nebius on the fake Nebius gRPC API (tests/fixtures/fake_nebius.py: a grpcio server of the API's own
descriptors, as shipped by the ``nebius`` SDK): two nodes as one GPU cluster whose instances are real sshd hosts
(the fake hands the hosts of tests/fixtures/sshd.py out as the instances' addresses and installs each
cloud-init key), a 2-node torchrun job launched, waited for, its logs read and its checkpoints pulled, the live
calculator price frozen, down leaving nothing; a preemptible node that Nebius stops mid-job recovered on a new
instance; gc of orphans by label with the local state gone; the errors at the edge (bad token, quota, no
capacity, the rate limit ridden out, the calculator down -> the table's estimate, bad input exit 2); ``gtrain
check nebius``; the fake refusing what Nebius refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

import gtrain
from gtrain.errors import CapacityError, ConfigError, CredentialsError, QuotaError
from gtrain.providers import check_providers, get_provider
from gtrain.remote import ssh as sshmod
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_nebius import PROJECT, SUBNET, TOKEN, FakeNebius, msg


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def spec(name: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "provider": "nebius", "num_nodes": 1, "resources": {"accelerators": "H100:1"},
                         "nebius": {"project_id": PROJECT, "subnet_id": SUBNET, "wait_ssh": False, "poll_s": 0.05}}
    nb = over.pop("nebius", {})
    d.update(over)
    d["nebius"] = {**d["nebius"], **nb}
    return d


def two_hosts(ssh_hosts: Any) -> list[Any]:
    return [ssh_hosts[2], ssh_hosts[3]] if len(ssh_hosts) >= 4 else [ssh_hosts[0], ssh_hosts[1]]


def reach(hosts: list[Any]) -> dict[str, Any]:
    return {"ssh_user": hosts[0].user, "ssh_port": int(hosts[0].port), "ssh_timeout_s": 30, "poll_s": 0.1,
            "wait_ssh": True}


def test_two_nodes_gpu_cluster_launch_logs_pull_live_price_then_down(fake_nebius: FakeNebius, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                                     tmp_path: Path, gtrain_home: Path) -> None:
    sshmod.close_all()
    hosts = two_hosts(ssh_hosts)
    fake_nebius.use_hosts(hosts)
    fake_nebius.price_factor = 1.1  # the calculator quotes $3.245/h against the table's $2.95/h
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text(
        "import os, pathlib\nr = os.environ['GTRAIN_NODE_RANK']\n"
        "print('hello from node', r, 'rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n"
        "pathlib.Path('checkpoints').mkdir(exist_ok=True)\n"
        "pathlib.Path('checkpoints', f'step-{r}.txt').write_text(r)\n")
    s = spec("nb-two", num_nodes=2, nebius=reach(hosts),
             job={"workdir": str(work), "run": "hello.py", "python": sys.executable, "nproc_per_node": 1,
                  "env": {"OMP_NUM_THREADS": "1"}})
    before = fake_nebius.live()
    plan = gtrain.up(parse_spec(s), dry_run=True).plan
    assert plan.price_per_hour == 2.95 and plan.instance_type == "gpu-h100-sxm/1gpu-16vcpu-200gb", plan
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    cid = res.cluster.id
    try:
        reqs = fake_nebius.creates[-2:]
        assert [r.metadata.name for r in reqs] == [f"gtrain-{cid}-0", f"gtrain-{cid}-1"]
        (group,) = [g for g in fake_nebius.clusters.values() if g.metadata.labels["gtrain-cluster"] == cid]
        assert {r.spec.gpu_cluster.id for r in reqs} == {group.metadata.id}
        assert group.spec.infiniband_fabric == "fabric-2"
        r0 = reqs[0]
        assert r0.spec.boot_disk.managed_disk.spec.source_image_family.image_family == "ubuntu22.04-cuda12"
        assert "ssh-ed25519 " in r0.spec.cloud_init_user_data and not r0.spec.HasField("preemptible")
        assert TOKEN not in str(r0)
        store = StateStore()
        try:
            c = store.get_cluster_by_id(cid)
            assert c.price_per_hour == pytest.approx(3.245), c.price_per_hour  # the live price, frozen
            assert c.extra["price_live"] is True and c.extra["price_source"].startswith("live (nebius calculator")
            p = get_provider("nebius", store)
            assert [st.status for st in p.describe(c)] == ["running", "running"]
        finally:
            store.close()
        gtrain.launch(cluster="nb-two")
        lines: list[Any] = []
        job = gtrain.wait("nb-two", on_line=lines.append)
        texts = [ln.text for ln in lines]
        assert (job.status, job.exit_code) == ("succeeded", 0), texts[-20:]
        assert sorted(t.split(" rank")[0] for t in texts if t.startswith("hello from node")) == \
            ["hello from node 0", "hello from node 1"], texts[-20:]
        again: list[Any] = []
        gtrain.logs("nb-two", on_line=again.append)
        assert any("hello from node 1" in ln.text for ln in again), [ln.text for ln in again][-20:]
        pulled = gtrain.pull("nb-two", to=tmp_path / "out")
        got = sorted(p.name for p in Path(pulled.dest).rglob("step-*.txt"))
        assert got == ["step-0.txt", "step-1.txt"], got
    finally:
        down = gtrain.down("nb-two")
    assert sorted(ln.node_rank for ln in down.cost.lines) == [0, 1]
    assert all(ln.cost_usd > 0 and not ln.estimate for ln in down.cost.lines), down.cost.lines
    assert fake_nebius.live() == before
    assert not [g for g in fake_nebius.clusters.values() if g.metadata.labels["gtrain-cluster"] == cid]
    assert not any(TOKEN.encode() in p.read_bytes() for p in gtrain_home.rglob("*") if p.is_file())


def test_a_preempted_node_is_recovered_on_a_new_instance(fake_nebius: FakeNebius, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path, gtrain_home: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Nebius stops the running job's preemptible instance (its machine gone, processes and all): the watcher hears
    ``preempted`` from the provider, replaces the instance and relaunches the job there."""
    from tests.integration import durable_nodes as dn

    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    hosts = two_hosts(ssh_hosts)
    fake_nebius.use_hosts(hosts)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text("import os, time\na = os.environ['GTRAIN_ATTEMPT']\nprint('attempt', a, flush=True)\n"
                                 "time.sleep(60 if a == '1' else 0)\nprint('finished attempt', a, flush=True)\n")
    s = spec("nb-rec", resources={"accelerators": "H100:1", "use_spot": True}, nebius=reach(hosts),
             job={"workdir": str(work), "run": "job.py", "python": sys.executable, "launcher": "python"},
             policies={"recovery": {"max_restarts": 1, "backoff_s": 0}})
    res = gtrain.up(parse_spec(s))
    assert res.cluster is not None
    try:
        assert fake_nebius.creates[-1].spec.preemptible.on_preemption == 1  # STOP
        store = StateStore()
        try:
            c = store.get_cluster_by_id(res.cluster.id)
            assert c.market == "spot" and c.price_per_hour == pytest.approx(1.25)
            first = store.node_records(res.cluster.id)[0].instance_id
        finally:
            store.close()
        assert first is not None
        job = gtrain.launch(cluster="nb-rec")
        lines: list[Any] = []

        def on_line(ln: Any) -> None:
            lines.append(ln)
            inst = fake_nebius.instances.get(first)
            if "attempt 1" in ln.text and inst is not None and inst.status.state == 4:  # RUNNING
                fake_nebius.preempt(first)
                dn.kill9(dn.pids_where(dn.of_node(job.job_id, 0)))

        final = gtrain.wait("nb-rec", job_id=job.job_id, on_line=on_line)
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
        gtrain.down("nb-rec")


def test_gc_finds_orphans_by_label_with_the_local_state_gone(fake_nebius: FakeNebius, gtrain_home: Path) -> None:
    before = fake_nebius.live()
    res = gtrain.up(parse_spec(spec("nb-orphan", num_nodes=2)))
    assert res.cluster is not None
    cid = res.cluster.id
    (gtrain_home / "state.db").unlink()  # local state lost: only the labels say what is gtrain's
    r = cli("gc", "--provider", "nebius", "--region", PROJECT, "--json")
    assert r.returncode == 0, r.stderr
    assert cid in json.loads(r.stdout)["clusters"], r.stdout
    store = StateStore()
    try:
        p = get_provider("nebius", store)
        with fake_nebius.lock:
            others = {i.metadata.labels["gtrain-cluster"] for i in fake_nebius.instances.values()} - {cid}
        found = p.gc([PROJECT], others, delete=False)
        assert sorted((o.kind, o.cluster_id) for o in found.orphans) == \
            [("gpu-cluster", cid), ("instance", cid), ("instance", cid)], found.orphans
        done = p.gc([PROJECT], others, delete=True)
        assert done.deleted and done.left == []
    finally:
        store.close()
    assert fake_nebius.live() == before
    assert not [g for g in fake_nebius.clusters.values() if g.metadata.labels["gtrain-cluster"] == cid]


def test_errors_at_the_edge(fake_nebius: FakeNebius, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch,
                            tmp_path: Path) -> None:
    before, creates = fake_nebius.live(), len(fake_nebius.creates)
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("nb-x", resources={"accelerators": "A100:1"})), dry_run=True)
    assert e.value.field == "resources.accelerators" and "H100" in (e.value.hint or "")
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("nb-x", nebius={"preset": "4gpu-64vcpu-800gb"})), dry_run=True)
    assert e.value.field == "nebius.preset"
    with pytest.raises(ConfigError) as e:
        gtrain.up(parse_spec(spec("nb-x", nebius={"subnet_id": "my subnet"})), dry_run=True)
    assert e.value.field == "nebius.subnet_id"
    f = tmp_path / "nb.json"
    f.write_text(json.dumps(spec("nb-cli", resources={"accelerators": "H100:3"})))
    r = cli("up", str(f), "--dry-run")
    assert r.returncode == 2 and "resources.accelerators" in r.stderr and "Traceback" not in r.stderr, r.stderr
    fake_nebius.quota_gpus = 1
    with pytest.raises(QuotaError) as q:
        gtrain.up(parse_spec(spec("nb-x", num_nodes=2)))
    assert "quota" in q.value.message
    fake_nebius.quota_gpus = 64
    fake_nebius.no_capacity.add("gpu-h100-sxm")
    with pytest.raises(CapacityError):
        gtrain.up(parse_spec(spec("nb-x")))
    fake_nebius.no_capacity.clear()
    assert fake_nebius.live() == before  # a failed up leaves nothing
    creates = len(fake_nebius.creates)
    fake_nebius.throttle, fake_nebius.throttled = 2, 0  # RESOURCE_EXHAUSTED rate limit twice: the SDK retries
    fake_nebius.calculator_down = True
    res = gtrain.up(parse_spec(spec("nb-est")))
    assert res.cluster is not None and fake_nebius.throttled == 2
    assert not fake_nebius.creates[-1].spec.HasField("gpu_cluster")  # one node: no GPU cluster
    assert not [g for g in fake_nebius.clusters.values() if g.metadata.labels["gtrain-cluster"] == res.cluster.id]
    store = StateStore()
    try:
        c = store.get_cluster_by_id(res.cluster.id)
        assert c.price_per_hour == 2.95 and c.extra["price_live"] is False  # the table's estimate, said so
        assert c.extra["price_source"] == "estimate (gtrain's Nebius table, nebius.com/prices 2026-05)"
        p = get_provider("nebius", store)
        with fake_nebius.lock:  # an on-demand VM stopped (the console, a maintenance): stopped, not preempted
            fake_nebius.power(msg("nebius.compute.v1.StopInstanceRequest")(id=p.node_records(c)[0].instance_id),
                              False)
        assert [st.status for st in p.describe(c)] == ["stopped"]
    finally:
        store.close()
    gtrain.down("nb-est")
    assert len(fake_nebius.creates) == creates + 1
    monkeypatch.setenv("NEBIUS_IAM_TOKEN", "ne1-revoked-0123456789")
    with pytest.raises(CredentialsError) as c2:
        gtrain.up(parse_spec(spec("nb-x")))
    assert "rejected the credentials" in c2.value.message and "ne1-revoked" not in c2.value.message
    assert fake_nebius.live() == before


def test_check_token_missing_and_revoked(fake_nebius: FakeNebius, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEBIUS_PROJECT_ID", PROJECT)
    (r,) = check_providers(["nebius"], 20.0)
    assert r.ok and r.credentials == "NEBIUS_IAM_TOKEN" and (r.call or "").startswith("InstanceService.List"), r
    monkeypatch.delenv("NEBIUS_IAM_TOKEN")
    monkeypatch.setenv("HOME", str(tmp_path))
    (r,) = check_providers(["nebius"], 20.0)
    assert not r.ok and "no credentials" in r.reason and "NEBIUS_IAM_TOKEN" in (r.fix or ""), r
    (tmp_path / ".nebius").mkdir()  # a profile of the nebius CLI whose token is in a file (`token-file`)
    (tmp_path / ".nebius" / "token").write_text(TOKEN)
    (tmp_path / ".nebius" / "config.yaml").write_text(
        f"default: ci\nprofiles:\n  ci:\n    token-file: {tmp_path / '.nebius' / 'token'}\n    parent-id: {PROJECT}\n")
    (r,) = check_providers(["nebius"], 20.0)
    assert r.ok and r.credentials == "~/.nebius/config.yaml (profile ci)", r
    monkeypatch.setenv("NEBIUS_IAM_TOKEN", "ne1-revoked-0123456789")
    (r,) = check_providers(["nebius"], 20.0)
    assert not r.ok and "rejected the credentials" in r.reason and "ne1-revoked" not in r.reason, r


# ---------------------------------------------------------------------------------------------- the fake


def rpc(fake: FakeNebius, method: str, req: Any, out: str, token: str | None = TOKEN, raw: bytes | None = None
        ) -> tuple[grpc.StatusCode, Any]:
    with grpc.insecure_channel(fake.endpoint) as ch:
        call = ch.unary_unary(method, request_serializer=lambda m: m if isinstance(m, bytes) else
                              m.SerializeToString(), response_deserializer=msg(out).FromString)
        try:
            got = call(raw if raw is not None else req, timeout=10,
                       metadata=[("authorization", f"Bearer {token}")] if token else [])
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, got


def test_the_fake_refuses_what_nebius_refuses(fake_nebius: FakeNebius) -> None:
    create, op = "/nebius.compute.v1.InstanceService/Create", "nebius.common.v1.Operation"
    good = msg("nebius.compute.v1.CreateInstanceRequest")()
    good.metadata.parent_id, good.metadata.name = PROJECT, "gtrain-fakecheck-0"
    good.metadata.labels["gtrain-cluster"] = "fakecheck"
    good.spec.resources.platform, good.spec.resources.preset = "gpu-h100-sxm", "1gpu-16vcpu-200gb"
    good.spec.boot_disk.attach_mode = 2
    d = good.spec.boot_disk.managed_disk.spec
    d.size_gibibytes, d.type, d.source_image_family.image_family = 100, 1, "ubuntu22.04-cuda12"
    good.spec.network_interfaces.add(subnet_id=SUBNET, name="eth0")
    code, why = rpc(fake_nebius, create, good, op, token=None)
    assert code == grpc.StatusCode.UNAUTHENTICATED, why
    code, why = rpc(fake_nebius, create, good, op, token="ne1-wrong")
    assert code == grpc.StatusCode.UNAUTHENTICATED, why
    unknown = good.SerializeToString() + bytes([0xF8, 0x06, 0x01])  # field 111 (varint): not in the schema
    code, why = rpc(fake_nebius, create, None, op, raw=unknown)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown field number 111" in why, why
    bad_enum = msg("nebius.compute.v1.CreateInstanceRequest")()
    bad_enum.CopyFrom(good)
    bad_enum.spec.boot_disk.attach_mode = 7  # AttachMode has 0..2
    code, why = rpc(fake_nebius, create, bad_enum, op)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "attach_mode: 7" in why, why
    other = msg("nebius.compute.v1.CreateInstanceRequest")()
    other.CopyFrom(good)
    other.spec.resources.preset = "3gpu-48vcpu-600gb"
    code, why = rpc(fake_nebius, create, other, op)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "spec.resources.preset" in why, why
    fake_nebius.quota_gpus = 0
    code, why = rpc(fake_nebius, create, good, op)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "quota exceeded" in why, why
    fake_nebius.quota_gpus = 64
    fake_nebius.throttle = 1
    code, why = rpc(fake_nebius, create, good, op)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit" in why, why
    code, made = rpc(fake_nebius, create, good, op)  # the valid request beside them
    assert code == grpc.StatusCode.OK and made.resource_id.startswith("computeinstance-"), made
    code, why = rpc(fake_nebius, create, good, op)
    assert code == grpc.StatusCode.ALREADY_EXISTS, why
    code, _ = rpc(fake_nebius, "/nebius.compute.v1.InstanceService/Delete",
                  msg("nebius.compute.v1.DeleteInstanceRequest")(id=made.resource_id), op)
    assert code == grpc.StatusCode.OK
