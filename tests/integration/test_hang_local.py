"""A hang on the local provider (docs/durable.md, "Hangs"): a 2-node gloo job whose rank 1 wedges inside its
loop while rank 0 waits in the all-reduce. With ``policies.recovery.hang_minutes`` the watcher finds no rank
progressing while both nodes are alive, dumps every rank's Python stacks into its log (faulthandler's SIGABRT:
no py-spy here), names node 1 as the one that stalled first, and recovers the job: attempt 2 succeeds."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.jobs.backend import LogLine

JOBS = Path(__file__).parent / "jobs"
HANG_MINUTES, STEPS, STALL = 0.15, 8, 3


def test_a_wedged_collective_is_dumped_then_recovered(gtrain_home: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GTRAIN_PYSPY", "0")  # the faulthandler way, whether this machine has py-spy or not
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOBS / "hang_train.py", work / "hang_train.py")
    spec = tmp_path / "hang.yaml"
    spec.write_text(json.dumps({
        "name": "hang", "provider": "local", "num_nodes": 2,
        "job": {"workdir": str(work), "run": f"hang_train.py {STEPS} {STALL}", "nproc_per_node": 1,
                "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}},
        "policies": {"recovery": {"max_restarts": 1, "backoff_s": 0, "hang_minutes": HANG_MINUTES}}}))
    lines: list[LogLine] = []
    started = time.time()
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append, keep=True)
    took = time.time() - started
    try:
        assert res.status == "succeeded" and res.exit_code == 0, (res, [x.text for x in lines][-30:])
        assert len(res.recoveries) == 1, res.recoveries
        rec = res.recoveries[0]
        assert (rec["kind"], rec["lost"], rec["reprovision"], rec["attempt"]) == ("hang", [1], [], 2), rec
        assert "node 1 (rank 1) stalled first at step 2" in rec["detail"], rec["detail"]
        jobs = gtrain_home / "clusters" / "hang"
        job = f"jobs/{res.job_id}"
        wedged = (jobs / "node-1" / job / "attempt-1" / "logs" / "rank-1.log").read_text()
        waiting = (jobs / "node-0" / job / "attempt-1" / "logs" / "rank-0.log").read_text()
        # every thread's traceback, the hung function named in the rank that hung, the collective in the other
        assert "[gtrain] hang: SIGABRT to rank 1" in wedged and "Current thread" in wedged, wedged
        assert "hang_train.py\", line 14 in wedged_here" in wedged, wedged
        assert "in all_reduce" in waiting and "Current thread" in waiting, waiting
        # attempt 2 ran every step on both ranks
        done = [x.text for x in lines if x.text == f"step {STEPS}"]
        assert len(done) == 2, [x.text for x in lines][-30:]
        # measured: the last progress of attempt 1 (rank 0 logged step STALL, then waited) -> stacks dumped and
        # the recovery begun
        recs = [json.loads(ln) for ln in (jobs / "node-0" / job / "metrics" / "rank-0.jsonl").read_text().splitlines()]
        last = max(r["t"] for r in recs if r["t"] < rec["detected_at"])
        to_dump = rec["detected_at"] - last
        print(f"\nhang -> stacks dumped, recovery begun: {to_dump:.1f}s (hang_minutes {HANG_MINUTES} = "
              f"{HANG_MINUTES * 60:.0f}s); recovery {rec['seconds']:.1f}s; whole run {took:.1f}s")
        assert HANG_MINUTES * 60 <= to_dump < HANG_MINUTES * 60 + 5, to_dump
    finally:
        gtrain.down("hang", yes=True)
