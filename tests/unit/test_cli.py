"""The CLI as a user (or CI) runs it: a subprocess, no TTY, exit codes, one JSON document with --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def gtrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, stdin=subprocess.DEVNULL)


def spec(tmp_path: Path, text: str) -> str:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return str(p)


def test_help_and_version() -> None:
    r = gtrain("--help")
    assert r.returncode == 0
    for cmd in ("up", "launch", "logs", "pull", "down", "status", "cost", "run"):
        assert cmd in r.stdout
    assert gtrain("--version").stdout.startswith("gtrain ")


def test_help_imports_no_sdk_paramiko_or_torch() -> None:
    code = ("import sys, runpy; sys.argv=['gtrain','status']\n"
            "try:\n runpy.run_module('gtrain', run_name='__main__')\nexcept SystemExit: pass\n"
            "bad=[m for m in sys.modules if m.split('.')[0] in ('boto3','botocore','paramiko','torch','google')]\n"
            "print('BAD:' + ','.join(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "BAD:", r.stdout


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: demo\nnum_nodes: 0\n", "num_nodes"),
        ("name: demo\nnum_nodes: 10000\n", "num_nodes"),
        ("name: demo\nbogus: 1\n", "bogus"),
        ("name: demo\nnum_nodes: [1]\n", "num_nodes"),
        ("name: demo\n  bad: indent\n", "malformed YAML"),
        ("name: demo\nnum_nodes: 17\n", "at most 16"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_created(tmp_path: Path, gtrain_home: Path, text: str,
                                                   needle: str) -> None:
    r = gtrain("up", spec(tmp_path, text))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("Error: ") and needle in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (gtrain_home / "clusters").exists()
    status = json.loads(gtrain("status", "--json").stdout)
    assert status == {"clusters": []}


def test_json_error_is_one_document(tmp_path: Path) -> None:
    r = gtrain("up", spec(tmp_path, "name: demo\nnum_nodes: 0\n"), "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["error"] == "ConfigError" and doc["field"] == "num_nodes"


def test_unknown_cluster_exit_2() -> None:
    for args in (["down", "nope"], ["logs", "nope"], ["pull", "nope"], ["status", "nope"],
                 ["launch", "--cluster", "nope"]):
        r = gtrain(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "no cluster named 'nope'" in r.stderr


def test_missing_script_exit_2_no_job_created(tmp_path: Path) -> None:
    s = spec(tmp_path, "name: demo\nnum_nodes: 1\njob: {run: missing.py}\n")
    assert gtrain("up", s).returncode == 0
    r = gtrain("launch", s)
    assert r.returncode == 2 and "script 'missing.py' not found" in r.stderr
    st = json.loads(gtrain("status", "demo", "--json").stdout)
    assert st["jobs"] == []
    assert gtrain("down", "demo").returncode == 0


def test_up_dry_run_creates_nothing_and_json(tmp_path: Path, gtrain_home: Path) -> None:
    r = gtrain("up", spec(tmp_path, "name: demo\nnum_nodes: 2\npolicies: {max_hours: 2}\n"), "--dry-run", "--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["status"] == "planned" and doc["plan"]["num_nodes"] == 2 and doc["plan"]["estimate_usd"] == 0.0
    assert json.loads(gtrain("status", "--json").stdout) == {"clusters": []}


def test_launch_dry_run_prints_rendered_script(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    s = spec(tmp_path, "name: demo\nnum_nodes: 2\njob: {run: train.py --x 1, env: {A: 'x; rm -rf ~'}}\n")
    assert gtrain("up", s).returncode == 0
    r = gtrain("launch", s, "--dry-run")
    assert r.returncode == 0
    assert "torch.distributed.run" in r.stdout and "export A='x; rm -rf ~'" in r.stdout
    assert "node 1: launch.sh" in r.stdout
    assert json.loads(gtrain("status", "demo", "--json").stdout)["jobs"] == []
    assert gtrain("down", "demo").returncode == 0


def test_down_twice_and_cost_history(tmp_path: Path) -> None:
    s = spec(tmp_path, "name: twice\nnum_nodes: 2\n")
    up = json.loads(gtrain("up", s, "--json").stdout)
    assert up["created"] is True and up["status"] == "up"
    again = json.loads(gtrain("up", s, "--json").stdout)
    assert again["created"] is False
    d1 = json.loads(gtrain("down", "twice", "--json", "--yes").stdout)
    assert d1["already_down"] is False and len(d1["cost"]["lines"]) == 2 and d1["cost"]["total_usd"] == 0
    r2 = gtrain("down", "twice")
    assert r2.returncode == 0 and "already down" in r2.stdout
    hist = json.loads(gtrain("cost", "--json").stdout)
    assert [c["cluster"] for c in hist["clusters"]] == ["twice"]
    assert hist["clusters"][0]["node_hours"] > 0


def test_no_module_shadows_an_api_function() -> None:
    """Importing gtrain.X sets the attribute X on the package: no module may share an API function's name."""
    import pkgutil

    import gtrain

    modules = {m.name for m in pkgutil.iter_modules(gtrain.__path__)}
    assert not modules & set(gtrain.__all__), modules & set(gtrain.__all__)


def test_launch_dry_run_shows_a_jobs_escape_sequences_as_text(tmp_path: Path) -> None:
    """A job's `run` line carrying an OSC title sequence and a screen clear: the dry run prints the script with
    each control character as ^X, so the terminal never obeys them and the reader sees they are there."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    s = spec(tmp_path, 'name: esc\nnum_nodes: 1\njob: {run: "train.py --t \\e]0;pwned\\a --c \\e[2J"}\n')
    r = gtrain("launch", s, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "^[]0;pwned^G" in r.stdout and "^[[2J" in r.stdout


def test_a_dry_run_needs_the_secrets_names_not_their_values(tmp_path: Path) -> None:
    """The README tour's spec names HF_TOKEN: a dry run prints the plan and scripts with it unset; a real
    launch still refuses (exit 2, the variable named) before anything is made."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    s = spec(tmp_path, "name: sec\nnum_nodes: 1\njob: {run: train.py, secrets: [HF_TOKEN_UNSET_HERE]}\n")
    r = gtrain("launch", s, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "HF_TOKEN_UNSET_HERE" in r.stdout  # the scripts read it from what the nodes are handed
    assert gtrain("run", s, "--dry-run").returncode == 0
    assert gtrain("up", s).returncode == 0
    try:
        assert gtrain("launch", s, "--dry-run").returncode == 0  # on the live cluster too
        real = gtrain("launch", s)
        assert real.returncode == 2 and "job.secrets: HF_TOKEN_UNSET_HERE not set" in real.stderr
    finally:
        assert gtrain("down", "sec").returncode == 0
