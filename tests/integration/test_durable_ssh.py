"""Durable runs on the ssh provider (two real sshd hosts; the store is moto's S3 on an address the hosts
reach): kill -9 every process of node 1's job mid-run. The host is still there, so the watcher relaunches
on it (nothing re-provisioned); both nodes restore from the store and the job ends with the weights of an
uninterrupted run, at most one checkpoint interval computed twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.jobs.backend import LogLine
from gtrain.remote import ssh as sshmod
from tests.integration import durable_nodes as dn


@pytest.mark.slow
def test_kill9_of_node1_on_ssh_hosts_recovers_on_that_host(moto_bridge: str, ssh_hosts: Any, tmp_path: Path,
                                                           gtrain_home: Path, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    hosts = [ssh_hosts[0], ssh_hosts[1]]
    spec, store = dn.durable_spec(tmp_path, "dssh", moto_bridge, provider="ssh", ssh={
        "user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
        "hosts": [f"{h.address}:{h.port}" for h in hosts],
        "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts}})
    notes = dn.Notes()
    killed: list[int] = []
    assert gtrain.up(spec, report=notes).created
    try:
        job = gtrain.launch(spec, report=notes)
        killer = dn.when_in_store(store, dn.run_key(spec), "step-0003.pt",
                               lambda: killed.append(dn.kill9(dn.pids_where(dn.of_node(job.job_id, 1)))))
        lines: list[LogLine] = []
        final = gtrain.wait("dssh", job_id=job.job_id, on_line=lines.append, report=notes)
        killer.join(timeout=1)
        assert killed and killed[0] > 0, "node 1 was never killed"
        assert (final.status, final.exit_code) == ("succeeded", 0), dn.why(lines, notes, final)
        recs = final.info["recoveries"]
        assert len(recs) == 1, recs
        rec = recs[0]
        assert rec["kind"] == "node_failure" and rec["lost"] == [1] and rec["reprovision"] == [], rec
        assert rec["attempt"] == 2 and 0 < rec["seconds"] < 30, rec
        assert "the job's agent died" in rec["detail"], rec
        pulled = gtrain.pull("dssh", job_id=job.job_id, to=tmp_path / "out")
        assert "final.pt" in pulled.transferred
        dn.check_resumed_same_weights(lines, tmp_path / "out" / "final.pt")
        # same hosts, same job id: the killed attempt's files are kept aside on that host
        st = gtrain.status("dssh")[0]
        assert [n["status"] for n in st["nodes"]] == ["running", "running"]
        if hosts[1].own_home:
            kept = subprocess.run(hosts[1].in_host("sh", "-c", f"cat ~/gtrain/dssh/jobs/{job.job_id}/attempt"
                                                   f" ~/gtrain/dssh/jobs/{job.job_id}/attempt-1/state.json"),
                                  capture_output=True, text=True)
            assert kept.returncode == 0 and kept.stdout.startswith("2\n") and '"running"' in kept.stdout, kept
    finally:
        gtrain.down("dssh", yes=True)


@pytest.mark.slow
def test_fsdp2_dcp_run_on_ssh_hosts_loses_a_node_and_resumes_on_the_whole_step(
        moto_bridge: str, ssh_hosts: Any, tmp_path: Path, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36 on hosts that share nothing: the FSDP2 + DCP trainer (2 nodes x 2 processes; node 0 writes
    ``.metadata``, ``__0_0``, ``__1_0``, node 1 ``__2_0``, ``__3_0``), every process of node 1 SIGKILLed once
    ``step-4`` is whole in the store. Both hosts restore the whole step (what a host wrote itself is kept), every
    rank resumes with ``dcp.load``, and the weights pulled at the end equal an uninterrupted run's, bit for bit."""
    import boto3
    import torch

    from tests.integration.test_durable_sharded import EVERY, SHARDS, STALL_AT, STEPS, _reference

    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GTRAIN_CHECKPOINT_POLL_S", "0.3")
    hosts = [ssh_hosts[0], ssh_hosts[1]]
    boto3.client("s3").create_bucket(Bucket="durable-dcpssh")
    store = "s3://durable-dcpssh/runs"
    work = tmp_path / "work"
    work.mkdir()
    (work / "fsdp_dcp_train.py").write_text((dn.JOBS / "fsdp_dcp_train.py").read_text())
    spec = tmp_path / "dcpssh.yaml"
    spec.write_text(json.dumps({
        "name": "dcpssh", "num_nodes": 2, "provider": "ssh",
        "ssh": {"user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
                "hosts": [f"{h.address}:{h.port}" for h in hosts],
                "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts}},
        "job": {"workdir": str(work), "run": f"fsdp_dcp_train.py {STEPS} {EVERY} {STALL_AT}", "nproc_per_node": 2,
                "checkpoint_dir": "ckpt", "checkpoint_store": store, "python": sys.executable,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3},
                "env": {**dn.NODE_ENV, "AWS_ENDPOINT_URL": moto_bridge, "SIGNALS": "."}},
        "policies": {"recovery": {"max_restarts": 1, "backoff_s": 0}}}))
    notes = dn.Notes()
    killed: list[int] = []
    assert gtrain.up(spec, report=notes).created
    try:
        job = gtrain.launch(spec, report=notes)
        killer = dn.when_in_store(store, dn.run_key(spec), f"step-{STALL_AT}",
                                  lambda: killed.append(dn.kill9(dn.pids_where(dn.of_node(job.job_id, 1)))))
        lines: list[LogLine] = []
        final = gtrain.wait("dcpssh", job_id=job.job_id, on_line=lines.append, report=notes)
        killer.join(timeout=1)
        text = [x.text for x in lines]
        assert killed and killed[0] > 0, ("node 1 was never killed", text[-30:])
        assert (final.status, final.exit_code) == ("succeeded", 0), dn.why(lines, notes, final)
        recs = final.info["recoveries"]
        assert len(recs) == 1 and recs[0]["lost"] == [1] and recs[0]["reprovision"] == [], recs
        starts = sorted(x for x in text if x.startswith("attempt 2 "))
        assert starts == [f"attempt 2 rank {r} start {STALL_AT}" for r in range(4)], text[-40:]
        holds = sorted(x for x in text if " node holds " in x)
        assert holds == [f"rank {r} node holds {' '.join(SHARDS)}" for r in range(4)], holds
        for node, own in ((0, 3), (1, 2)):
            said = [x for x in text if x.startswith(f"[gtrain] node {node} attempt 2: resume from")]
            assert said, text[-40:]
            doc = json.loads(said[0].split(" (", 1)[1].rstrip(")"))
            assert doc["name"] == f"step-{STALL_AT}" and (doc["files"], doc["kept"]) == (len(SHARDS) - own, own), doc
        pulled = gtrain.pull("dcpssh", job_id=job.job_id, to=tmp_path / "out")
        assert "final.pt" in pulled.transferred
        got, want = torch.load(tmp_path / "out" / "final.pt"), _reference(tmp_path)
        assert got["step"] == want["step"] == STEPS
        for k, v in want["model"].items():  # type: ignore[attr-defined]
            assert torch.equal(got["model"][k], v), k
    finally:
        gtrain.down("dcpssh", yes=True)
