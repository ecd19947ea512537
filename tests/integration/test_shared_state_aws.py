"""The CI flow of tests/integration/test_shared_state.py on aws: EC2 is moto, the nodes are two real sshd hosts
reached through ``aws.ssh_proxy_command`` (tests/integration/node_relay.py), the nodes' key is the team's
(GTRAIN_SSH_KEY), the shared state is on SeaweedFS (``AWS_ENDPOINT_URL_S3``; EC2 at ``AWS_ENDPOINT_URL``).
Machine A (a CI job) runs `up` and `launch`; machine B, its home empty, follows the job to its end, pulls and
tears down with the cost report (who started it included); A's `status` then says torn down."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.errors import ClusterNotFound
from gtrain.providers.cloud.keys import generate_key
from gtrain.remote import ssh as sshmod
from tests.integration.node_relay import relay_hosts
from tests.integration.test_attach_aws import JOB, RELAY

CI = {"GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": "42", "GITHUB_REPOSITORY": "o/r",
      "GITHUB_SERVER_URL": "https://github.com"}


def test_ci_flow_on_aws(moto_server: str, weed_env: Any, ssh_hosts: Any, tmp_path: Path,  # type: ignore[no-untyped-def]
                        monkeypatch: pytest.MonkeyPatch) -> None:
    from gtrain.sync.s3wire import S3Wire

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", weed_env.endpoint)  # the state; EC2 (and the relay's) on moto
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    bucket = f"state-{uuid.uuid4().hex[:12]}"
    wire = S3Wire()
    wire.request("PUT", bucket)
    wire.close()
    monkeypatch.setenv("GTRAIN_STATE", f"s3://{bucket}/team")
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    team_key = tmp_path / "team" / "id_ed25519"
    team_key.parent.mkdir(mode=0o700)
    generate_key(team_key)
    monkeypatch.setenv("GTRAIN_SSH_KEY", str(team_key))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(JOB)
    spec = tmp_path / "ci.yaml"
    spec.write_text(json.dumps({
        "name": "ci-aws", "provider": "aws", "num_nodes": 2,
        "resources": {"accelerators": "T4:1", "region": "us-east-1", "disk_gb": 50},
        "aws": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
                "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2},
        "job": {"workdir": str(work), "run": "train.py", "nproc_per_node": 1, "checkpoint_dir": "ckpt",
                "python": sys.executable, "launcher": "python"},
    }))
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "a"))  # machine A: a CI job
    with monkeypatch.context() as ci:
        for k, v in CI.items():
            ci.setenv(k, v)
        cid = gtrain.up(spec).cluster.id  # type: ignore[union-attr]
        job = gtrain.launch(spec)
    sshmod.close_all()  # machine B: its own connections, nothing in its home
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "b"))
    try:
        st = gtrain.status("ci-aws")[0]
        assert st["id"] == cid and st["by"] == "https://github.com/o/r/actions/runs/42"
        lines: list = []  # type: ignore[type-arg]
        final = gtrain.wait("ci-aws", on_line=lines.append)
        assert (final.id, final.status, final.exit_code) == (job.job_id, "succeeded", 0)
        assert {"tick 3 of rank 0", "tick 3 of rank 1"} <= {ln.text for ln in lines}
        gtrain.pull("ci-aws", to=tmp_path / "ck")
        assert sorted(p.name for p in (tmp_path / "ck").rglob("*.txt")) == ["r0.txt", "r1.txt"]
    finally:
        down = gtrain.down("ci-aws")
    assert len(down.cost.lines) == 2 and down.cost.by == "https://github.com/o/r/actions/runs/42"
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "a"))  # machine A sees it gone
    with pytest.raises(ClusterNotFound, match="torn down"):
        gtrain.status("ci-aws")
