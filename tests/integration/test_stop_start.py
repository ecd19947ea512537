"""`gtrain stop` / `gtrain start` of VM clusters (issue 28): on AWS (moto EC2) and GCP (the fake Compute Engine,
which serves instances.stop/start as the REST reference describes them), the instances reached through the
provider's ssh_proxy_command on real sshd hosts (tests/integration/node_relay.py), as the aws/gcp e2e tests do.

up -> a real 2-node job -> stop (compute billing ends; the disk's price is said; status says STOPPED; launch is
refused) -> start (the same instances, node records and ssh config refreshed) -> a job runs again -> down leaves
nothing. On GCP, a node that powered itself off (policies.idle_minutes runs `shutdown -h now`: GCE stops it) is
started again by `gtrain start` and by recovery, never replaced by a new instance. Providers that cannot stop
refuse with exit 2."""

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

import gtrain
from gtrain.providers.aws import TAG_CLUSTER
from gtrain.remote import ssh as sshmod
from tests.fixtures.fake_gce import FakeGCE
from tests.integration.node_relay import relay_hosts

JOBS = Path(__file__).parent / "jobs"
RELAY = Path(__file__).parent / "node_relay.py"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"}, check=False)


def write_spec(tmp_path: Path, name: str, provider: str, section: dict[str, Any], **top: Any) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "probe.py").write_text((JOBS / "probe.py").read_text())
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": provider, "num_nodes": 2,
        "resources": {"accelerators": "T4:1", "region": "us-east-1" if provider == "aws" else "us-central1",
                      "disk_gb": 50},
        provider: section,
        "job": {"workdir": str(work), "run": "probe.py", "nproc_per_node": 1, "checkpoint_dir": "ckpt",
                "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}}, **top,
    }))
    return spec


def run_job(name: str, spec: Path) -> None:
    job = gtrain.launch(spec)
    lines: list[Any] = []
    final = gtrain.wait(name, job_id=job.job_id, on_line=lines.append)
    assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-30:]
    assert sorted(ln.rank for ln in lines if ln.text.startswith("hello from rank")) == [0, 1]


def stop_start_cycle(name: str, spec: Path, disk_rate: float, states: Any, *, had_job: bool = False) -> None:
    """stop -> STOPPED, launch refused, disk priced -> start -> a job runs; `states()` is the cloud's view."""
    r = cli("stop", name, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "stopped" and [n["rank"] for n in doc["nodes"]] == [0, 1]
    assert doc["nodes"][0]["disk_gb"] == 50 and doc["nodes"][0]["disk_usd_per_gb_month"] == disk_rate
    assert doc["disk_usd_per_hour"] == pytest.approx(2 * 50 * disk_rate / 730, rel=1e-4)
    assert states() == ["stopped", "stopped"]
    text = cli("status", name)
    assert text.returncode == 0, text.stderr
    assert "STOPPED" in text.stdout and f"gtrain start {name}" in text.stdout, text.stdout
    assert [n["status"] for n in gtrain.status(name)[0]["nodes"]] == ["stopped", "stopped"]
    if had_job:  # its logs were kept at the stop: read from the archive, no node asked
        logs = cli("logs", name)
        assert logs.returncode == 0 and "hello from rank 1/2" in logs.stdout, logs.stdout + logs.stderr
    refused = cli("launch", str(spec))
    assert refused.returncode == 2 and f"gtrain start {name}" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    ex = cli("exec", name, "--", "true")  # at once, not after SSH retries to a machine that is off
    assert ex.returncode == 2 and f"gtrain start {name}" in ex.stderr, ex.stderr
    again = cli("stop", name)  # idempotent: says so, bills the disk as before
    assert again.returncode == 0 and "already stopped" in again.stdout and "/GB-month" in again.stdout, again.stdout
    time.sleep(1.0)  # a stopped interval of measurable length

    r = cli("start", name, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["started"] == [0, 1]
    assert states() == ["running", "running"]
    st = gtrain.status(name)[0]
    assert st["status"] == "up" and [n["status"] for n in st["nodes"]] == ["running", "running"]
    run_job(name, spec)

    cost = next(c for c in gtrain.cost() if c.cluster == name and c.status == "up")
    stopped = [ln for ln in cost.lines if ln.market == "stopped"]
    assert len(stopped) == 2 and all(ln.stopped_at is not None for ln in stopped)
    for ln in stopped:  # the disk only: its $/h over the stopped time, no compute and no billing minimum
        assert ln.price_per_hour == pytest.approx(50 * disk_rate / 730, rel=1e-4)
        assert 0 < ln.cost_usd <= ln.price_per_hour * (ln.stopped_at - ln.started_at) / 3600 + 1e-6
        assert "stopped" in (ln.note or "")
    assert len([ln for ln in cost.lines if ln.market == "on-demand"]) == 4  # before the stop, after the start
    assert cost.status == "up"


@pytest.mark.slow
def test_stop_and_start_an_aws_cluster(moto_server: str, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                       gtrain_home: Path) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    fired = tmp_path / "lifetime-fired"  # what the nodes run to end themselves (EC2: power off = terminate)
    spec = write_spec(tmp_path, "aws-stop", "aws", {
        "ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
        "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2, "idle_command": ["touch", str(fired)]},
        policies={"max_hours": 1})
    res = gtrain.up(spec)
    assert res.cluster is not None
    cid = res.cluster.id
    ec2 = boto3.client("ec2", region_name="us-east-1")
    ids = [n.instance_id for n in sorted(gtrain.api._ctx(None).store.node_records(cid), key=lambda n: n.rank)]

    def states() -> list[str]:
        got = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
               for i in r["Instances"]}
        return [got[i] for i in ids]

    def lifetime_watches() -> dict[int, int]:
        """pid -> the seconds each started node sleeps before it runs the command (its lifetime left)."""
        out = {}
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sh", b"-c"] and str(fired).encode() in argv[2]:
                out[int(d)] = int(argv[2].split()[1])
        return out

    try:
        stop_start_cycle("aws-stop", spec, 0.08, states)
        now = [n.instance_id for n in sorted(gtrain.api._ctx(None).store.node_records(cid), key=lambda n: n.rank)]
        assert now == ids  # the same instances, started again: nothing replaced
        # the time limit the nodes set at first boot is re-armed at `start`, for what is left of the hour they
        # may run (the time they ran before the stop counts; the stopped time does not)
        watches = lifetime_watches()
        assert len(watches) == 2 and all(3600 - 900 < s < 3600 for s in watches.values()), watches
        assert not fired.exists()
    finally:
        for pid in lifetime_watches():
            os.kill(pid, 9)
        down = gtrain.down("aws-stop", yes=True)
    assert not down.already_down
    live = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]},
                                           {"Name": "instance-state-name",
                                            "Values": ["pending", "running", "stopping", "stopped"]}])
    assert not live["Reservations"]
    assert not ec2.describe_key_pairs(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]}])["KeyPairs"]


