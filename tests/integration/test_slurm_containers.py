"""job.image on the real Slurm fixture (tests/fixtures/slurm.py): the runtime is detected on the cluster --
``srun --help`` has no ``--container-image`` (no pyxis here) and ``command -v`` on a compute node finds neither
enroot nor apptainer/singularity (neither installs on this machine: not in Debian bookworm, not on PyPI) -- so
`launch` refuses with exit 2 naming what is missing, and no job of gtrain's reaches Slurm. The batch scripts
for pyxis, enroot and apptainer are golden files (tests/unit/test_slurm_containers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gtrain
from gtrain.spec import parse_spec
from tests.integration.test_slurm import cli, slurm_spec, write


def test_no_runtime_on_the_cluster_refuses_exit_2_nothing_submitted(slurm_cluster: Any, tmp_path: Path) -> None:
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-img", "slurm_train.py --steps 1")
    gtrain.up(parse_spec(spec))
    try:
        spec["job"]["image"] = "registry.example:5000/team/train:1"
        before = [j for j in slurm_cluster.jobs() if not j.endswith(" bash")]
        for args in (("launch", write(tmp_path, spec)), ("launch", write(tmp_path, spec), "--dry-run")):
            res = cli(*args)
            assert res.returncode == 2, res.stdout + res.stderr
            err = res.stderr
            for word in ("job.image", "--container-image (pyxis)", "enroot", "apptainer/singularity",
                         "compute node"):
                assert word in err, err
            assert "Traceback" not in err
        # the probe ran on a compute node (a one-task srun: its name is `bash`); no batch job of gtrain's
        assert [j for j in slurm_cluster.jobs() if not j.endswith(" bash")] == before

        spec["job"]["container"] = {"runtime": "apptainer"}
        res = cli("launch", write(tmp_path, spec))
        assert res.returncode == 2 and "job.container.runtime: apptainer is not on this cluster" in res.stderr
        spec["job"]["container"] = {"runtime": "docker"}
        res = cli("launch", write(tmp_path, spec))
        assert res.returncode == 2 and "runs only on VM providers" in res.stderr, res.stderr
    finally:
        gtrain.down("sl-img", yes=True)
