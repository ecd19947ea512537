"""Issue 28 item 4: `run --to` is checked before `up`, and a pull that fails after training never loses the
checkpoints: the cluster is kept (they are only there) and `run` does not exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gtrain.state import StateStore

TRAIN = """import os
os.makedirs("ckpt", exist_ok=True)
open("ckpt/model.pt", "w").write("weights")
if os.environ.get("CLOBBER"):  # the destination turns into a file while the job runs
    open(os.environ["CLOBBER"], "w").write("in the way")
"""


def _spec(tmp: Path, env: dict[str, str]) -> Path:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(TRAIN)
    spec = tmp / "spec.yaml"
    spec.write_text(json.dumps({"name": "runto", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py", "checkpoint_dir": "ckpt",
                                        "env": env}}))
    return spec


def _gtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def _clusters() -> list[tuple[str, str]]:
    store = StateStore()
    try:
        return [(c.name, c.status) for c in store.list_clusters(include_terminated=True)]
    finally:
        store.close()


def test_run_to_an_existing_file_is_refused_before_up(tmp_path: Path, gtrain_home: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("mine")
    r = _gtrain("run", str(_spec(tmp_path, {})), "--to", str(target), cwd=tmp_path)
    assert r.returncode == 2 and "--to" in r.stderr and "not a folder" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and _clusters() == [] and target.read_text() == "mine"
    r = _gtrain("run", str(_spec(tmp_path, {})), "--to", str(target / "sub"), cwd=tmp_path)
    assert r.returncode == 2 and "is a file" in r.stderr and _clusters() == [], r.stderr


def test_a_pull_that_fails_after_training_keeps_the_cluster_and_fails(tmp_path: Path, gtrain_home: Path) -> None:
    dest = tmp_path / "out"
    r = _gtrain("run", str(_spec(tmp_path, {"CLOBBER": str(dest)})), "--to", str(dest), cwd=tmp_path)
    assert r.returncode != 0, r.stderr
    assert "kept up" in r.stderr, r.stderr
    assert _clusters() == [("runto", "up")]
    again = _gtrain("pull", "runto", "--to", str(tmp_path / "saved"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "saved" / "model.pt").read_text() == "weights"  # the checkpoints were not lost
    assert _gtrain("down", "runto", cwd=tmp_path).returncode == 0
    assert os.path.isfile(dest)
