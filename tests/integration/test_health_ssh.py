"""`gtrain health` across two real sshd hosts (tests/fixtures/sshd.py): the all-reduce and the GEMM digests run
as a job over SSH with gloo, and the host made to compute wrong numbers is named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gtrain
from gtrain.context import Context
from gtrain.health.checks import run_health
from gtrain.remote import ssh as sshmod


def test_health_over_ssh_names_the_faulty_host(ssh_hosts, tmp_path: Path, gtrain_home: Path,  # type: ignore[no-untyped-def]
                                                monkeypatch) -> None:
    sshmod.close_all()
    hosts = [ssh_hosts[0], ssh_hosts[1]]
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    section = {"user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
               "hosts": [f"{h.address}:{h.port}" for h in hosts],
               "host_keys": {f"{hosts[0].address}:{hosts[0].port}": hosts[0].host_key_line}}
    spec = tmp_path / "hs.yaml"
    spec.write_text(json.dumps({"name": "hs", "provider": "ssh", "num_nodes": 2, "ssh": section,
                                "job": {"workdir": str(work), "run": "train.py", "env": {"OMP_NUM_THREADS": "1"}}}))
    gtrain.up(spec)
    try:
        monkeypatch.setenv("GTRAIN_HEALTH_FAULT", "node:1")
        ctx = Context()
        report = run_health(ctx.cluster("hs"), ctx)
        checks = {(c.node, c.name): c for c in report.checks}
        assert report.failed_nodes() == [1], report.summary()
        assert checks[(0, "sdc.digest")].verdict.value == "ok"
        assert "GEMM checksum mismatch" in checks[(1, "sdc.digest")].reason
        ar = checks[(None, "interconnect.allreduce")]
        assert "gloo across 2 rank(s)" in ar.reason and ar.data["sizes"][-1]["busbw_gbs"] > 0
    finally:
        gtrain.down("hs")
