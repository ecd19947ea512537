"""A failed `gtrain run` reads well (real torchrun, 2 local nodes x 2 ranks): it ends naming the rank that failed
first, its exit code and its last lines; torchrun's ChildFailedError report is one line on screen and whole in
the log; a carriage-return progress bar is shown as its latest state."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

TRAIN = """\
import os, sys, time
rank = int(os.environ["RANK"])
for i in range(0, 101, 10):
    sys.stdout.write(f"\\rprogress {i:3d}%|{'#' * (i // 10)}")
    sys.stdout.flush()
sys.stdout.write("\\n")
print(f"rank {rank} working", flush=True)
if rank == 3:
    print("about to fail: bad batch 17", flush=True)
    sys.exit(3)
time.sleep(60)
"""


def gtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def test_failed_run_names_the_first_rank_and_keeps_the_report_in_the_log(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "spec.yaml").write_text("name: fail-read\nnum_nodes: 2\njob: {run: train.py, nproc_per_node: 2}\n")
    # --no-fold: every rank's own bar (the 4 identical ones folded into one is test_logs_fold_local.py's)
    r = gtrain("run", "spec.yaml", "--no-report", "--no-fold", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    # the end of the run: who failed first, its exit code, its last lines (after the job's own lines)
    end = r.stderr[r.stderr.index("failed first"):]
    m = re.search(r"rank 3 \(node (\d)\) failed first, exit 3; its last 3 line\(s\):", r.stderr)
    assert m, r.stderr  # torchrun's rendezvous decides which node holds ranks 2-3
    node = m.group(1)
    assert end.index("progress 100%") < end.index("rank 3 working") < end.index("about to fail: bad batch 17")
    # progress bars: the latest state only, no carriage return, no earlier state
    assert "\r" not in r.stdout and "progress   0%" not in r.stdout
    assert r.stdout.count("progress 100%|##########") == 4
    # torchrun's report: one line on screen, none of its body, no agent traceback
    assert "torchrun: a rank failed (ChildFailedError); its full report is in the log" in r.stdout
    for noise in ("Root Cause", "Traceback (most recent call last)", "error_file"):
        assert noise not in r.stdout, noise
    # ... and all of it in the log
    kept = gtrain("logs", "fail-read", "--node", node, cwd=tmp_path)
    assert kept.returncode == 0
    assert "Root Cause (first observed failure)" in kept.stdout and "ChildFailedError" in kept.stdout
    assert "progress   0%" not in kept.stdout and "progress 100%" in kept.stdout  # the log's \r lines read back whole
    doc = json.loads(gtrain("run", "spec.yaml", "--no-report", "--json", cwd=tmp_path).stdout)
    assert doc["failed_first"]["rank"] == 3 and doc["failed_first"]["exit_code"] == 3
