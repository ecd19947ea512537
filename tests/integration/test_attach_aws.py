"""`gtrain attach NAME --provider aws` after the home that ran `up` is deleted: EC2 is moto, the nodes are two
real sshd hosts reached through ``aws.ssh_proxy_command`` (tests/integration/node_relay.py), and the nodes'
key is the team's (GTRAIN_SSH_KEY), as a CI secret would be. The machine that attaches has no state at all;
status, logs, pull and down work from there, and `gtrain gc` finds nothing left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gtrain
from gtrain.providers.cloud.keys import generate_key
from gtrain.remote import ssh as sshmod
from tests.integration.node_relay import relay_hosts

RELAY = Path(__file__).parent / "node_relay.py"
JOB = """import os, time
os.makedirs(os.environ["GTRAIN_CHECKPOINT_DIR"], exist_ok=True)
for i in range(4):
    print(f"tick {i} of rank {os.environ['RANK']}", flush=True)
    time.sleep(0.3)
open(os.path.join(os.environ["GTRAIN_CHECKPOINT_DIR"], f"r{os.environ['RANK']}.txt"), "w").write("ok")
"""


def gt(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, env=env)


def test_attach_after_the_home_is_gone(moto_server: str, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    team_key = tmp_path / "team" / "id_ed25519"
    team_key.parent.mkdir(mode=0o700)
    generate_key(team_key)
    monkeypatch.setenv("GTRAIN_SSH_KEY", str(team_key))
    home_a = tmp_path / "a"
    monkeypatch.setenv("GTRAIN_HOME", str(home_a))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(JOB)
    spec = tmp_path / "adopt.yaml"
    spec.write_text(json.dumps({
        "name": "adopt", "provider": "aws", "num_nodes": 2,
        "resources": {"accelerators": "T4:1", "region": "us-east-1", "disk_gb": 50},
        "aws": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
                "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2},
        "job": {"workdir": str(work), "run": "train.py", "nproc_per_node": 1, "checkpoint_dir": "ckpt",
                "python": sys.executable, "launcher": "python"},
    }))
    res = gtrain.up(spec)
    assert res.created and res.cluster is not None
    cid = res.cluster.id
    job = gtrain.launch(spec)
    sshmod.close_all()
    shutil.rmtree(home_a)  # the laptop is gone
    env = {**os.environ, "GTRAIN_HOME": str(tmp_path / "b"), "NO_COLOR": "1"}
    r = gt(env, "attach", "adopt", str(spec), "--provider", "aws", "--region", "us-east-1", "--json")
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "b"))  # the rest in this process: one SSH connection a node
    try:
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["id"] == cid and got["num_nodes"] == 2 and got["jobs"] == [job.job_id]
        st = gtrain.status("adopt")[0]
        assert [n["status"] for n in st["nodes"]] == ["running", "running"] and st["id"] == cid
        lines: list = []  # type: ignore[type-arg]
        final = gtrain.wait("adopt", on_line=lines.append)
        assert (final.id, final.status, final.exit_code) == (job.job_id, "succeeded", 0)
        assert {"tick 3 of rank 0", "tick 3 of rank 1"} <= {ln.text for ln in lines}
        gtrain.pull("adopt", to=tmp_path / "ck")
        assert sorted(p.name for p in (tmp_path / "ck").rglob("*.txt")) == ["r0.txt", "r1.txt"]
    finally:
        down = gtrain.down("adopt")
    assert len(down.cost.lines) == 2
    assert all((ln.note or "").startswith("reconstructed by gtrain attach") and ln.estimate for ln in down.cost.lines)
    from gtrain.context import Context

    ctx = Context()
    try:
        left = ctx.provider("aws").gc(["us-east-1"], set(), False)
    finally:
        ctx.store.close()
    assert [o for o in left.orphans if o.cluster_id == cid] == []
