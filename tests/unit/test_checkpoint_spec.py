"""Spec fields of durable runs and the training script's helper (gtrain.checkpoint)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gtrain import checkpoint
from gtrain.errors import ConfigError
from gtrain.spec import parse_spec


def _spec(job: dict[str, object] | None = None, recovery: object = None) -> object:
    data: dict[str, object] = {"name": "d", "job": {"run": "t.py", **(job or {})}}
    if recovery is not None:
        data["policies"] = {"recovery": recovery}
    return parse_spec(data)


def test_store_and_recovery_parse() -> None:
    s = _spec({"checkpoint_store": "gs://team-ckpt/runs/"},
              {"max_restarts": 10, "on": ["preemption", {"exit_codes": [137]}], "backoff_s": 30})
    assert s.job.checkpoint_store == "gs://team-ckpt/runs"  # type: ignore[attr-defined]
    rec = s.policies.recovery  # type: ignore[attr-defined]
    assert rec.to_info() == {"max_restarts": 10, "on": ["preemption"], "exit_codes": [137], "backoff_s": 30.0}
    assert _spec().policies.recovery.max_restarts == 0  # type: ignore[attr-defined]  # off by default


@pytest.mark.parametrize(("job", "recovery", "field"), [
    ({"checkpoint_store": "/local/dir"}, None, "job.checkpoint_store"),
    ({"checkpoint_store": "s3://Bad_Bucket/x"}, None, "job.checkpoint_store"),
    ({}, {"max_restarts": -1}, "policies.recovery.max_restarts"),
    ({}, {"max_restarts": True}, "policies.recovery.max_restarts"),
    ({}, {"on": ["lunar_eclipse"]}, "policies.recovery.on"),
    ({}, {"on": [{"exit_codes": [0]}]}, "policies.recovery.on"),
    ({}, {"restarts": 3}, "policies.recovery.restarts"),
    ({"checkpoint_tuning": {"settle_s": 0}}, None, "job.checkpoint_tuning.settle_s"),
    ({"checkpoint_tuning": {"poll": 1}}, None, "job.checkpoint_tuning.poll"),
])
def test_bad_values_name_their_field(job: dict[str, object], recovery: object, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        _spec(job, recovery)
    assert e.value.field is not None and e.value.field.startswith(field), (e.value.field, e.value.message)


def test_done_writes_the_marker(tmp_path: Path) -> None:
    (tmp_path / "step-1.pt").write_bytes(b"w")
    assert checkpoint.done(tmp_path / "step-1.pt") == f"{tmp_path}/step-1.pt.done"
    assert (tmp_path / "step-1.pt.done").exists() and not list(tmp_path.glob(".*"))


def test_resume_from_and_on_preempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GTRAIN_RESUME_FROM", raising=False)
    assert checkpoint.resume_from() == ""
    monkeypatch.setenv("GTRAIN_RESUME_FROM", "/x/step-3.pt")
    assert checkpoint.resume_from() == "/x/step-3.pt"
    hit: list[int] = []
    old = signal.getsignal(signal.SIGUSR1)
    try:
        checkpoint.on_preempt(lambda: hit.append(1))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert hit == [1]
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_checkpoint_tuning_reaches_the_nodes_uploader(tmp_path: Path) -> None:
    """The documented timings are spec fields (job.env refuses GTRAIN_*), exported where the uploader starts."""
    import subprocess

    from gtrain.jobs.render import render_all
    from tests.unit.test_render import ctx

    spec = _spec({"checkpoint_store": "s3://bkt/p", "checkpoint_tuning": {"settle_s": 3, "notice_poll_s": 0.5}})
    env = spec.job.checkpoint_tuning.to_env()  # type: ignore[attr-defined]
    assert env == {"GTRAIN_CHECKPOINT_SETTLE_S": "3", "GTRAIN_CHECKPOINT_POLL_S": "2", "GTRAIN_NOTICE_POLL_S": "0.5",
                   "GTRAIN_CHECKPOINT_RESTORE": "whole"}
    script = render_all(ctx(checkpoint_store="s3://bkt/p", checkpoint_env=env))["launch.sh"]
    block = script[script.index("export GTRAIN_CHECKPOINT_SETTLE_S"):script.index("__gtrain_ckpt() {")]
    out = subprocess.run(["bash", "-c", block + 'echo "$GTRAIN_CHECKPOINT_SETTLE_S $GTRAIN_NOTICE_POLL_S"'],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["3", "0.5"]
    assert "GTRAIN_CHECKPOINT_SETTLE_S" not in render_all(ctx(checkpoint_store="s3://bkt/p"))["launch.sh"]


def test_checkpoint_tuning_restore_is_whole_or_subset() -> None:
    spec = _spec({"checkpoint_store": "s3://bkt/p", "checkpoint_tuning": {"restore": "subset"}})
    assert spec.job.checkpoint_tuning.to_env()["GTRAIN_CHECKPOINT_RESTORE"] == "subset"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as e:
        _spec({"checkpoint_store": "s3://bkt/p", "checkpoint_tuning": {"restore": "mine"}})
    assert "job.checkpoint_tuning.restore" in e.value.message and "mine" in e.value.message
