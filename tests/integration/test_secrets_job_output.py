"""Issue 28 item 2: a secret the *job* prints (raw, base64, URL-encoded), uses as a metric name and as a file
name is masked in everything gtrain shows or keeps: run/logs/exec output, the run archive (logs, metrics),
plot, pull --json."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

SECRET = "Zq9sEcReT/v4lu3+x"
TRAIN = """import os, base64, urllib.parse, json
s = os.environ["MYSEC"]
print("token", s, flush=True)
print("b64", base64.b64encode(s.encode()).decode(), flush=True)
print("url", urllib.parse.quote(s, safe=""), flush=True)
os.makedirs("ckpt", exist_ok=True)
open(os.path.join("ckpt", "key-" + base64.urlsafe_b64encode(s.encode()).decode() + ".pt"), "w").write("w")
with open(os.environ["GTRAIN_METRICS_FILE"], "a") as f:
    for step in range(3):
        f.write(json.dumps({"step": step, "loss": 1.0 / (step + 1), "m_" + s: step}) + "\\n")
"""


def _forms() -> list[str]:
    raw = SECRET.encode()
    return [SECRET, urllib.parse.quote(SECRET, safe=""), base64.b64encode(raw).decode().rstrip("="),
            base64.urlsafe_b64encode(raw).decode().rstrip("=")]


def _gtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "MYSEC": SECRET}, cwd=cwd)


def _clean(r: subprocess.CompletedProcess[str], what: str) -> None:
    for form in _forms():
        assert form not in r.stdout + r.stderr, (what, form, r.stdout[-2000:], r.stderr[-2000:])


def test_secret_printed_by_the_job_is_masked_everywhere(tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "sec-job", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py", "secrets": ["MYSEC"],
                                        "checkpoint_dir": "ckpt"}}))
    r = _gtrain("run", str(spec), "--keep", "--to", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "token ***" in r.stdout
    _clean(r, "run")
    for args in (["logs", "sec-job"], ["exec", "sec-job", "--", "cat", "train.py", "ckpt/../ckpt"],
                 ["exec", "sec-job", "--", "ls", "ckpt"], ["exec", "sec-job", "--json", "--", "ls", "ckpt"],
                 ["pull", "sec-job", "--json", "--to", str(tmp_path / "p2")], ["plot", "sec-job", "-m", "loss"],
                 ["report", "sec-job", "-o", str(tmp_path / "r.html")]):
        _clean(_gtrain(*args, cwd=tmp_path), " ".join(args))
    r = _gtrain("pull", "sec-job", "--json", "--to", str(tmp_path / "p3"), cwd=tmp_path)
    assert r.returncode == 0 and "***" in r.stdout, r.stdout
    down = _gtrain("down", "sec-job", cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    kept = [p for p in gtrain_home.rglob("*") if p.is_file()] + [tmp_path / "r.html"]
    assert any("metrics" in str(p) or p.suffix == ".jsonl" for p in kept), kept
    for p in kept:
        data = p.read_bytes()
        for form in _forms():
            assert form.encode() not in data, (p, form)
