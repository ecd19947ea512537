"""A spot loss on AWS with no AWS capacity left moves the run to GCP, end to end.

AWS is moto (a ThreadedMotoServer the nodes reach, also the S3 checkpoint store), GCP the fake Compute Engine;
their instances are real sshd hosts reached through the relay ProxyCommand (as in test_durable_aws.py and
test_gcp_e2e.py). Node 1's spot instance is interrupted mid-run with EC2's real reason, and from then on EC2
answers RunInstances with ``InsufficientInstanceCapacity`` (injected at the HTTP edge by a botocore hook on
every boto3 session, as test_aws.py does on one). Recovery cannot replace node 1 on AWS, so the cluster moves
to the GCP candidate, the job is relaunched there under the same id, restores from the store and finishes
with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

import gtrain
from gtrain.jobs.backend import LogLine
from gtrain.remote import ssh as sshmod
from tests.fixtures.fake_gce import FakeGCE
from tests.integration import durable_nodes as dn
from tests.integration import node_relay
from tests.integration.test_aws import fail_run_instances
from tests.integration.test_durable_aws import instances, kill_instance_world, rank_of, spot_interrupt

RELAY = Path(__file__).parent / "node_relay.py"


@pytest.mark.slow
def test_spot_loss_on_aws_without_capacity_moves_the_run_to_gcp_same_weights(  # type: ignore[no-untyped-def]
        moto_bridge: str, fake_gce: FakeGCE, ssh_hosts, tmp_path: Path, gtrain_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    hosts = [ssh_hosts[2], ssh_hosts[3]] if len(ssh_hosts) >= 4 else [ssh_hosts[0], ssh_hosts[1]]
    relay_aws = node_relay.setup(tmp_path / "relay-aws", hosts)
    relay_gcp = node_relay.setup(tmp_path / "relay-gcp", hosts)
    aws_full = {"on": False}
    real_session = boto3.Session

    class Session(real_session):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            fail_run_instances(self, "InsufficientInstanceCapacity", lambda z, n: aws_full["on"])

    monkeypatch.setattr(boto3, "Session", Session)

    def guest_agent(name: str) -> list[dict[str, str]]:  # the GCE instance's host keys, as the relay maps it
        addr, port = node_relay.assign("gcp", relay_gcp, name)
        host = next(h for h in hosts if (h.address, h.port) == (addr, port))
        kt, b64 = host.host_key_line.split()[:2]
        return [{"namespace": "hostkeys", "key": kt, "value": b64}]

    fake_gce.guest_attributes = guest_agent
    spec, store = dn.durable_spec(
        tmp_path, "hop", moto_bridge,
        resources={"accelerators": "T4:1", "disk_gb": 50, "use_spot": True, "order": "listed",
                   "any_of": [{"provider": "aws", "region": "us-east-1"},
                              {"provider": "gcp", "region": "us-central1", "zones": ["us-central1-a"]}]},
        aws={"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_aws} %h",
             "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2},
        gcp={"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} gcp {relay_gcp} %h",
             "ssh_timeout_s": 60, "poll_s": 0.2})
    notes = dn.Notes()
    res = gtrain.up(spec, report=notes)
    assert res.created and res.cluster is not None and res.cluster.provider == "aws"
    cid = res.cluster.id
    first = {rank_of(i): iid for iid, i in instances(cid).items()}
    interrupted: dict[str, Any] = {}
    try:
        job = gtrain.launch(spec, report=notes)

        def interrupt() -> None:
            host1 = node_relay.host_of(relay_aws, first[1], hosts)
            aws_full["on"] = True  # from now on EC2 has no capacity for this request anywhere
            spot_interrupt(first[1])
            interrupted["at"] = time.time()
            interrupted["killed"] = kill_instance_world(job.job_id, first[1])
            if host1.own_home:
                subprocess.run(host1.in_host("sh", "-c", "rm -rf ~/gtrain/hop"), check=False)

        killer = dn.when_in_store(store, dn.run_key(spec), "step-0003.pt", interrupt)
        lines: list[LogLine] = []
        final = gtrain.wait("hop", job_id=job.job_id, on_line=lines.append, report=notes)
        killer.join(timeout=1)
        assert interrupted.get("killed"), "node 1 was never interrupted"
        assert (final.status, final.exit_code) == ("succeeded", 0), (
            dn.why(lines, notes, final) + "\n" + dn.node_files([h.home for h in hosts], "hop", job.job_id))
        recs = final.info["recoveries"]
        assert len(recs) == 1 and recs[0]["kind"] == "preemption" and recs[0]["moved_to"] == "gcp", recs
        assert recs[0]["reprovision"] == [0, 1]
        # nothing of the cluster runs on AWS any more; both nodes are GCE instances now
        assert not [i for i in instances(cid).values() if i["State"]["Name"] in ("pending", "running")]
        assert sorted(fake_gce.of_cluster(cid)["instance"]) == [f"{cid}-0", f"{cid}-1"]
        st = gtrain.status("hop")[0]
        assert st["provider"] == "gcp" and [n["status"] for n in st["nodes"]] == ["running", "running"]
        moves = st["placement"]["moves"]
        assert [(m["from_provider"], m["to_provider"]) for m in moves] == [("aws", "gcp")] and moves[0]["cost_usd"] > 0
        pulled = gtrain.pull("hop", job_id=job.job_id, to=tmp_path / "out")
        assert "final.pt" in pulled.transferred
        dn.check_resumed_same_weights(lines, tmp_path / "out" / "final.pt")
    finally:
        down = gtrain.down("hop", yes=True)
    assert fake_gce.of_cluster(cid) == {"instance": [], "firewall": []}
    cost = down.cost.to_dict()
    assert cost["provider"] == "gcp" and cost["placement"]["moves"][0]["from_provider"] == "aws"
    assert cost["total_usd"] > cost["placement"]["moves"][0]["cost_usd"] > 0  # the AWS part, then GCP's
    assert json.dumps(cost)  # JSON as `gtrain cost --json` prints it
