"""An elastic run that starts with the capacity there is (issue 37), on AWS: moto for EC2 and S3 in this process,
sshd hosts playing the instances (as test_durable_aws.py). ``num_nodes: {min: 1, max: 2}``; EC2 has capacity for
one instance at ``up`` (RunInstances answers as EC2 documents it: no instance below MinCount --
InsufficientInstanceCapacity -- else as many as it can up to MaxCount), so gtrain asks for 1..2, gets 1, and the
run trains on it. The watcher asks again for the other node (it gets InsufficientInstanceCapacity while there is
none); once capacity comes it makes rank 1, starts the job's part there, and the run grows to world size 2 with
node 0's torchrun agent never restarted, and ends with every step done."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

import gtrain
from gtrain.jobs.backend import LogLine
from gtrain.remote import ssh as sshmod
from tests.integration import durable_nodes as dn
from tests.integration import node_relay

RELAY = Path(__file__).parent / "node_relay.py"
JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY, SLEEP = 60, 5, 0.4
LINE = re.compile(r"rank (\d+) (?:step|start) (\d+) world (\d+) agent (-?\d+) t ([\d.]+)")


def ec2_capacity(monkeypatch: pytest.MonkeyPatch, free: dict[str, int]) -> list[tuple[int, int, int]]:
    """RunInstances as EC2 documents it against ``free["n"]`` instances of capacity: fewer than MinCount free
    makes none (InsufficientInstanceCapacity), else min(MaxCount, free) are made. moto alone makes MinCount.
    Returns the calls as (MinCount, MaxCount, made)."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.instances import InstanceResponse

    orig = InstanceResponse.run_instances
    calls: list[tuple[int, int, int]] = []

    def run_instances(self: Any) -> Any:
        lo = int(self._get_param("MinCount", if_none="1"))
        hi = int(self._get_param("MaxCount", if_none=str(lo)))
        if lo > free["n"]:
            calls.append((lo, hi, 0))
            raise EC2ClientError("InsufficientInstanceCapacity",
                                 f"We currently do not have sufficient capacity in the Availability Zone you "
                                 f"requested ({lo} asked, {free['n']} free)")
        n = min(hi, free["n"])
        free["n"] -= n
        calls.append((lo, hi, n))
        get = self._get_param
        self._get_param = lambda name, if_none=None: str(n) if name == "MinCount" else get(name, if_none)
        return orig(self)

    monkeypatch.setattr(InstanceResponse, "run_instances", run_instances)
    return calls


@pytest.mark.slow
def test_elastic_run_starts_on_the_capacity_there_is_and_grows(  # type: ignore[no-untyped-def]
        moto_bridge: str, ssh_hosts, tmp_path: Path, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GTRAIN_ELASTIC_RETRY_S", "3")
    monkeypatch.setenv("GTRAIN_CHECKPOINT_POLL_S", "0.3")
    free = {"n": 1}
    calls = ec2_capacity(monkeypatch, free)
    hosts = [ssh_hosts[2], ssh_hosts[3]] if len(ssh_hosts) >= 4 else [ssh_hosts[0], ssh_hosts[1]]
    relay_dir = node_relay.setup(tmp_path / "relay", hosts)
    boto3.client("s3").create_bucket(Bucket="elastic-grow")
    store = "s3://elastic-grow/runs"
    work = tmp_path / "work"
    work.mkdir()
    (work / "elastic_dcp_train.py").write_text((JOBS / "elastic_dcp_train.py").read_text())
    spec = tmp_path / "grow.yaml"
    spec.write_text(json.dumps({
        "name": "grow", "provider": "aws", "num_nodes": {"min": 1, "max": 2},
        "resources": {"accelerators": "T4:1", "region": "us-east-1", "zones": ["us-east-1a"], "disk_gb": 50},
        "aws": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
                "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2},
        "job": {"workdir": str(work), "run": f"elastic_dcp_train.py {STEPS} {EVERY} {SLEEP}", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "checkpoint_store": store, "python": sys.executable,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3},
                "env": {**dn.NODE_ENV, "AWS_ENDPOINT_URL": moto_bridge}},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0}}}))
    notes = dn.Notes()
    res = gtrain.up(spec, report=notes)
    assert res.cluster is not None and res.cluster.num_nodes == 1, notes.lines
    assert calls == [(1, 2, 1)], calls  # 1..2 asked, 1 made
    assert any("1 of 2 node(s) now" in x for x in notes.lines), notes.lines
    try:
        job = gtrain.launch(spec, report=notes)
        capacity_at: dict[str, float] = {}

        def capacity_comes() -> None:
            free["n"] = 4
            capacity_at["t"] = time.time()

        # capacity comes back once the one-node run has a checkpoint in the store (its asks meanwhile are refused)
        filler = dn.when_in_store(store, dn.run_key(spec), "step-10", capacity_comes)
        lines: list[LogLine] = []
        final = gtrain.wait("grow", job_id=job.job_id, on_line=lines.append, report=notes)
        filler.join(timeout=1)
        assert (final.status, final.exit_code) == ("succeeded", 0), (
            dn.why(lines, notes, final) + "\n" + dn.node_files([h.home for h in hosts], "grow", job.job_id))
        assert capacity_at, "the run never reached step-10"
        refused = [c for c in calls[1:] if c[2] == 0]
        assert refused and all(c[:2] == (1, 1) for c in calls[1:]), calls  # asked for the one missing node
        seen = [(x.node, *map(float, m.groups())) for x in lines if (m := LINE.search(x.text))]
        assert {w for n, _r, _s, w, _a, t in seen if t < capacity_at["t"]} == {1.0}, seen[:5]
        agents0 = {int(a) for n, _r, _s, _w, a, _t in seen if n == 0}
        assert len(agents0) == 1, agents0  # node 0's torchrun agent: the same process throughout
        last = [w for _n, _r, s, w, _a, _t in seen if s == STEPS]
        assert last and set(last) == {2.0}, last
        sizes = [int(x[1]) for x in final.info["world_sizes"]]
        assert sizes[0] == 1 and sizes[-1] == 2, final.info["world_sizes"]
        grew = min(t for n, _r, _s, w, _a, t in seen if w == 2)
        print(f"capacity back -> training at world size 2: {grew - capacity_at['t']:.1f}s")
    finally:
        gtrain.down("grow", yes=True)
