"""The spec's health policies (``policies.preflight``, ``policies.min_gpu_util``); what they do is
:mod:`gtrain.health`'s and :mod:`gtrain.runs`'s."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: ``policies.preflight``: quick | full | off
PREFLIGHT_PATTERN = "^(quick|full|off)$"


class MinGpuUtil(BaseModel):
    """``policies.min_gpu_util``: GPUs idle while the money runs."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("percent", "minutes", mode="before")
    @classmethod
    def _not_bool(cls, v: Any) -> Any:  # YAML's `true` is not the number 1
        if isinstance(v, bool):
            raise ValueError("is a boolean, not a number")
        return v

    percent: float = Field(10, ge=0, le=100, allow_inf_nan=False,
                           description="a GPU under this utilisation (%) counts as idle")
    minutes: float = Field(30, gt=0, le=10080, allow_inf_nan=False,
                           description="idle this long, on every GPU of the cluster, before acting")
    action: Literal["warn", "stop"] = Field("warn", description="`warn`, or `stop` the job (its backend's "
                                            "cancel)")
