"""Elastic runs on AWS (issue 37), end to end: moto for EC2 and S3 (tests/fixtures/moto_bridge.py, on an address
the nodes reach; RunInstances answers as EC2 documents it: test_elastic_aws_grow.ec2_capacity), three real sshd
hosts playing the spot instances through the relay ProxyCommand (node_relay.py), ``num_nodes: {min: 2, max: 3}``
and the FSDP2 + DCP trainer. Once ``step-10`` is whole in the store, EC2 takes node 2's instance back
(``Server.SpotInstanceTermination``) and its processes, connections and disk go with it. The watcher learns it
from the provider and, while node 0's and node 1's torchrun agents keep training at world size 2, provisions a NEW
instance for rank 2 only and starts node 2's part there; it joins and the run ends at world size 3 with every
step done (tests/integration/elastic_nodes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gtrain.remote import ssh as sshmod
from tests.integration import elastic_nodes as en
from tests.integration.test_elastic_aws_grow import ec2_capacity
from tests.integration.test_elastic_ssh import check


@pytest.mark.slow
def test_elastic_run_on_aws_loses_node_2_to_ec2_and_the_survivors_keep_training(
        moto_bridge: str, ssh_hosts: Any, tmp_path: Path, gtrain_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    ec2_capacity(monkeypatch, {"n": 10})  # RunInstances makes MaxCount where there is capacity (moto: MinCount)
    assert len(ssh_hosts) >= 3, "GTRAIN_TEST_SSH_HOSTS must give at least 3 hosts"
    o = en.drive(tmp_path, "aws", elastic=True, endpoint=moto_bridge, hosts=list(ssh_hosts)[-3:], name="eaws")
    rec = check(o, reprovision=[2], within_s=60)  # a cloud's rendezvous: 15 s keep-alive, 5 s last call
    assert rec["kind"] == "preemption" and "SpotInstanceTermination" in rec["detail"], rec
    assert rec["cost_usd"] > 0, rec
    # a NEW instance for rank 2 only; rank 0's and rank 1's kept (down has ended them all since)
    first, now = o.extra["first"], o.extra["now"]
    assert sorted(first) == [0, 1, 2] and sorted(now) == [0, 1, 2], (first, now)
    assert now[0] == first[0] and now[1] == first[1] and now[2] != first[2], (first, now)
    assert not en.instances(o.extra["cluster_id"])
