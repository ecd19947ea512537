"""torchft mode on the local provider (issue 37): ``job.fault_tolerance: torchft``, 2 nodes x 1 process, torchft's
DDP example on CPU/gloo (tests/integration/jobs/torchft_ddp_train.py). Each node is a replica group with its own
torchrun; node 0 also runs the Lighthouse. Every process of node 1's job is killed mid-run: node 0's group trains
on alone (its torchrun agent never restarted), gtrain starts node 1's part alone, group 1 heals from group 0 and
trains with it again, and the run exits 0."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.jobs.backend import LogLine
from gtrain.remote.nodeside import job_pids
from tests.procscan import procs_holding

pytest.importorskip("torchft")  # the test extra installs it (pyproject.toml)

JOBS = Path(__file__).parent / "jobs"
STEPS, SLEEP, MAX_STEPS = 120, 0.1, 2000
KILL_AT = 15  # group 1's step at which its node is killed
BOOT_S = 6  # the replacement's 'boot': node 0 trains alone meanwhile
LINE = re.compile(r"group (\d+) step (\d+) participants (\d+) agent (-?\d+) t ([\d.]+)")


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GTRAIN_IMDS_ENDPOINT", "")  # no metadata server to ask on this machine
    monkeypatch.setenv("GTRAIN_GCE_METADATA_ENDPOINT", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _kill_node_1_at(home: Path, cluster: str, step: int) -> threading.Thread:
    """Once node 1's rank has logged ``step`` with both groups in the quorum: SIGKILL its launch.sh's process
    group and every process of its job (torchrun starts its workers in sessions of their own)."""
    def run() -> None:
        jobs = home / "clusters" / cluster / "node-1" / "jobs"
        deadline = time.time() + 120
        while time.time() < deadline:
            found = list(jobs.glob("*/pid")) if jobs.is_dir() else []
            log = found[0].parent / "logs" / "rank-0.log" if found else None
            lines = log.read_text().splitlines() if log is not None and log.exists() else []
            if any((m := LINE.search(x)) and int(m.group(2)) >= step and m.group(3) == "2" for x in lines):
                job_dir = found[0].parent
                pids = set(job_pids(job_dir.name, str(job_dir)))
                (home / "killed").write_text(repr(time.time()))
                os.killpg(int(found[0].read_text()), signal.SIGKILL)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.1)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _lighthouses(home: Path) -> list[bytes]:
    """The argv of every process still running this home's shipped torchft_lighthouse.py."""
    out = []
    for hit in procs_holding(b"torchft_lighthouse.py"):
        try:
            argv = Path(f"/proc/{hit}").read_bytes() if hit.endswith("cmdline") else b""
        except OSError:
            continue
        if str(home).encode() in argv:
            out.append(argv)
    return out


def test_torchft_group_1_dies_and_group_0_never_stops(gtrain_home: Path, tmp_path: Path, fast: None) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOBS / "torchft_ddp_train.py", work / "torchft_ddp_train.py")
    name = "tft"
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "local", "num_nodes": 2,
        "job": {"workdir": str(work), "run": f"torchft_ddp_train.py {STEPS} {SLEEP} {MAX_STEPS}",
                "nproc_per_node": 1, "fault_tolerance": "torchft", "env": {"OMP_NUM_THREADS": "1"},
                # the replacement takes a while to come up, as a cloud VM does: group 0 trains alone meanwhile
                "setup": f"[ ! -e {gtrain_home / 'killed'} ] || sleep {BOOT_S}"},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0}}}))
    killer = _kill_node_1_at(gtrain_home, name, KILL_AT)
    lines: list[LogLine] = []
    started = time.time()
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    killer.join(timeout=1)
    text = [f"[{x.node}/{x.rank}] {x.text}" for x in lines]
    assert (gtrain_home / "killed").exists(), ("node 1 was never killed", text[-30:])
    killed_at = float((gtrain_home / "killed").read_text())
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    assert len(res.recoveries) == 1, res.recoveries
    rec = res.recoveries[0]
    assert rec["elastic"] and rec["lost"] == [1] and rec["attempt"] == 1, rec  # no new attempt: nothing restarted

    # every rank got its replica group, the group count and node 0's Lighthouse; each group its own store port
    heads = {x.node: x.text for x in lines if x.text.startswith("group ") and " lighthouse " in x.text}
    assert heads[0].startswith("group 0 of 2 lighthouse http://") and heads[1].startswith("group 1 of 2 "), heads
    assert heads[0].split(" lighthouse ")[1].split()[0] == heads[1].split(" lighthouse ")[1].split()[0]
    assert heads[0].rsplit(":", 1)[1] != heads[1].rsplit(":", 1)[1], heads  # MASTER_PORT: one per group
    assert any("torchft Lighthouse at http://" in x.text for x in lines if x.node == 0), text[:20]

    seen = [(x.node, *map(float, m.groups())) for x in lines if (m := LINE.search(x.text))]
    # node 0's torchrun agent is the same process from the first step to the last: never restarted
    agents0 = {int(a) for node, _g, _s, _p, a, _t in seen if node == 0}
    assert len(agents0) == 1 and -1 not in agents0, agents0
    # group 1 logged steps again after the replacement, under a new agent
    back = sorted(t for node, _g, _s, _p, _a, t in seen if node == 1 and t > killed_at)
    assert back, ("group 1 never stepped again", text[-40:])
    agents1 = [int(a) for node, _g, _s, _p, a, _t in seen if node == 1]
    assert len(set(agents1)) == 2, set(agents1)
    # node 0 kept stepping while node 1 was down: its step counter advanced between the kill and the rejoin
    gap = [s for node, _g, s, _p, _a, t in seen if node == 0 and killed_at < t < back[0]]
    assert len(gap) >= 5 and gap[-1] > gap[0], (gap, text[-60:])
    first0 = min(t for node, _g, _s, _p, _a, t in seen if node == 0 and t > killed_at)
    # both groups trained together to the end (the trainer ends only once every group takes part)
    ends = {node: (s, p) for node, _g, s, p, _a, _t in seen}  # each node's last step
    assert ends[0] == ends[1] and ends[0][1] == 2, ends
    # the Lighthouse ended with node 0's part of the job
    assert not _lighthouses(gtrain_home)
    print(f"torchft: kill -> group 0's next step {first0 - killed_at:.1f}s; kill -> group 1 stepping again "
          f"{back[0] - killed_at:.1f}s (gtrain: loss seen after {rec['detected_at'] - killed_at:.1f}s, node 1's part "
          f"started {rec['seconds']:.1f}s later, {BOOT_S}s of it the replacement's boot); group 0 "
          f"took {len(gap)} steps meanwhile; run {time.time() - started:.0f}s")
