"""job.tracking: the variables each tracker reads, set on every rank; the run id stable across recoveries."""

from __future__ import annotations

import inspect

import pytest

from gtrain import tracking
from gtrain.spec import parse_spec


def _job(**tr: object):  # type: ignore[no-untyped-def]
    spec = parse_spec({"name": "c", "job": {"run": "train.py", "tracking": tr, "env": {"WANDB_MODE": "disabled"}}})
    assert spec.job is not None
    return spec.job


def test_wandb_and_mlflow_variables() -> None:
    job = _job(wandb={"project": "p", "entity": "e"}, mlflow={"tracking_uri": "http://mlflow:5000",
                                                               "experiment": "x"})
    env = tracking.env(job, "c-20261203-1", "c/run-abc")
    assert env["WANDB_PROJECT"] == "p" and env["WANDB_ENTITY"] == "e" and env["WANDB_RUN_GROUP"] == "c-20261203-1"
    assert env["WANDB_RESUME"] == "allow" and env["WANDB_RUN_ID"] == tracking.env(job, "another-job", "c/run-abc")[
        "WANDB_RUN_ID"]  # the same run across recoveries / relaunches
    assert "WANDB_MODE" not in env  # the user's job.env wins
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and env["MLFLOW_EXPERIMENT_NAME"] == "x"
    rid = env["WANDB_RUN_ID"]
    assert len(rid) <= 64 and rid.replace("-", "").isalnum() and rid == rid.lower()
    assert tracking.links(job, "c/run-abc")["W&B"].endswith(f"/e/p/runs/{rid}")


def test_keys_go_as_secrets_only_when_set() -> None:
    job = _job(wandb={"project": "p"}, mlflow={"tracking_uri": "http://m:5000", "token_secret": "MLF_TOKEN"})
    assert tracking.secret_names(job, {"WANDB_API_KEY": "k"}) == ["WANDB_API_KEY"]
    assert tracking.secret_names(job, {"MLF_TOKEN": "t"}) == ["MLF_TOKEN"]


def test_bad_tracking_uri_names_the_field() -> None:
    import pytest

    from gtrain.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "c", "job": {"run": "t.py", "tracking": {"mlflow": {"tracking_uri": "http://u:pw@h"}}}})
    assert "job.tracking.mlflow.tracking_uri" in e.value.message and "token_secret" in e.value.message


def test_links_reach_the_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gtrain.runlog.html import render_report
    from gtrain.runlog.model import load_run

    job = {"id": "j-1", "status": "succeeded", "exit_code": 0, "created_at": 1.0, "ended_at": 2.0,
           "tracking": {"MLflow": "http://mlflow:5000/#/experiments/1/runs/abc"}}
    html = render_report(load_run(tmp_path, {"id": "c", "name": "c", "provider": "local", "created_at": 1.0}, job))
    assert 'href="http://mlflow:5000/#/experiments/1/runs/abc"' in html
    assert "no energy data" in html  # no telemetry: said, never 0 kWh


def test_tensorboard_dir_set_and_kept_by_the_archive() -> None:
    from types import SimpleNamespace

    from gtrain.runlog.archive import _tb_dir

    job = _job(tensorboard=True)
    env = tracking.env(job, "j", "c/r")
    assert env["GTRAIN_TENSORBOARD_DIR"] == env["TENSORBOARD_LOGDIR"] == "tensorboard"
    cluster = SimpleNamespace(spec={"job": {"run": "t.py", "tracking": {"tensorboard": True}}})
    assert _tb_dir(cluster, SimpleNamespace(root="/n")) == "/n/workdir/tensorboard"  # type: ignore[arg-type]
    assert _tb_dir(SimpleNamespace(spec={"job": {"run": "t.py"}}), SimpleNamespace(root="/n")) is None  # type: ignore[arg-type]
    # a folder of the user's own (job.env cannot carry GTRAIN_* names, so this is the way to name one)
    job = _job(tensorboard="runs/tb")
    assert tracking.env(job, "j", "c/r")["TENSORBOARD_LOGDIR"] == "runs/tb"
    cluster = SimpleNamespace(spec={"job": {"run": "t.py", "tracking": {"tensorboard": "/abs/tb"}}})
    assert _tb_dir(cluster, SimpleNamespace(root="/n")) == "/abs/tb"  # type: ignore[arg-type]


def test_job_env_tensorboard_dir_is_refused_pointing_at_tracking_tensorboard() -> None:
    """The old documented route (job.env.GTRAIN_TENSORBOARD_DIR) could never pass the spec's GTRAIN_* rule; the
    archive reads job.tracking.tensorboard only, and the refusal says so."""
    from gtrain.errors import ConfigError
    from gtrain.runlog import archive

    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "t", "job": {"run": "t.py", "env": {"GTRAIN_TENSORBOARD_DIR": "tb"}}})
    assert "GTRAIN_TENSORBOARD_DIR" in str(e.value) and "job.tracking.tensorboard" in str(e.value)
    assert "env" not in inspect.getsource(archive._tb_dir).replace("TENSORBOARD_DIR", "")  # no job.env path left


def test_a_blank_tensorboard_folder_is_refused_naming_the_field() -> None:
    from gtrain.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "t", "job": {"run": "t.py", "tracking": {"tensorboard": "  "}}})
    assert "job.tracking.tensorboard" in str(e.value)
