"""W&B in offline mode on a local job: the run directory carries the job id as its group and the run id gtrain
made from the run key (stable across recoveries), and gtrain.metrics.log reached wandb.log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gtrain
from gtrain import tracking

SCRIPT = """import wandb
import gtrain.metrics
run = wandb.init()
print("wandb_run=" + run.id + " group=" + str(run.group), flush=True)
gtrain.metrics.log(step=1, loss=0.25)
run.finish()
"""


def test_wandb_offline_run_has_the_job_id_as_its_group(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "wandb-out"
    spec = tmp_path / "wb.yaml"
    spec.write_text(json.dumps({
        "name": "wandb-off", "provider": "local", "num_nodes": 1,
        "job": {"workdir": str(tmp_path), "run": "train.py", "nproc_per_node": 1, "python": sys.executable,
                "launcher": "python", "run_id": "wb-run", "env": {"WANDB_DIR": str(out), "WANDB_SILENT": "true"},
                "tracking": {"wandb": {"project": "p", "mode": "offline"}, "forward_metrics": True}}}))
    lines: list[str] = []
    res = gtrain.run(spec, to=tmp_path / "pulled", on_line=lambda ln: lines.append(ln.text))
    assert res.exit_code == 0, lines
    rid = tracking.run_id("wandb-off/wb-run")
    assert f"wandb_run={rid} group={res.job_id}" in lines, lines
    [run_dir] = list((out / "wandb").glob("offline-run-*"))
    assert run_dir.name.endswith(rid)
    data = (run_dir / f"run-{rid}.wandb").read_bytes()
    assert res.job_id.encode() in data and b"loss" in data  # the group, and the forwarded metric
