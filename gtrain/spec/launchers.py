"""The spec's launcher fields: ``job.launcher`` and each launcher's option block (``job.accelerate`` ...).

Pydantic only (``gtrain.spec`` imports this module; nothing heavy, no gtrain module that imports the spec).
What each launcher reserves is listed here too, so the spec can refuse a ``job.env`` name that would shadow
one the launcher sets on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

DEFAULT = "torchrun"
NAMES = ("torchrun", "accelerate", "deepspeed", "jax", "tensorflow", "python")

# The per-rank variables every launcher sets (torchrun sets them; gtrain's own spawner sets the same ones).
TORCH_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}
RESERVED_BY = {
    "torchrun": TORCH_ENV,
    "accelerate": TORCH_ENV,
    "deepspeed": TORCH_ENV | {"CROSS_RANK", "CROSS_SIZE"},
    "jax": TORCH_ENV | {"NODE_RANK", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"},
    "tensorflow": TORCH_ENV | {"NODE_RANK", "TF_CONFIG"},
    "python": TORCH_ENV | {"NODE_RANK"},
}
#: every name some launcher sets on a rank: a job.env / job.secrets name may be none of them
RESERVED_ENV: set[str] = set().union(*RESERVED_BY.values())


class _Opts(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def _relative_file(v: str | None) -> str | None:
    if v is None:
        return v
    p = Path(v)
    if not v or p.is_absolute() or ".." in p.parts:
        raise ValueError("must be a file inside the workdir, relative, without '..' (e.g. accelerate.yaml)")
    return p.as_posix()


class AccelerateOptions(_Opts):
    config_file: str | None = Field(None, description="an `accelerate config` YAML inside the workdir; gtrain "
                                    "still sets the machine count, machine rank, main process and process count")
    args: list[str] = Field(default_factory=list, description="more `accelerate launch` flags, passed as written "
                            "(e.g. `[--mixed_precision, bf16]`)")

    @field_validator("config_file")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        return _relative_file(v)


class DeepSpeedOptions(_Opts):
    config: str | None = Field(None, description="a DeepSpeed JSON config inside the workdir; passed to the "
                               "script as `--deepspeed_config PATH` (see `config_arg`) and as "
                               "`GTRAIN_DEEPSPEED_CONFIG`")
    config_arg: str | None = Field("--deepspeed_config", description="the script's flag for the config; null: "
                                   "pass it only in `GTRAIN_DEEPSPEED_CONFIG`")

    @field_validator("config")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        return _relative_file(v)


class JaxOptions(_Opts):
    initialize: bool = Field(True, description="gtrain calls `jax.distributed.initialize(...)` before the "
                             "script; false: the script calls it (`JAX_*` env)")


class TensorFlowOptions(_Opts):
    pass


OPTION_MODELS: dict[str, type[_Opts]] = {"accelerate": AccelerateOptions, "deepspeed": DeepSpeedOptions,
                                         "jax": JaxOptions, "tensorflow": TensorFlowOptions}


def check_launcher_name(v: str) -> str:
    if v not in NAMES:
        expected = ", ".join(repr(n) for n in NAMES[:-1]) + f" or {NAMES[-1]!r}"
        raise PydanticCustomError("literal_error", "not a launcher", {"expected": expected})
    return v


def check_block(block: str, value: Any, launcher: str | None) -> Any:
    """An option block is given only for the launcher it belongs to (``launcher: jax`` with ``accelerate:``
    is a mistake: say which launcher was chosen)."""
    if value is not None and launcher is not None and launcher != block:
        raise ValueError(f"options for launcher {block!r} given, but job.launcher is {launcher!r}: "
                         f"remove job.{block} or set launcher: {block}")
    return value
