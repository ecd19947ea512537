"""`gtrain attach NAME --provider slurm` after the home that ran `up` and `launch` is deleted, against the real
Slurm of tests/fixtures/slurm.py: found by the record gtrain keeps in the cluster's folder on the shared
filesystem (and its jobs' ``--comment=gtrain:<id>``); from the empty home, status, cancel, logs -f, pull and
down work."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import gtrain
from gtrain.spec import parse_spec
from tests.integration.test_slurm import _slurm_id, cli, slurm_spec, write, wait_ranks


def test_attach_slurm_after_the_home_is_gone(slurm_cluster: Any, tmp_path: Path) -> None:
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-attach", "slurm_train.py --steps 200 --step-s 0.5")
    path = write(tmp_path, spec)
    gtrain.up(parse_spec(spec))
    job_id = gtrain.launch(parse_spec(spec)).job_id
    sid = _slurm_id(job_id)
    wait_ranks(job_id)
    shutil.rmtree(os.environ["GTRAIN_HOME"])  # the laptop is gone
    b = {"GTRAIN_HOME": str(tmp_path / "b"), "NO_COLOR": "1"}
    try:
        res = cli("attach", "sl-attach", path, "--provider", "slurm", "--json", env=b)
        assert res.returncode == 0, res.stdout + res.stderr
        got = json.loads(res.stdout)
        assert got["jobs"] == [job_id] and got["num_nodes"] == 2
        res = cli("status", "sl-attach", "--json", env=b)
        assert res.returncode == 0, res.stderr
        assert [j["status"] for j in json.loads(res.stdout)["jobs"]] == ["running"], res.stdout
        ckpt = slurm_cluster.shared / "gtrain" / "sl-attach" / "workdir" / "checkpoints" / "state.json"
        deadline = time.monotonic() + 60
        while not ckpt.exists():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        res = cli("cancel", "sl-attach", env=b)
        assert res.returncode == 0, res.stdout + res.stderr
        assert [j for j in slurm_cluster.jobs() if j.startswith(f"{sid} ")] == [f"{sid} CANCELLED {job_id}"]
        res = cli("logs", "sl-attach", "-f", env=b)
        assert "slurm rank 3/4" in res.stdout + res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
        res = cli("pull", "sl-attach", "--to", str(tmp_path / "pulled"), env=b)
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads((tmp_path / "pulled" / "state.json").read_text())["step"] >= 1
    finally:
        res = cli("down", "sl-attach", env=b)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "reconstructed by `gtrain attach`" in res.stdout, res.stdout
    assert not (slurm_cluster.shared / "gtrain" / "sl-attach").exists()
