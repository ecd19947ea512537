"""The spec's ``ray:`` section: its model, the Jobs API address (``ray.address``, else ``RAY_ADDRESS``), and its
errors as ``ray.<field>`` ConfigErrors (exit 2)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gtrain.errors import ConfigError
from gtrain.spec import ENV_NAME_RE, RESERVED_ENV
from gtrain.spec.data import has_control, system_dir, url_credentials

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec

#: the Ray placement strategies gtrain offers (one bundle per node; STRICT_SPREAD: on distinct nodes)
PLACEMENTS = {"strict_spread": "STRICT_SPREAD", "spread": "SPREAD"}
#: runtime_env keys gtrain owns (the job's working_dir is the workdir it uploads)
OWNED_RUNTIME_ENV = ("working_dir",)
#: the runtime_env keys Ray documents (docs.ray.io, "Runtime environments": the API reference)
RUNTIME_ENV_KEYS = ("pip", "uv", "conda", "env_vars", "py_modules", "py_executable", "excludes", "image_uri",
                    "container", "config", "nsight", "java_jars", "worker_process_setup_hook")
_SECRET_HINT = "the Jobs API address holds no secrets; put a token in job.secrets (the ranks get it as env)"
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./-]+$")
_RESOURCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,127}$")


class RayOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    address: str | None = Field(None, description="the Ray Jobs API (the dashboard), e.g. http://head:8265; "
                                "default: RAY_ADDRESS")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="passed to the Ray job (pip, conda, "
                                        "env_vars, ...); working_dir is gtrain's (the job.workdir)")
    placement: Literal["strict_spread", "spread"] = Field(
        "strict_spread", description="the placement group's strategy: one bundle per node (strict_spread: each "
        "on a distinct Ray node)")
    gpu_resource: str = Field("GPU", description="the Ray resource a node's accelerators are counted as (a "
                              "custom resource such as accelerator_type names work too)")
    cpus_per_node: float = Field(1, ge=0, description="CPUs each node's bundle reserves")
    root: str = Field("/tmp/gtrain-ray", description="where each Ray node keeps the job's scripts, logs and "
                      "workdir copy (an absolute path)")
    driver_python: str = Field("python", description="the interpreter (with ray) the job's entrypoint runs on "
                               "the head node, as in Ray's own examples")
    pending_timeout_s: float = Field(600, gt=0, description="how long the placement group may wait to be placed "
                                     "before the job fails with Ray's reason")
    price_per_gpu_hour: float = Field(0.0, ge=0, description="$ per GPU-hour of the cluster's time up, for the "
                                      "cost report")

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None and url_credentials(v):
            raise ConfigError("invalid spec: ray.address: credentials or a token in the URL are refused (the "
                              "value is not shown)", hint=_SECRET_HINT, field="ray.address")
        if v is not None and not re.match(r"^https?://[^\s/@]+(/[^\s]*)?\Z", v):
            raise ValueError("must be the Ray dashboard's http(s) address, e.g. http://head:8265")
        return v.rstrip("/") if v else v

    @field_validator("root")
    @classmethod
    def _root(cls, v: str) -> str:
        if not _SAFE_PATH.match(v) or v.rstrip("/") in ("", "/tmp") or ".." in v.split("/"):
            raise ValueError("must be an absolute path of letters, digits, '_', '.', '/', '-' (not / or /tmp)")
        if (sysdir := system_dir(v)) or len([p for p in v.split("/") if p not in ("", ".")]) < 2:
            where = f"is in the system folder {sysdir}" if sysdir else "is a top-level folder"
            raise ValueError(f"{where}; give a folder of gtrain's own, e.g. /tmp/gtrain-ray")
        return v.rstrip("/")

    @field_validator("driver_python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_./+-]+$", v):
            raise ValueError("must be an interpreter's name or path (letters, digits, '_', '.', '/', '+', '-')")
        return v

    @field_validator("gpu_resource")
    @classmethod
    def _resource(cls, v: str) -> str:
        if not _RESOURCE.match(v) or v in ("CPU", "memory", "object_store_memory"):
            raise ValueError("is not a Ray resource name for accelerators (GPU, or a custom resource)")
        return v

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, v: dict[str, Any]) -> dict[str, Any]:
        owned = [k for k in OWNED_RUNTIME_ENV if k in v]
        if owned:
            raise ValueError(f"sets {owned[0]}, which gtrain sets (the job.workdir); remove it")
        unknown = [k for k in v if k not in RUNTIME_ENV_KEYS]
        if unknown:
            raise ValueError(f"{str(unknown[0])[:40]!r} is not a runtime_env key Ray knows; use "
                             + ", ".join(RUNTIME_ENV_KEYS))
        env = v.get("env_vars")
        if env is not None and not (isinstance(env, dict) and all(isinstance(x, str) for x in env.values())):
            raise ValueError("env_vars must map names to strings")
        for k, val in (env or {}).items():
            if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
                raise ValueError(f"env_vars: {str(k)[:40]!r} is not an environment variable name (letters, "
                                 "digits, _)")
            if k in RESERVED_ENV or k.startswith("GTRAIN_"):
                raise ValueError(f"env_vars: {k!r} is set by gtrain or the launcher on every rank (GTRAIN_* is "
                                 "reserved); pick another name")
            if "\x00" in val:
                raise ValueError(f"env_vars: the value of {k!r} holds a NUL byte")
        return v

    def job_address(self) -> str:
        return resolve_address(self.address)

    def bundle(self, gpus: int) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.cpus_per_node:
            out["CPU"] = self.cpus_per_node
        if gpus:
            out[self.gpu_resource] = float(gpus)
        return out


def resolve_address(address: str | None) -> str:
    """``ray.address``, else RAY_ADDRESS; the Jobs API is HTTP (a ``ray://`` or GCS ``host:6379`` is not it)."""
    if address:
        return address
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if not env:
        raise ConfigError("ray.address: not set and RAY_ADDRESS is empty", field="ray.address",
                          hint="ray.address: http://HEAD:8265 (the Ray dashboard, which serves the Jobs API)")
    if url_credentials(env) or has_control(env):
        raise ConfigError("ray.address: RAY_ADDRESS holds credentials, a token or control characters (the value "
                          "is not shown)", field="ray.address", hint=_SECRET_HINT)
    if not re.match(r"^https?://[^\s/]+", env):
        raise ConfigError(f"ray.address: RAY_ADDRESS is {env!r}, not the Jobs API's http address",
                          field="ray.address", hint="RAY_ADDRESS=http://HEAD:8265 (the dashboard port, not the "
                          "GCS port 6379 or ray://)")
    return env.rstrip("/")


def parse_options(spec: ClusterSpec) -> RayOptions:
    from gtrain.spec import translate_validation_error

    raw: dict[str, Any] | None = spec.section("ray")
    try:
        opts = RayOptions.model_validate(raw or {})
    except ValidationError as e:
        err = translate_validation_error(e, RayOptions)
        fields = "|".join(RayOptions.model_fields)  # a problem starts with its field; a "; " inside one stays
        msg = re.sub(rf"(invalid spec: |; )(?=(?:{fields})\b)", r"\1ray.", err.message)
        raise ConfigError(msg, hint=err.hint, field=f"ray.{err.field}") from None
    if spec.resources.use_spot:
        raise ConfigError("resources.use_spot: true — the Ray cluster's nodes are its owner's business",
                          hint="remove use_spot", field="resources.use_spot")
    if spec.job is not None and spec.job.image:
        raise ConfigError("job.image: not supported on provider ray (the job runs in the Ray nodes' environment)",
                          hint="remove job.image; use ray.runtime_env (pip, conda, image_uri) instead",
                          field="job.image")
    if spec.job is not None and spec.job.setup:
        raise ConfigError("job.setup: not supported on provider ray (the nodes' environment is Ray's runtime_env)",
                          hint="install with ray.runtime_env: {pip: [...]} instead", field="job.setup")
    if spec.job is not None and spec.job.data:
        raise ConfigError("job.data: not supported on provider ray yet", field="job.data",
                          hint="read the data from shared storage in the training script")
    return opts
