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

import pytest

import gtrain
from gtrain.spec import parse_spec
from tests.integration.test_slurm import _slurm_id, cli, slurm_spec, wait_ranks, write


def test_attach_slurm_after_the_home_is_gone(slurm_cluster: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-attach", "slurm_train.py --steps 200 --step-s 0.5")
    path = write(tmp_path, spec)
    gtrain.up(parse_spec(spec))
    job_id = gtrain.launch(parse_spec(spec)).job_id
    sid = _slurm_id(job_id)
    wait_ranks(job_id)
    shutil.rmtree(os.environ["GTRAIN_HOME"])  # the laptop is gone
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "b"))
    res = cli("attach", "sl-attach", path, "--provider", "slurm", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(res.stdout)
    assert got["jobs"] == [job_id] and got["num_nodes"] == 2
    try:  # the rest in this process, from the home the attach made
        assert [j["status"] for j in gtrain.status("sl-attach")[0]["jobs"]] == ["running"]
        ckpt = slurm_cluster.shared / "gtrain" / "sl-attach" / "workdir" / "checkpoints" / "state.json"
        deadline = time.monotonic() + 60
        while not ckpt.exists():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        gtrain.cancel("sl-attach")
        assert [j for j in slurm_cluster.jobs() if j.startswith(f"{sid} ")] == [f"{sid} CANCELLED {job_id}"]
        lines: list[str] = []
        final = gtrain.logs("sl-attach", follow=True, on_line=lambda ln: lines.append(ln.text))
        assert final.status == "cancelled" and any("slurm rank 3/4" in t for t in lines), lines[-20:]
        gtrain.pull("sl-attach", to=tmp_path / "pulled")
        assert json.loads((tmp_path / "pulled" / "state.json").read_text())["step"] >= 1
    finally:
        down = gtrain.down("sl-attach")
    assert len(down.cost.lines) == 2 and all((ln.note or "").startswith("reconstructed by gtrain attach")
                                             for ln in down.cost.lines)
    assert not (slurm_cluster.shared / "gtrain" / "sl-attach").exists()
