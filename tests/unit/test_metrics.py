"""gtrain.metrics: the helper a job imports on its nodes (standard library only, works as the one gtrain file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import math, gtrain.metrics as m
class Scalar:  # a numpy scalar / 0-d tensor stand-in: only __float__
    def __float__(self): return 2.5
for i in range(3):
    m.log(step=i, loss=1 / (i + 1), lr=0.1, flag=True, bad=float("nan"), big=math.inf, s=Scalar(), name="x")
m.flush()
import sys
print(sorted(k for k in sys.modules if k.startswith("gtrain")))
"""


def test_helper_works_as_the_only_gtrain_file_on_a_node(tmp_path: Path) -> None:
    """Shipped as py/gtrain/metrics.py (no __init__.py) and run with no site-packages at all."""
    from gtrain.jobs.render import metrics_files as node_files

    for rel, text in node_files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    out = tmp_path / "job" / "metrics" / "rank-1.jsonl"
    r = subprocess.run([sys.executable, "-S", "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "py"), "GTRAIN_METRICS_FILE": str(out),
                                          "RANK": "1", "PATH": os.environ["PATH"]})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['gtrain', 'gtrain.metrics']"  # nothing else of gtrain was needed
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [rec["step"] for rec in recs] == [0, 1, 2]
    first = recs[0]
    assert first["rank"] == 1 and first["loss"] == 1.0 and first["flag"] == 1 and first["s"] == 2.5
    assert first["bad"] is None and first["big"] is None  # NaN and inf: gaps, never invalid JSON
    assert "name" not in first and isinstance(first["t"], float)


def test_outside_a_job_log_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gtrain.metrics as m

    monkeypatch.delenv("GTRAIN_METRICS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    m.log(step=1, loss=0.5)
    assert m.metrics_file() is None and list(tmp_path.iterdir()) == []


def test_log_follows_the_env_and_a_bad_path_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gtrain.metrics as m

    a, b = tmp_path / "a.jsonl", tmp_path / "sub" / "b.jsonl"
    monkeypatch.setenv("GTRAIN_METRICS_FILE", str(a))
    m.log(step=1, loss=0.5)
    monkeypatch.setenv("GTRAIN_METRICS_FILE", str(b))
    m.log(loss=0.25)  # no step: the record has none
    assert json.loads(a.read_text())["loss"] == 0.5
    rec = json.loads(b.read_text())
    assert rec["loss"] == 0.25 and "step" not in rec
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GTRAIN_METRICS_FILE", str(blocker / "x.jsonl"))  # its parent is a file
    with pytest.raises(OSError):
        os.makedirs(blocker / "y")
    m.log(step=2, loss=0.1)  # swallowed: training goes on
