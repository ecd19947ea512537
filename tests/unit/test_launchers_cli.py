"""`gtrain launch --dry-run` shows each node's exact command for every launcher; bad launcher input is exit 2
with one line naming the field, and nothing is created."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def up(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    s = tmp_path / "spec.yaml"
    s.write_text("name: dry\nnum_nodes: 2\njob: {run: train.py --x 1}\n")
    assert gtrain("up", str(s)).returncode == 0
    return tmp_path


def launcher_spec(d: Path, job: dict) -> str:  # type: ignore[type-arg]
    p = d / "l.yaml"
    p.write_text(json.dumps({"name": "dry", "num_nodes": 2, "job": {"run": "train.py --x 1", **job}}))
    return str(p)


EXPECT = {"torchrun": "-m torch.distributed.run", "accelerate": "-m accelerate.commands.launch",
          "deepspeed": "-m deepspeed.launcher.runner", "jax": "--flavor=jax", "tensorflow": "--flavor=tensorflow",
          "python": "--flavor=python"}


def test_dry_run_prints_every_nodes_command(up: Path) -> None:
    for launcher, needle in EXPECT.items():
        r = gtrain("launch", launcher_spec(up, {"launcher": launcher}), "--dry-run")
        assert r.returncode == 0, r.stderr
        head = r.stdout.split("launch.sh ----")[0]  # the commands come first, one per node
        assert "node 0: command" in head and "node 1: command" in head and head.count(needle) >= 2, launcher
        assert "--node-rank=1" in head if launcher in ("jax", "tensorflow", "python") else True
        js = json.loads(gtrain("launch", launcher_spec(up, {"launcher": launcher}), "--dry-run", "--json").stdout)
        assert needle in js["scripts"]["1"]["command"]
    assert json.loads(gtrain("status", "dry", "--json").stdout)["jobs"] == []


@pytest.mark.parametrize(("job", "field"), [
    ({"launcher": "horovod"}, "job.launcher"),
    ({"launcher": "jax", "accelerate": {}}, "job.accelerate"),
    ({"launcher": "accelerate", "accelerate": {"config_file": "nope.yaml"}}, "job.accelerate.config_file"),
    ({"launcher": "jax", "nproc_per_node": 2}, "job.nproc_per_node"),
])
def test_bad_launcher_input_is_exit_2(up: Path, job: dict, field: str) -> None:  # type: ignore[type-arg]
    r = gtrain("launch", launcher_spec(up, job))
    assert r.returncode == 2, r.stderr
    assert field in r.stderr and "Traceback" not in r.stderr
    assert json.loads(gtrain("status", "dry", "--json").stdout)["jobs"] == []
