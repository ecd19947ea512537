"""Item 22: two nodes of one job on one machine (the local provider; ssh hosts sharing a PID namespace) have
the same GTRAIN_JOB_ID: a node's checks must see only its own processes, never end the other node's."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtrain.remote import nodeside

JOB = "demo-20260101-000000-abcd"


def _job_dir(root: Path, rank: int, state: str) -> Path:
    d = root / "jobs" / JOB
    (d / "logs").mkdir(parents=True)
    (d / "launch.sh").write_text(f"#!/usr/bin/env bash\nexport GTRAIN_JOB_ID={JOB}\n"
                                 f"export GTRAIN_NODE_RANK={rank}\n"
                                 f"export GTRAIN_WORKDIR={shlex.quote(str(root / 'workdir'))}\n")
    (d / "state.json").write_text(json.dumps({"state": state, "agent_rc": 0, "pid": None}))
    return d


@pytest.fixture
def node0_worker(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Node 0's rank, still working (a real process with node 0's environment)."""
    root0 = tmp_path / "node 0"
    env = {**os.environ, "GTRAIN_JOB_ID": JOB, "GTRAIN_NODE_RANK": "0", "GTRAIN_WORKDIR": str(root0 / "workdir")}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    deadline = time.monotonic() + 10
    while not os.path.exists(f"/proc/{p.pid}/environ") or b"GTRAIN_JOB_ID" not in Path(
            f"/proc/{p.pid}/environ").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield p
    p.kill()
    p.wait()


def test_a_finished_node_sees_no_orphans_of_another_node(tmp_path: Path,
                                                          node0_worker: subprocess.Popen[bytes]) -> None:
    d0 = _job_dir(tmp_path / "node 0", 0, "running")
    d1 = _job_dir(tmp_path / "node 1", 1, "succeeded")
    assert nodeside.job_pids(JOB, str(d0)) == [node0_worker.pid]
    assert nodeside.job_pids(JOB, str(d1)) == []
    assert nodeside.job_state(str(d1))["orphans"] == 0  # was 1: "ending workers left behind on node(s) [1]"
    nodeside.cancel(str(d1), "1")  # ends what node 1 left behind: nothing of node 0's
    time.sleep(0.2)
    assert node0_worker.poll() is None


def test_a_nodes_own_orphan_is_still_found_and_ended(tmp_path: Path,
                                                     node0_worker: subprocess.Popen[bytes]) -> None:
    d0 = _job_dir(tmp_path / "node 0", 0, "failed")  # node 0's agent died, its worker lives on
    assert nodeside.job_state(str(d0))["orphans"] == 1
    nodeside.cancel(str(d0), "2")
    assert node0_worker.wait(timeout=10) != 0