@pytest.mark.slow
def test_stop_and_start_a_gcp_cluster_and_an_idle_stopped_node(fake_gce: FakeGCE, ssh_hosts,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path, gtrain_home: Path) -> None:
    from gtrain.runs.recovery import _reprovision

    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    spec = write_spec(tmp_path, "gcp-stop", "gcp", {
        "ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} gcp {relay_dir} %h",
        "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2})
    res = gtrain.up(spec)
    assert res.cluster is not None
    cid = res.cluster.id
    names = [f"{cid}-0", f"{cid}-1"]

    def states() -> list[str]:
        with fake_gce.lock:
            got = {k[1]: fake_gce._instance_view(v)["status"] for k, v in fake_gce.instances.items()}
        return ["stopped" if got[n] == "TERMINATED" else got[n].lower() for n in names]

    try:
        inserts = len(fake_gce.inserts)
        run_job("gcp-stop", spec)
        stop_start_cycle("gcp-stop", spec, 0.10, states, had_job=True)
        assert [v for v, _ in fake_gce.starts_stops] == ["stop", "stop", "start", "start"]

        # node 1 powers itself off (the idle watch's `shutdown -h now`; GCE stops it): reported stopped, and
        # `gtrain start` starts that one node, the same instance
        fake_gce.starts_stops.clear()
        own_stop = time.time()
        fake_gce.stop_as_guest(names[1])
        time.sleep(1.0)
        st = gtrain.status("gcp-stop")[0]
        assert [n["status"] for n in st["nodes"]] == ["running", "stopped"]
        r = cli("start", "gcp-stop", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["started"] == [1]
        assert states() == ["running", "running"]
        cost = next(c for c in gtrain.cost() if c.cluster == "gcp-stop" and c.status == "up")
        own = [ln for ln in cost.lines if ln.node_rank == 1 and ln.market == "stopped"][-1]
        # billed as stopped (its disk) from GCE's lastStopTimestamp, not as running until the start
        assert own.started_at == pytest.approx(own_stop, abs=2) and own.stopped_at is not None
        assert own.stopped_at - own.started_at >= 0.9
        assert len([ln for ln in cost.lines if ln.node_rank == 1 and ln.market == "stopped"]) == 2

        # recovery of a node that stopped (rather than went away) starts it instead of making a new one
        fake_gce.stop_as_guest(names[0])
        ctx = gtrain.api._ctx(None)
        try:
            cluster = ctx.store.get_cluster_by_id(cid)
            _reprovision(cluster, None, ctx, {"reprovision": [0], "detected_at": time.time()})
        finally:
            ctx.store.close()
        assert states() == ["running", "running"]
        assert len(fake_gce.inserts) == inserts  # nothing replaced, ever
        run_job("gcp-stop", spec)
    finally:
        down = gtrain.down("gcp-stop", yes=True)
    assert not down.already_down
    assert fake_gce.of_cluster(cid) == {"instance": [], "firewall": []}


def test_providers_that_cannot_stop_refuse_with_exit_2(tmp_path: Path, gtrain_home: Path) -> None:
    spec = tmp_path / "loc.yaml"
    spec.write_text(json.dumps({"name": "loc-stop", "provider": "local", "num_nodes": 1}))
    assert cli("up", str(spec)).returncode == 0
    try:
        for verb in ("stop", "start"):
            r = cli(verb, "loc-stop")
            assert r.returncode == 2, r.stderr
            assert f"gtrain {verb}: provider local cannot stop and start its nodes" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
        assert [c["status"] for c in gtrain.status()] == ["up"]
    finally:
        assert cli("down", "loc-stop", "--yes").returncode == 0
    missing = cli("stop", "no-such")
    assert missing.returncode == 2 and "no-such" in missing.stderr
