"""Item 12 end to end: a setup that prints a secret (raw and URL-encoded) fails; nothing gtrain keeps or shows
has the value: not state.db (nor its WAL), not any file under GTRAIN_HOME, not the CLI's output or --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

from gtrain.state import StateStore

SECRET = "p@ss/w0rd+Zq9"
SETUP = ('echo "cloning https://bot:${MYSEC}@git.example.invalid/repo"\n'
         'python3 -c \'import os, urllib.parse; print("token=" + urllib.parse.quote(os.environ["MYSEC"], safe=""))\'\n'
         'exit 3\n')


def _spec(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('never runs')\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "sec-e2e", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py", "secrets": ["MYSEC"],
                                        "setup": SETUP}}))
    return spec


def _gtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "MYSEC": SECRET})


def _forms() -> list[str]:
    return [SECRET, urllib.parse.quote(SECRET, safe="")]


def test_failed_setup_printing_a_secret_leaves_it_in_no_file(tmp_path: Path, gtrain_home: Path) -> None:
    r = _gtrain("run", str(_spec(tmp_path)), "--json")
    assert r.returncode != 0
    files = [p for p in gtrain_home.rglob("*") if p.is_file()]
    assert any(p.name == "state.db" for p in files)
    for p in files:
        data = p.read_bytes()
        for form in _forms():
            assert form.encode() not in data, (p, form)
    store = StateStore()
    cluster = store.find_cluster("sec-e2e")
    assert cluster is not None
    info = store.jobs(cluster.id)[-1].info
    store.close()
    assert "bot:***@git.example.invalid" in info["error"]  # the failure is kept, masked


def test_failed_setup_printing_a_secret_never_shows_it(tmp_path: Path) -> None:
    r = _gtrain("run", str(_spec(tmp_path)), "--json")
    assert r.returncode != 0 and "***" in r.stdout + r.stderr
    for form in _forms():
        assert form not in r.stdout + r.stderr, form
