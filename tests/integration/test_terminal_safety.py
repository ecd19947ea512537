"""Issue 28 item 7 end to end (local provider): a job printing terminal control sequences (title, OSC 52
clipboard, ESC[2J, alternate screen, OSC 8 link) and naming a metric with them reaches no terminal raw:
not `run`, `logs`, `exec`, `plot`, nor the HTML report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EVIL = ["\x1b]0;pwned\x07", "\x1b]52;c;Y3VybCBldmlsfHNo\x07", "\x1b[2J", "\x1b[?1049h", "\x1b]8;;https://evil.example\x1b\\"]
TRAIN = f"""import json, os, sys
EVIL = {EVIL!r}
for e in EVIL:
    print("out" + e + "put", flush=True)
    print("err" + e + "put", file=sys.stderr, flush=True)
with open(os.environ["GTRAIN_METRICS_FILE"], "a") as f:
    for step in range(3):
        f.write(json.dumps({{"step": step, "loss": 1.0 / (step + 1), "evil" + EVIL[2]: step}}) + "\\n")
"""


def _gtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=cwd, env={**os.environ, "NO_COLOR": ""})


def _raw(text: str) -> list[str]:
    return [e for e in EVIL if e in text] + (["ESC"] if "\x1b]" in text or "\x1b[2J" in text else [])


def test_job_output_reaches_no_terminal_raw(tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "term", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py"}}))
    r = _gtrain("run", str(spec), "--keep", "--to", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "output" in r.stdout and not _raw(r.stdout + r.stderr), (r.stdout[-1500:], r.stderr[-1500:])
    for args in (["logs", "term"], ["exec", "term", "--", "printf", "x\\033]0;pwned\\007\\033[2Jy\\n"],
                 ["plot", "term", "-m", "evil\x1b[2J"], ["report", "term", "-o", str(tmp_path / "r.html")]):
        got = _gtrain(*args, cwd=tmp_path)
        assert not _raw(got.stdout + got.stderr), (args, got.stdout[-1500:], got.stderr[-1500:])
    html = (tmp_path / "r.html").read_text()
    assert "\x1b" not in html and "\x07" not in html
    assert _gtrain("down", "term", cwd=tmp_path).returncode == 0
