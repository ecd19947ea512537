"""`launch --replace-bad`: a node that fails the preflight is replaced through the provider and the checks run
again. On AWS (moto) whose nodes are real sshd hosts behind ``aws.ssh_proxy_command`` (tests/integration/
node_relay.py): the GEMM digests of rank 1 made wrong with the test-only ``GTRAIN_HEALTH_FAULT`` -- keyed on the
rank (the replacement fails too: exit 1, node 1 named, nothing submitted) or on the instance id (the new machine
computes right: the job runs). Local: a clear exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

import gtrain
from gtrain.health.model import HealthFailed
from gtrain.remote import ssh as sshmod
from gtrain.state import StateStore
from tests.integration.node_relay import relay_hosts

RELAY = Path(__file__).parent / "node_relay.py"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=dict(os.environ))


def test_replace_bad_is_a_clear_exit_2_where_nodes_cannot_be_replaced(tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "rl.yaml"
    spec.write_text(json.dumps({"name": "rl", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py"}}))
    r = cli("run", str(spec), "--replace-bad")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--replace-bad: cannot replace nodes on provider local" in r.stderr and "Traceback" not in r.stderr
    assert gtrain.status() == []  # nothing was made
    gtrain.up(spec)
    try:
        r = cli("launch", "--cluster", "rl", "--replace-bad")
        assert r.returncode == 2, r.stdout + r.stderr
        assert "cannot replace nodes on provider local" in r.stderr
        assert gtrain.status("rl")[0]["jobs"] == []
    finally:
        gtrain.down("rl")


@pytest.mark.slow
def test_replace_bad_on_aws_replaces_the_failed_node_and_checks_again(  # type: ignore[no-untyped-def]
        moto_server: str, ssh_hosts, tmp_path: Path, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)  # two hosts for three machines of rank 1: a terminated one's is freed
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('trained')\n")
    spec = tmp_path / "aws-rb.yaml"
    spec.write_text(json.dumps({
        "name": "aws-rb", "provider": "aws", "num_nodes": 2,
        # a GPU type, but no accelerators asked: the sshd hosts have no nvidia-smi (gpu.count: skipped)
        "resources": {"instance_type": "g4dn.xlarge", "region": "us-east-1", "disk_gb": 50},
        "aws": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
                "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2},
        "policies": {"preflight": "quick"},
        "job": {"workdir": str(work), "run": "train.py", "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}},
    }))
    res = gtrain.up(spec)
    assert res.cluster is not None
    cid = res.cluster.id

    def ids() -> dict[int, str | None]:
        store = StateStore()
        try:
            return {n.rank: n.instance_id for n in store.node_records(cid)}
        finally:
            store.close()

    first = ids()
    try:
        # the fault follows rank 1: its replacement is wrong too -> the launch stops, node 1 named
        monkeypatch.setenv("GTRAIN_HEALTH_FAULT", "node:1")
        with pytest.raises(HealthFailed) as e:
            gtrain.launch(spec, replace_bad=True)
        assert e.value.exit_code == 1 and e.value.report.failed_nodes() == [1]
        assert "node 1 sdc.digest" in e.value.message and "after replacing them once" in (e.value.hint or "")
        second = ids()
        assert second[0] == first[0] and second[1] not in (None, first[1])
        assert gtrain.status("aws-rb")[0]["jobs"] == []  # nothing was submitted

        # the fault is that machine's: its replacement computes right, the job runs on the new node
        monkeypatch.setenv("GTRAIN_HEALTH_FAULT", f"instance:{second[1]}")
        job = gtrain.launch(spec, replace_bad=True)
        third = ids()
        assert third[0] == first[0] and third[1] not in (None, first[1], second[1])
        final = gtrain.wait("aws-rb", job_id=job.job_id)
        assert (final.status, final.exit_code) == ("succeeded", 0)

        ec2 = boto3.client("ec2", region_name="us-east-1")
        states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances(
            InstanceIds=[first[1], second[1], third[1]])["Reservations"] for i in r["Instances"]}
        assert states == {first[1]: "terminated", second[1]: "terminated", third[1]: "running"}
        store = StateStore()
        try:
            ledger = {r.ref: r.status for r in store.resources(cid) if r.kind == "instance"}
            ranks = [(i.node_rank, i.stopped_at is None) for i in store.intervals(cid)]
        finally:
            store.close()
        assert ledger[first[1]] == ledger[second[1]] == "deleted" and ledger[third[1]] == "created"
        # each machine of rank 1 is billed for its own time: two closed intervals, then the open one
        assert sorted(ranks) == [(0, True), (1, False), (1, False), (1, True)]
    finally:
        down = gtrain.down("aws-rb")
    assert len(down.cost.lines) == 4
