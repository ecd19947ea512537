"""job.image on Slurm: the rendered batch script and node wrapper for pyxis, enroot and apptainer (golden files;
``GTRAIN_UPDATE_GOLDEN=1`` rewrites them), and the choice of runtime from what the cluster has."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import ConfigError
from gtrain.jobs.backend import JobRequest
from gtrain.providers.slurm.backend import render_job
from gtrain.providers.slurm.containers import Found, choose, enroot_uri
from gtrain.spec import parse_spec
from gtrain.state import Cluster

GOLDEN = Path(__file__).parent / "golden" / "slurm"
ROOT = "/shared/gtrain/sl"


def spec(**job: Any) -> Any:
    base = {"workdir": ".", "run": "train.py", "nproc_per_node": 2, "image": "nvcr.io/nvidia/pytorch:25.01-py3",
            "image_credentials": {"username": "$oauthtoken", "password_secret": "NGC_API_KEY"},
            "container": {"mounts": [{"host": "/fsx", "path": "/data", "read_only": True}]}}
    base.update(job)
    return parse_spec({"name": "sl", "provider": "slurm", "num_nodes": 2, "resources": {"accelerators": "H100:8"},
                       "slurm": {"partition": "gpu", "shared_dir": "/shared"}, "job": base})


def files(runtime: str | None, **job: Any) -> dict[int, dict[str, str]]:
    s = spec(**job)
    cluster = Cluster("cid", "sl", "slurm", "up", 2, {}, None, None, None, 0.0, 0.0, None)
    return render_job(JobRequest(cluster, s, "job-1", "."), ROOT, "python3", ["--nodes=2", "--partition=gpu"],
                      runtime)


@pytest.mark.parametrize("runtime", ["pyxis", "enroot", "apptainer"])
def test_golden_batch_and_node_scripts(runtime: str) -> None:
    out = files(runtime)
    for name in ("batch.sh", "node.sh", "command"):
        got = out[0][name]
        golden = GOLDEN / f"{runtime}.{name}"
        if os.environ.get("GTRAIN_UPDATE_GOLDEN") == "1":
            golden.write_text(got)
        assert got == golden.read_text(), f"{golden.name} changed; GTRAIN_UPDATE_GOLDEN=1 rewrites it"
        assert subprocess.run(["bash", "-n"], input=got, text=True).returncode == 0, name
    assert out[1]["command"].endswith(f"{ROOT}/jobs/job-1/node-1/launch.sh\n") or runtime == "pyxis"
    text = "".join(out[0].values())
    assert "NGC_API_KEY" in text and "the-secret" not in text  # the secret's name, never a value


def test_pyxis_srun_line_takes_the_image_and_mounts() -> None:
    batch = files("pyxis")[0]["batch.sh"]
    srun = next(ln for ln in batch.splitlines() if "bash \"$JOB/node.sh\"" in ln)
    assert "--container-image=nvcr.io#nvidia/pytorch:25.01-py3" in srun
    assert f"--container-mounts={ROOT}/workdir:{ROOT}/workdir,{ROOT}/jobs/job-1:{ROOT}/jobs/job-1,/fsx:/data:ro" in srun
    assert "export ENROOT_CONFIG_PATH=" in batch and "password $NGC_API_KEY" in batch


def test_no_image_renders_as_before() -> None:
    out = files(None, image=None, image_credentials=None, container=None)
    assert "container" not in out[0]["batch.sh"] and "command" not in out[0]
    assert 'exec bash "$D/launch.sh"' in out[0]["node.sh"]


def test_choose_from_what_the_cluster_has() -> None:
    job = spec().job
    assert choose(job, Found(pyxis=True, enroot=True, apptainer="apptainer", node="c1")) == "pyxis"
    assert choose(job, Found(enroot=True, apptainer="apptainer", node="c1")) == "enroot"
    assert choose(job, Found(apptainer="singularity", node="c1")) == "apptainer"
    with pytest.raises(ConfigError) as e:
        choose(job, Found(node="c1"))
    assert "pyxis" in e.value.message and "enroot" in e.value.message and "apptainer" in e.value.message
    assert "c1" in e.value.message and e.value.field == "job.image"
    job = spec(container={"runtime": "apptainer"}).job
    with pytest.raises(ConfigError) as e:
        choose(job, Found(pyxis=True, enroot=True, node="c1"))
    assert "apptainer is not on this cluster" in e.value.message and "pyxis, enroot" in e.value.message
    assert choose(spec(container={"runtime": "enroot"}).job, Found(pyxis=True, apptainer="apptainer")) == "pyxis"
    with pytest.raises(ConfigError) as e:
        choose(spec(container={"runtime": "docker"}).job, Found(pyxis=True))
    assert e.value.field == "job.container.runtime"


def test_enroot_uri() -> None:
    assert enroot_uri("nvcr.io/nvidia/pytorch:25.01-py3") == "docker://nvcr.io#nvidia/pytorch:25.01-py3"
    assert enroot_uri("ubuntu:22.04") == "docker://ubuntu:22.04"
    assert enroot_uri("localhost:5000/a/b@sha256:" + "a" * 64) == "docker://localhost:5000#a/b@sha256:" + "a" * 64
