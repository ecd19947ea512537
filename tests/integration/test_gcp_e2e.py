"""End to end on GCP (the fake Compute Engine): `gtrain up` makes 2 instances in the fake; their SSH goes
through ``gcp.ssh_proxy_command`` (%h = instance name) to two real sshd hosts (tests/fixtures/sshd.py), which
get the key from the instances' ``ssh-keys`` metadata as GCE's guest agent would, and whose host keys the
fake publishes as the instances' guest attributes (``hostkeys/``), as the guest agent would: gtrain pins them
before it connects. A real 2-node torchrun job (gloo, CPU) runs there; then pull and down, and nothing is
left in the fake."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import gtrain
from gtrain.events import Reporter
from gtrain.remote import ssh as sshmod
from tests.fixtures.fake_gce import FakeGCE
from tests.integration.node_relay import assign, relay_hosts

JOBS = Path(__file__).parent / "jobs"
RELAY = Path(__file__).parent / "node_relay.py"


@pytest.mark.slow
def test_two_node_torchrun_on_gce_nodes_over_proxy_command(fake_gce: FakeGCE, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                           gtrain_home: Path) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    work = tmp_path / "work"
    work.mkdir()
    (work / "probe.py").write_text((JOBS / "probe.py").read_text())
    spec = tmp_path / "gcp-e2e.yaml"
    spec.write_text(json.dumps({
        "name": "gcp-e2e", "provider": "gcp", "num_nodes": 2,
        "resources": {"accelerators": "T4:1", "region": "us-central1", "disk_gb": 50},
        "gcp": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} gcp {relay_dir} %h",
                "ssh_timeout_s": 60, "poll_s": 0.2},
        "job": {"workdir": str(work), "run": "probe.py", "nproc_per_node": 2, "checkpoint_dir": "ckpt",
                "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}},
    }))

    def guest_agent(name: str) -> list[dict[str, str]]:  # the instance's host, as the relay will map it
        addr, port = assign("gcp", relay_dir, name)
        host = next(h for h in hosts if (h.address, h.port) == (addr, port))
        kt, b64 = host.host_key_line.split()[:2]
        return [{"namespace": "hostkeys", "key": kt, "value": b64}]

    fake_gce.guest_attributes = guest_agent
    said: list[str] = []

    class Said(Reporter):
        def node(self, rank: int, msg: str) -> None:
            said.append(msg)

    res = gtrain.up(spec, report=Said())
    assert res.created and res.cluster is not None
    cid = res.cluster.id
    assert said.count("host keys pinned from the instance's guest attributes (1)") == 2, said
    assert not [m for m in said if "trusting the key on first use" in m]
    try:
        mapping = json.loads((relay_dir / "map.json").read_text())
        assert sorted(mapping) == [f"{cid}-0", f"{cid}-1"]  # each instance reached its own host by name
        # ssh_cidr auto + a proxy command: no port 22 opened, only the rule between the cluster's instances
        assert fake_gce.of_cluster(cid)["firewall"] == [f"gtrain-{cid}-int"]
        kh = (gtrain_home / "ssh" / "known_hosts").read_text()
        assert all(h.host_key_line.split()[1] in kh for h in hosts)  # pinned from the guest attributes
        status = gtrain.status("gcp-e2e")[0]
        assert [n["status"] for n in status["nodes"]] == ["running", "running"]
        if ssh_hosts.mode == "netns":
            assert {n["address"] for n in status["nodes"]} == {h.address for h in hosts}

        job = gtrain.launch(spec)
        lines: list = []  # type: ignore[type-arg]
        final = gtrain.wait("gcp-e2e", job_id=job.job_id, on_line=lines.append)
        assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-30:]
        assert sorted(ln.rank for ln in lines if ln.text.startswith("hello from rank")) == [0, 1, 2, 3]
        pulled = gtrain.pull("gcp-e2e", to=tmp_path / "ck")
        assert "sub/model.bin" in pulled.transferred
    finally:
        down = gtrain.down("gcp-e2e")
    assert not down.already_down and len(down.cost.lines) == 2
    assert fake_gce.of_cluster(cid) == {"instance": [], "firewall": []}
