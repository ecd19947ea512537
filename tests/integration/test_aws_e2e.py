"""End to end on AWS (moto): `gtrain up` provisions 2 nodes in moto; their SSH goes through
``aws.ssh_proxy_command`` (%h = instance id) to two real sshd hosts (tests/fixtures/sshd.py), where a real
2-node torchrun job (gloo, CPU) runs; then pull and down, and nothing is left in moto."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import boto3
import pytest

import gtrain
from gtrain.providers.aws import TAG_CLUSTER
from gtrain.remote import ssh as sshmod
from tests.integration.node_relay import relay_hosts

JOBS = Path(__file__).parent / "jobs"
RELAY = Path(__file__).parent / "node_relay.py"


@pytest.mark.slow
def test_two_node_torchrun_on_moto_nodes_over_proxy_command(moto_server: str, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                            gtrain_home: Path) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    work = tmp_path / "work"
    work.mkdir()
    (work / "probe.py").write_text((JOBS / "probe.py").read_text())
    spec = tmp_path / "aws-e2e.yaml"
    spec.write_text(json.dumps({
        "name": "aws-e2e", "provider": "aws", "num_nodes": 2,
        "resources": {"accelerators": "T4:1", "region": "us-east-1", "disk_gb": 50},
        "aws": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
                "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2,
                # the idle watch's command: a marker file here, not a power-off of the machine running the tests
                "idle_command": ["sh", "-c", f"mktemp {tmp_path}/idle-fired.XXXXXX"]},
        "policies": {"idle_minutes": 0.05},
        "job": {"workdir": str(work), "run": "probe.py", "nproc_per_node": 2, "checkpoint_dir": "ckpt",
                "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}},
    }))
    res = gtrain.up(spec)
    assert res.created and res.cluster is not None
    cid = res.cluster.id
    try:
        mapping = json.loads((relay_dir / "map.json").read_text())
        assert len(mapping) == 2  # each instance reached its own host through the proxy command
        # trust on first use (moto's console output has no host keys): both hosts' keys recorded
        kh = (gtrain_home / "ssh" / "known_hosts").read_text()
        assert all(h.host_key_line.split()[1] in kh for h in hosts)
        status = gtrain.status("aws-e2e")[0]
        assert [n["status"] for n in status["nodes"]] == ["running", "running"]
        addrs = {n["address"] for n in status["nodes"]}
        if ssh_hosts.mode == "netns":
            assert addrs == {h.address for h in hosts}  # the nodes' own addresses, for the rendezvous

        job = gtrain.launch(spec)
        lines: list = []  # type: ignore[type-arg]
        final = gtrain.wait("aws-e2e", job_id=job.job_id, on_line=lines.append)
        assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-30:]
        hello = sorted(ln.rank for ln in lines if ln.text.startswith("hello from rank"))
        assert hello == [0, 1, 2, 3]
        pulled = gtrain.pull("aws-e2e", to=tmp_path / "ck")
        assert "sub/model.bin" in pulled.transferred
        # policies.idle_minutes (3 s here): every node's watcher ran its command once nothing was running
        deadline = time.monotonic() + 60
        want = 2 if ssh_hosts.mode == "netns" else 1  # loopback hosts share one home, so one watcher
        while len(list(tmp_path.glob("idle-fired.*"))) < want:
            assert time.monotonic() < deadline, "the idle watch did not fire"
            time.sleep(0.2)
    finally:
        down = gtrain.down("aws-e2e")
    assert not down.already_down and len(down.cost.lines) == 2
    ec2 = boto3.client("ec2", region_name="us-east-1")
    live = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]},
                                           {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert not live["Reservations"]
    assert not ec2.describe_key_pairs(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]}])["KeyPairs"]
