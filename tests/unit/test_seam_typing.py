"""The seam modules pass `mypy --strict` (issue 9): the interfaces a new provider, scheduler or launcher codes
against are typed all the way down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SEAMS = ["gtrain/jobs/backend.py", "gtrain/providers/base.py", "gtrain/state/nodes.py", "gtrain/context.py",
         "gtrain/registry.py"]


def test_seam_modules_pass_mypy_strict(repo_root: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
                        str(tmp_path / "cache"), "--follow-imports", "silent", *SEAMS],
                       cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
