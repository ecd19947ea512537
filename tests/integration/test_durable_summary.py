"""Recoveries in the summaries: `gtrain run`'s text summary and `gtrain cost` (table, lines, --json) show
what each recovery was, what it lost, how long it took and what the downtime cost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = "import os, sys\nprint('attempt', os.environ['GTRAIN_ATTEMPT'], flush=True)\n" \
         "sys.exit(137 if os.environ['GTRAIN_ATTEMPT'] == '1' else 0)\n"


def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)


def test_run_and_cost_show_the_recoveries(moto_server: str, gtrain_home: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GTRAIN_IMDS_ENDPOINT", "")
    monkeypatch.setenv("GTRAIN_GCE_METADATA_ENDPOINT", "")
    boto3.client("s3").create_bucket(Bucket="durable-summary")
    work = tmp_path / "work"
    work.mkdir()
    (work / "flaky.py").write_text(SCRIPT)
    spec = tmp_path / "summ.yaml"
    spec.write_text(json.dumps({
        "name": "summ", "provider": "local", "num_nodes": 1,
        "job": {"workdir": str(work), "run": "flaky.py", "nproc_per_node": 1, "checkpoint_dir": "ckpt",
                "checkpoint_store": "s3://durable-summary/runs"},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0, "on": [{"exit_codes": [137]}]}}}))
    run = gtrain("run", str(spec), "--no-report", "--to", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    assert "recovery to attempt 2: exit_code of node(s) [], same node(s);" in run.stderr, run.stderr
    assert "s down, ~$0.0000" in run.stderr
    assert "succeeded (exit 0) after 1 recovery(ies)" in run.stderr

    cost = gtrain("cost")
    assert cost.returncode == 0, cost.stderr
    header = next(ln for ln in cost.stdout.splitlines() if "node-hours" in ln)
    assert "recoveries" in header, cost.stdout
    row = next(ln for ln in cost.stdout.splitlines() if ln.split()[:1] == ["summ"])
    assert " 1 " in row, cost.stdout  # the recoveries column
    assert "summ: 1 recovery(ies), lost node(s) [], " in cost.stdout, cost.stdout
    assert "recovery to attempt 2: exit_code" in cost.stdout

    doc = json.loads(gtrain("cost", "--json").stdout)
    (mine,) = [c for c in doc["clusters"] if c["cluster"] == "summ"]
    assert mine["recovery"]["count"] == 1 and mine["recovery"]["seconds"] > 0
    assert mine["recovery"]["cost_usd"] == 0 and mine["recovery"]["lost_nodes"] == []
    (rec,) = mine["recoveries"]
    assert rec["job"].startswith("summ-") and rec["attempt"] == 2 and rec["kind"] == "exit_code"
