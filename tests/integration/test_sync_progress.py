"""``gtrain sync``'s progress, as a user sees it: a bar with bytes, files, rate and ETA on a terminal; lines
every few seconds when stderr is a pipe (CI logs), never silence. Real CLI subprocesses on SeaweedFS."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from tests.fixtures.seaweedfs import Weed


def _src(tmp_path: Path, n: int = 300) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"f{i:04d}").write_bytes(os.urandom(2000))
    (src / "big.bin").write_bytes(os.urandom(8 << 20))
    return src


def test_piped_progress_is_lines_with_bytes_files_rate(tmp_path: Path, weed_bucket: str, weed_env: Weed,
                                                       repo_root: Path) -> None:
    src = _src(tmp_path)
    env = {**os.environ, "GTRAIN_PROGRESS_SECONDS": "0.05", "PYTHONPATH": str(repo_root)}
    p = subprocess.run([sys.executable, "-m", "gtrain", "sync", str(src), f"s3://{weed_bucket}/p"], env=env,
                       capture_output=True, text=True, timeout=120, cwd=repo_root)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("sync: ")]
    assert len(lines) >= 2, p.stderr  # during the transfers, and at the end
    pat = re.compile(r"^sync: (list|transfer|delete|done) [\d.]+ (B|KiB|MiB|GiB) / [\d.]+ (B|KiB|MiB|GiB)"
                     r"( \(\d+%\))?, \d+/\d+ files, [\d.]+ (B|KiB|MiB|GiB)/s(, ETA \d+s)?$")
    assert all(pat.match(ln) for ln in lines), lines
    assert lines[-1].startswith("sync: done") and "301/301 files" in lines[-1]
    assert "moved: 301 up" in p.stdout

    quiet = subprocess.run([sys.executable, "-m", "gtrain", "sync", str(src), f"s3://{weed_bucket}/p", "--json"],
                           env=env, capture_output=True, text=True, timeout=120, cwd=repo_root)
    assert quiet.returncode == 0 and "sync: " not in quiet.stderr  # --json: the document only


def test_a_terminal_gets_a_bar_with_files_and_eta(tmp_path: Path, weed_bucket: str, weed_env: Weed,
                                                  repo_root: Path) -> None:
    src = _src(tmp_path, n=200)
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(repo_root), "COLUMNS": "160", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "gtrain", "sync", str(src), f"s3://{weed_bucket}/t"], env=env,
                            stdout=subprocess.DEVNULL, stderr=slave, cwd=repo_root)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=120) == 0
    os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    assert re.search(r"\d+/201 files", text), text[-2000:]
    assert "/s" in text and "sync: " not in text  # the bar (rate), not the piped lines
