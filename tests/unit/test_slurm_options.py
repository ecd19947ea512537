"""The slurm: section and the plan (`up --dry-run`), which touch no Slurm: errors name slurm.<field>."""

from __future__ import annotations

import pytest

from gtrain.errors import ConfigError
from gtrain.providers.slurm.options import parse_options
from gtrain.providers.slurm.provider import SlurmProvider, gres_gpus
from gtrain.spec import parse_spec
from gtrain.state import StateStore


def spec(**slurm: object) -> object:
    return parse_spec({"name": "s", "provider": "slurm", "num_nodes": 2, "resources": {"accelerators": "H100:8"},
                       "slurm": {"partition": "gpu", **slurm}, "job": {"run": "train.py"}})


@pytest.mark.parametrize(("section", "field"), [
    ({"partiton": "x"}, "slurm.partiton"), ({"time": "soon"}, "slurm.time"), ({"login": "a b@c"}, "slurm.login"),
    ({"extra_sbatch": ["--partition=x"]}, "slurm.extra_sbatch"), ({"extra_sbatch": ["mem=1"]}, "slurm.extra_sbatch"),
    ({"rate_per_gpu_hour": -1}, "slurm.rate_per_gpu_hour"), ({"signal": "USR1 now"}, "slurm.signal"),
])
def test_bad_fields_are_config_errors_naming_the_field(section: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_options(spec(**section))  # type: ignore[arg-type]
    assert e.value.field == field and e.value.exit_code == 2


def test_plan_shows_what_a_job_would_ask(tmp_path: object) -> None:
    p = SlurmProvider(StateStore(tmp_path)).plan(spec(time="2:00:00", rate_per_gpu_hour=2.5))  # type: ignore[arg-type]
    asked = next(n for n in p.notes if n.startswith("a job would ask"))
    for opt in ("--nodes=2", "--partition=gpu", "--time=2:00:00", "--gpus-per-node=8", "--requeue",
                "--signal=B:USR1@120", "--exclusive"):
        assert opt in asked
    assert p.price_per_hour == 20.0 and p.gpus_per_node == 8


def test_gres_parsing() -> None:
    assert gres_gpus("gpu:h100:8(S:0-1)") == ("h100", 8)
    assert gres_gpus("gpu:4,shard:8") == (None, 4)
    assert gres_gpus("(null)") == (None, 0)
