"""`run --to` is checked as `pull --to` is, before anything is made (issue 28 item 4 / 12): an empty value used
to fall back to the default destination silently; a NUL or a system folder is named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("to", ["", "   ", "/proc/self/x", "/sys/kernel/x"])
def test_run_refuses_a_to_that_cannot_work(to: str, tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "t.py").write_text("print('hi')\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "runto", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "t.py"}}))
    r = subprocess.run([sys.executable, "-m", "gtrain", "run", str(spec), "--to", to], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert "--to" in r.stderr and "Traceback" not in r.stderr
    assert not (gtrain_home / "clusters").exists()  # nothing made
