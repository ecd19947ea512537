"""A recovery relaunches a job under the same id in the same job folder. An earlier attempt's launch.sh that
outlives its stop (its `pid` file was gone when it was stopped) must not write its end into the new attempt's
state: the CI failure of test_durable_aws was exactly that ("failed on node(s) [0]" after both nodes of
attempt 2 had succeeded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gtrain.jobs.render import render_all
from tests.unit.test_render import ctx


def _node(tmp_path: Path, program: str) -> Path:
    """A one-node, one-rank job folder of the python launcher running ``program``, as launch writes it."""
    job_dir, work = tmp_path / "jobs" / "demo-20260101-000000-abcd", tmp_path / "work"
    job_dir.mkdir(parents=True)
    work.mkdir()
    c = ctx(launcher="python", nproc_per_node=1, num_nodes=1, node_rank=0, node_ips=["127.0.0.1"],
            node_addr="127.0.0.1", master_addr="127.0.0.1", job_dir=str(job_dir), workdir=str(work),
            checkpoint_dir=str(work / "ckpt"), python=sys.executable, secret_names=[], setup=None,
            argv=["-c", program])
    for name, text in render_all(c).items():
        p = job_dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return job_dir


def _state(job_dir: Path) -> dict[str, object]:
    try:
        return dict(json.loads((job_dir / "state.json").read_text()))
    except (OSError, ValueError):
        return {}


def test_an_earlier_attempts_script_writes_nothing_into_the_next_attempts_state(tmp_path: Path) -> None:
    job_dir = _node(tmp_path, "import time; time.sleep(1.5)")
    env = {**os.environ, "GTRAIN_TELEMETRY": "0"}
    old = subprocess.Popen(["bash", str(job_dir / "launch.sh")], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.monotonic() + 20
    while _state(job_dir).get("state") != "running" or not (job_dir / "logs" / "rank-0.log").exists():
        assert time.monotonic() < deadline and old.poll() is None, _state(job_dir)
        time.sleep(0.02)
    # the relaunch: attempt 1's files kept aside, attempt 2's launcher takes the folder over
    (job_dir / "attempt-1").mkdir()
    for name in ("state.json", "pid", "logs"):
        os.replace(job_dir / name, job_dir / "attempt-1" / name)
    (job_dir / "logs").mkdir()
    new = {"state": "running", "agent_rc": None, "pid": os.getpid(), "time": time.time()}
    (job_dir / "pid").write_text(f"{os.getpid()}\n")
    (job_dir / "state.json").write_text(json.dumps(new))
    assert old.wait(timeout=30) == 0  # attempt 1's script ran to its end...
    assert _state(job_dir) == new  # ...and wrote nothing into attempt 2's state (it wrote "succeeded")
    assert list((job_dir / "logs").iterdir()) == []  # nor its rank's exit into attempt 2's logs


def test_the_launcher_of_the_folder_still_writes_its_end(tmp_path: Path) -> None:
    job_dir = _node(tmp_path, "raise SystemExit(3)")
    p = subprocess.run(["bash", str(job_dir / "launch.sh")], stdin=subprocess.DEVNULL, capture_output=True,
                       env={**os.environ, "GTRAIN_TELEMETRY": "0"}, timeout=30)
    assert p.returncode == 3, p.stdout
    st = _state(job_dir)
    assert st["state"] == "failed" and st["agent_rc"] == 3, st
    assert (job_dir / "logs" / "rank-0.exit").read_text().split()[0] == "3"
