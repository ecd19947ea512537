"""--fresh on a backend whose plan carries the checkpoint tool (JobBackend.checkpoint_tool = "plan"): the run's
folder is marked from this machine, on moto's S3, before any node exists to restore."""

from __future__ import annotations

from typing import Any

from gtrain.events import SILENT
from gtrain.runs import ship
from tests.unit.test_checkpoint_tool_seam import _plan


def test_fresh_is_marked_from_this_machine_before_any_node_restores(tmp_path: Any, moto_server: str) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket="ckpt-seam-fresh")
    backend, plan = _plan(tmp_path)
    plan.request.spec.job.checkpoint_store = "s3://ckpt-seam-fresh/runs"  # type: ignore[union-attr]
    ship.prepare(plan, backend, SILENT, fresh=True)
    head = boto3.client("s3").head_object(Bucket="ckpt-seam-fresh", Key="runs/c/run-1/.gtrain-fresh.json")
    assert head["ContentLength"] > 0
