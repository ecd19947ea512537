"""`gtrain attach NAME --provider gcp` after the home that ran `up` is deleted: Compute Engine is the fake GCE
(tests/fixtures/fake_gce.py), the nodes two real sshd hosts reached through ``gcp.ssh_proxy_command``, the
nodes' key the team's (GTRAIN_SSH_KEY). The new home finds the cluster by its labels, pins the host keys from the
guest attributes, rebuilds the job from node 0's record, follows it and tears it down."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import gtrain
from gtrain.context import Context
from gtrain.providers.cloud.keys import generate_key
from gtrain.remote import ssh as sshmod
from gtrain.runs.attach import attach
from gtrain.spec import load_spec
from tests.fixtures.fake_gce import FakeGCE
from tests.integration.node_relay import assign, relay_hosts

RELAY = Path(__file__).parent / "node_relay.py"
JOB = "import os\nprint('adopted rank', os.environ['RANK'], flush=True)\n"


def test_attach_gcp_by_labels_after_the_home_is_gone(fake_gce: FakeGCE, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    team_key = tmp_path / "team" / "id_ed25519"
    team_key.parent.mkdir(mode=0o700)
    generate_key(team_key)
    monkeypatch.setenv("GTRAIN_SSH_KEY", str(team_key))
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "a"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    spec = tmp_path / "adoptg.yaml"
    spec.write_text(json.dumps({
        "name": "adoptg", "provider": "gcp", "num_nodes": 2,
        "resources": {"accelerators": "T4:1", "region": "us-central1", "disk_gb": 50},
        "gcp": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} gcp {relay_dir} %h",
                "ssh_timeout_s": 60, "poll_s": 0.2},
        "job": {"workdir": str(work), "run": "job.py", "nproc_per_node": 1, "python": sys.executable,
                "launcher": "python"},
    }))

    def guest_agent(name: str) -> list[dict[str, str]]:
        addr, port = assign("gcp", relay_dir, name)
        host = next(h for h in hosts if (h.address, h.port) == (addr, port))
        kt, b64 = host.host_key_line.split()[:2]
        return [{"namespace": "hostkeys", "key": kt, "value": b64}]

    fake_gce.guest_attributes = guest_agent
    res = gtrain.up(spec)
    assert res.cluster is not None
    cid = res.cluster.id
    job = gtrain.launch(spec)
    sshmod.close_all()
    shutil.rmtree(tmp_path / "a")
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "b"))
    ctx = Context()
    try:
        try:
            got = attach(ctx, "adoptg", "gcp", [], load_spec(str(spec)))
            assert got.id == cid and [n.instance_id for n in ctx.store.node_records(cid)] == [f"{cid}-0", f"{cid}-1"]
            assert [j.id for j in ctx.store.jobs(cid)] == [job.job_id]
        finally:
            ctx.store.close()
        lines: list = []  # type: ignore[type-arg]
        final = gtrain.wait("adoptg", on_line=lines.append)
        assert (final.status, final.exit_code) == ("succeeded", 0)
        assert sorted(ln.text for ln in lines if ln.text.startswith("adopted")) == ["adopted rank 0", "adopted rank 1"]
    finally:
        down = gtrain.down("adoptg")
    assert all((ln.note or "").startswith("reconstructed by gtrain attach") for ln in down.cost.lines)
    assert len(down.cost.lines) == 2
    assert fake_gce.of_cluster(cid) == {"instance": [], "firewall": []}
