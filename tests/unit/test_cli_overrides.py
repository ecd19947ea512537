"""The spec's fields set on the command line (--env, --num-nodes, --gpus/--accelerators, --spot/--on-demand,
--name) on up / launch / run: held to the spec's rules (exit 2 naming the flag, nothing created) and shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

AWS = "name: ov\nprovider: aws\nnum_nodes: 1\nresources: {accelerators: 'H100:8'}\njob: {run: train.py}\n"


def gtrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def write(tmp_path: Path, text: str) -> str:
    (tmp_path / "train.py").write_text("import os\nprint('FOO is', os.environ['FOO'])\n")
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return str(p)


def test_up_dry_run_takes_the_overrides_and_shows_them(tmp_path: Path) -> None:
    s = write(tmp_path, AWS)
    flags = ["--num-nodes", "3", "--accelerators", "A100:8", "--spot", "--name", "ov-b", "--env", "A=1"]
    doc = json.loads(gtrain("up", s, "--dry-run", "--json", *flags).stdout)
    plan = doc["plan"]
    assert (plan["num_nodes"], plan["gpus_per_node"], plan["gpu_name"], plan["market"]) == (3, 8, "A100", "spot")
    r = gtrain("up", s, "--dry-run", *flags)
    assert r.returncode == 0
    assert "note: from the command line: --name ov-b, --num-nodes 3, --gpus A100:8, --spot, --env A" in r.stdout
    spot = write(tmp_path, AWS.replace("'H100:8'}", "'H100:8', use_spot: true}"))
    on_demand = json.loads(gtrain("up", spot, "--dry-run", "--json", "--on-demand").stdout)
    assert on_demand["plan"]["market"] == "on-demand"


@pytest.mark.parametrize(("flags", "named"), [
    (["--num-nodes", "0"], "--num-nodes 0"), (["--num-nodes", "9999"], "--num-nodes 9999"),
    (["--gpus", "A100:99"], "--gpus A100:99"), (["--gpus", "BANANA:1"], "--gpus BANANA:1"),
    (["--env", "GTRAIN_X=1"], "--env GTRAIN_X"), (["--env", "1BAD=x"], "--env 1BAD"),
    (["--env", "novalue"], "--env 'novalue'"), (["--name", "Bad_Name"], "--name Bad_Name"),
])
@pytest.mark.parametrize("command", ["up", "run"])
def test_bad_override_exits_2_naming_the_flag_and_creates_nothing(tmp_path: Path, flags: list[str], named: str,
                                                                  command: str) -> None:
    r = gtrain(command, write(tmp_path, AWS), *flags, *(["--dry-run"] if command == "up" else ["--yes"]))
    assert r.returncode == 2, r.stderr
    assert f"\nError: {named}" in "\n" + r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads(gtrain("status", "--json").stdout) == {"clusters": []}


def test_env_override_reaches_the_job_through_launch_and_run(tmp_path: Path) -> None:
    s = write(tmp_path, "name: ov-local\nprovider: local\nnum_nodes: 1\n"
                        "job: {run: train.py, launcher: python, env: {FOO: spec}}\n")
    r = gtrain("run", s, "--env", "FOO=from flag; $(id)", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "FOO is from flag; $(id)" in r.stdout
    assert "note: from the command line: --env FOO" in r.stderr
    assert gtrain("up", s).returncode == 0
    r = gtrain("launch", s, "--dry-run", "--env", "FOO=x y")
    assert r.returncode == 0 and "export FOO='x y'" in r.stdout
    r = gtrain("launch", s, "--dry-run", "--num-nodes", "2")  # the cluster has 1 node: refused, naming it
    assert r.returncode == 2 and "num_nodes" in r.stderr
    r = gtrain("launch", "--cluster", "ov-local", "--env", "FOO=1")
    assert r.returncode == 2 and r.stderr.startswith("Error: from the command line: --env FOO"), r.stderr
    assert gtrain("down", "ov-local").returncode == 0
