"""Elastic runs on the ssh provider (issue 37): three real sshd hosts, ``num_nodes: {min: 2, max: 3}``, the FSDP2 +
DCP trainer under torchrun's c10d rendezvous on node 0, its store on moto's S3 (an address the hosts reach). Every
process of node 2's part is SIGKILLed once ``step-10`` is whole in the store, as a machine that died would lose
them. The host is still there: the watcher clears what the dead agent left and starts node 2's part on it alone
(nothing re-provisioned); node 0's and node 1's torchrun agents are never restarted -- they re-rendezvous at world
size 2 and go on from the newest checkpoint, resharded by ``dcp.load`` -- node 2 joins, and the run ends at world
size 3 with every step done (tests/integration/elastic_nodes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gtrain.remote import ssh as sshmod
from tests.integration import elastic_nodes as en


def check(o: en.Outcome, *, reprovision: list[int], within_s: float = 30) -> dict[str, Any]:
    """The issue's bar, the same on every provider (training again ``within_s`` of the loss: the survivors' next
    round waits out the dead node's keep-alive and the last call, docs/durable.md); the recovery record."""
    import torch

    assert (o.job.status, o.job.exit_code) == ("succeeded", 0), o.why()
    recs = o.job.info["recoveries"]
    assert len(recs) == 1, recs
    rec = recs[0]
    assert rec["elastic"] and rec["lost"] == [2] and rec["attempt"] == 1, rec  # no new attempt: nothing restarted
    assert rec["reprovision"] == reprovision, rec
    seen = o.steps
    # node 0's (and node 1's) torchrun agent is the same process before and after the loss
    for node in (0, 1):
        agents = {s.agent for s in seen if s.node == node}
        assert len(agents) == 1 and -1 not in agents, (node, agents)
    assert any(s.node == 0 and s.t < o.killed_at for s in seen) and any(s.node == 0 and s.t > o.killed_at
                                                                      for s in seen)
    # the survivors trained at world size 2 after the loss, within seconds of it
    shrunk = sorted(s.t for s in seen if s.world == 2 and not s.start and s.t > o.killed_at)
    assert shrunk, o.why()
    assert shrunk[0] - o.killed_at < within_s, shrunk[0] - o.killed_at
    assert {s.node for s in seen if s.world == 2} == {0, 1}
    # ... and the run ends at world size 3 with every step done
    last = [s.world for s in seen if s.step == en.STEPS and not s.start]
    assert last and set(last) == {3}, last
    final = torch.load(o.out / "final.pt")
    assert final["step"] == en.STEPS and final["world"] == 3
    t = en.timings(o)
    print(f"node loss -> training again at world size {t['again_world']}: {t['again_s']}s; "
          f"-> world size 3 again: {t['full_s']}s; gtrain's rejoin: {rec['seconds']:.1f}s after detection")
    return dict(rec)


@pytest.mark.slow
def test_elastic_run_on_ssh_hosts_loses_node_2_and_the_survivors_keep_training(
        moto_bridge: str, ssh_hosts: Any, tmp_path: Path, gtrain_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    assert len(ssh_hosts) >= 3, "GTRAIN_TEST_SSH_HOSTS must give at least 3 hosts"
    o = en.drive(tmp_path, "ssh", elastic=True, endpoint=moto_bridge, hosts=list(ssh_hosts)[:3], name="essh")
    rec = check(o, reprovision=[])
    assert "the job's agent died" in rec["detail"], rec
