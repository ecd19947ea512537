"""Progress in sight on the local provider (issue 37, item 5): a 2-node job logs its step with a total_steps hint;
while it runs, `gtrain status --json` shows its step, rate, ETA and world size and `gtrain top --once` its
progress line; after it, the report shows them, from the run archive, with no server anywhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gtrain

STEPS = 60
JOB = """
import sys, time
import gtrain.metrics

gtrain.metrics.total_steps(int(sys.argv[1]))
for step in range(1, int(sys.argv[1]) + 1):
    gtrain.metrics.log(step=step, loss=1.0 / step)
    time.sleep(0.1)
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"})


def test_status_top_and_report_show_step_rate_eta_and_world_size(tmp_path: Path, gtrain_home: Path) -> None:
    (tmp_path / "steps.py").write_text(JOB)
    spec = tmp_path / "prog.yaml"
    spec.write_text(json.dumps({"name": "prog", "provider": "local", "num_nodes": 2, "job": {
        "workdir": str(tmp_path), "run": f"steps.py {STEPS}", "launcher": "python", "nproc_per_node": 1}}))
    gtrain.up(spec)
    try:
        job = gtrain.launch(cluster="prog").job_id
        seen: dict[str, Any] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = cli("status", "prog", "--json")
            assert r.returncode == 0, r.stderr
            newest = json.loads(r.stdout)["jobs"][-1]
            p = newest.get("progress")
            if p and p["rate"] and 5 <= p["step"] < STEPS and newest["status"] == "running":
                seen = newest
                break
            time.sleep(0.3)
        assert seen, "status never showed the running job's step and rate"
        p = seen["progress"]
        assert seen["progress_from"] == "nodes"
        assert p["total"] == STEPS and 0 < p["percent"] < 100
        assert 3 < p["rate"] < 12  # ~10 steps/s (0.1 s a step, and the writing)
        assert p["eta_s"] == pytest.approx((STEPS - p["step"]) / p["rate"]) and p["restarts"] == 0
        assert seen["world_size"]["nodes"] == 2 and seen["world_size"]["ranks"] == 2
        human = cli("status", "prog")
        assert f"job {job}: step " in human.stdout and f"/{STEPS} (" in human.stdout and "ETA " in human.stdout
        assert "world size 2 nodes, 2 ranks" in human.stdout
        top = cli("top", "prog", "--once")
        assert top.returncode == 0, top.stderr
        assert f"job {job}: step " in top.stdout and "steps/s" in top.stdout
        rows = [ln for ln in top.stdout.splitlines() if re.match(r"[01]\s", ln)]
        assert len(rows) == 2 and all(re.search(r"\s\d+(\.\d+)?\s+(no samples|\d+s ago)", r) for r in rows), rows

        final = gtrain.wait("prog", job_id=job)
        assert (final.status, final.exit_code) == ("succeeded", 0)
        done = json.loads(cli("status", "prog", "--json").stdout)["jobs"][-1]
        assert done["progress"]["step"] == STEPS and done["progress"]["percent"] == 100
        assert done["progress"]["eta_s"] == 0
        out = tmp_path / "report.html"
        rep = cli("report", "prog", "--out", str(out))
        assert rep.returncode == 0, rep.stderr
        html = out.read_text()
        assert f'id="progress">step {STEPS}/{STEPS} (100.0%) · ' in html and "steps/s" in html
        assert 'id="world-size">2 nodes, 2 ranks<' in html and 'data-kind="progress"' in html
    finally:
        gtrain.down("prog")
