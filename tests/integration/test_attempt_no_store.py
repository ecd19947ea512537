"""GTRAIN_ATTEMPT reaches the job without a checkpoint store (issue 28): 1 on the first attempt, 2 after a
recovery. It was exported only by the store's restore step, so a job with recovery and no store saw none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = ("import os, sys\nprint('attempt=' + os.environ.get('GTRAIN_ATTEMPT', 'unset'), flush=True)\n"
          "sys.exit(137 if os.environ.get('GTRAIN_ATTEMPT') == '1' else 0)\n")


def test_gtrain_attempt_counts_recoveries_without_a_store(gtrain_home: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    work = tmp_path / "work"
    work.mkdir()
    (work / "flaky.py").write_text(SCRIPT)
    spec = tmp_path / "att.yaml"
    spec.write_text(json.dumps({
        "name": "att", "provider": "local", "num_nodes": 1,
        "job": {"workdir": str(work), "run": "flaky.py", "nproc_per_node": 1, "python": sys.executable,
                "launcher": "python"},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0, "on": [{"exit_codes": [137]}]}}}))
    run = subprocess.run([sys.executable, "-m", "gtrain", "run", str(spec), "--no-report", "--to",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    said = [ln.split("attempt=", 1)[1].strip() for ln in (run.stdout + run.stderr).splitlines() if "attempt=" in ln]
    assert said == ["1", "2"], run.stdout + run.stderr
