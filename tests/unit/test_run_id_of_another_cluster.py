"""``job.run_id: <cluster>/<run_id>`` (issue 36): a cluster of another name (and shape) resumes another cluster's
run; the store folder is then that run's, as is, and only a cluster name and a run id fit."""

from __future__ import annotations

import pytest

from gtrain.errors import ConfigError
from gtrain.spec import parse_spec
from gtrain.spec.checkpoints import check_run_id, run_key


def test_a_run_id_naming_a_cluster_keys_that_clusters_run() -> None:
    assert run_key("wide", "reshard/dcp-run", "train.py", "ckpt") == "reshard/dcp-run"
    assert run_key("wide", "dcp-run", "train.py", "ckpt") == "wide/dcp-run"
    assert run_key("wide", None, "train.py", "ckpt").startswith("wide/run-")


@pytest.mark.parametrize("good", ["gpt2-small", "reshard/dcp-run", "a/run-0123456789ab", "my-cluster-1/x.y_z"])
def test_run_ids_that_fit(good: str) -> None:
    assert check_run_id(good) == good


@pytest.mark.parametrize("bad", ["Big/run", "a/b/c", "../run", "a/../b", "/run", "run/", "-x/run", "x-/run",
                                 "a//b", "a/.x", f"{'a' * 41}/run", f"a/{'r' * 65}"])
def test_run_ids_that_do_not(bad: str) -> None:
    with pytest.raises(ValueError, match="CLUSTER/RUN_ID"):
        check_run_id(bad)


def test_the_spec_takes_it() -> None:
    spec = {"name": "wide", "provider": "local", "num_nodes": 4,
            "job": {"run": "train.py", "checkpoint_store": "s3://team-ckpt/runs", "run_id": "reshard/dcp-run"}}
    job = parse_spec(spec).job
    assert job is not None and job.run_id == "reshard/dcp-run"
    with pytest.raises(ConfigError, match="run_id"):
        parse_spec({**spec, "job": {**spec["job"], "run_id": "a/b/c"}})
