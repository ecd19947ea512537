"""`gtrain cancel CLUSTER [--job ID] [--json]` (issue 10, item 24).

TODO(lead): this test needs ``gtrain.api.cancel(cluster, job_id=None, report=...)`` (returning an object whose
``to_dict()`` holds ``job_id``, ``status``, ``exit_code``); the CLI command (gtrain/cli/job_cmds.py) calls it.
It fails until that API exists -- it is deliberately not skip-marked (a skip fails CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_cancel_cli_needs_api(tmp_path: Path) -> None:
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(120)\n")
    spec = tmp_path / "c.yaml"
    spec.write_text(f"name: cancelme\nprovider: local\nnum_nodes: 1\njob:\n  workdir: {tmp_path}\n  run: sleep.py\n"
                    "  nproc_per_node: 1\n")
    assert gtrain("up", str(spec)).returncode == 0
    try:
        launched = json.loads(gtrain("launch", str(spec), "--json").stdout)
        r = gtrain("cancel", "cancelme", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["job_id"] == launched["job_id"] and "exit_code" in doc and doc["status"] != "running"
        job = json.loads(gtrain("status", "cancelme", "--json").stdout)["jobs"][-1]
        assert job["id"] == launched["job_id"] and job["status"] not in ("running", "starting")
        again = gtrain("cancel", "cancelme", "--job", "nope")
        assert again.returncode == 2, again.stderr
    finally:
        gtrain("down", "cancelme", "--yes")
