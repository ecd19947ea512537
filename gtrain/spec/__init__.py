"""The YAML spec: pydantic models of cluster, resources, job and policies.

Every validation failure becomes one :class:`~gtrain.errors.ConfigError` line that names the field path,
the bad value and the fix. Relative paths in a spec file (``job.workdir``) are resolved against the
directory of the spec file, so ``gtrain run examples/quickstart/spec.yaml`` works from anywhere."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, to_jsonable_python

from gtrain.errors import ConfigError
from gtrain.spec import elastic, launchers, queue, torchft, translate, volumes
from gtrain.spec.anyof import (
    Candidate,
    Order,
    _provider_choices,
    candidate_providers,
    check_accelerators,
    check_candidates,
    default_provider,
    provider_known,
    settle,
)
from gtrain.spec.checkpoints import CheckpointTuning, Recovery, check_run_id, check_store
from gtrain.spec.containers import ContainerOptions, ImageCredentials, check_image
from gtrain.spec.data import DataEntry, check_keys, check_spec_file, duplicates, no_credentials, no_nul
from gtrain.spec.health import PREFLIGHT_PATTERN, MinGpuUtil
from gtrain.spec.notify import EnergySpec, NotifySpec, Tracking
from gtrain.spec.torchft import TorchftOptions
from gtrain.spec.translate import _short
from gtrain.spec.volumes import Volume, check_list

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$|^[a-z]$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names gtrain sets itself on every rank; a user env var may not shadow them.
RESERVED_ENV = {
    "GTRAIN_NODE_RANK", "GTRAIN_NUM_NODES", "GTRAIN_NODE_IPS", "GTRAIN_MASTER_ADDR", "GTRAIN_MASTER_PORT",
    "GTRAIN_JOB_ID", "GTRAIN_CHECKPOINT_DIR", *launchers.RESERVED_ENV,  # what any launcher sets on a rank
}
# Names whose value on this machine is wrong on a node: a secret (sent from the local environment) may not be one.
HOST_ENV = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH",
            "PYTHONHOME", "VIRTUAL_ENV"}
MAX_NODES = 4096  # a thousand-node run and more (docs/scale.md); the loader's limits still hold (MAX_KEYS hosts)
MAX_HOURS = 8760.0  # a year
MAX_IDLE_MINUTES = 525600.0  # a year
MAX_COST_USD = 1e7



def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise PydanticCustomError("bool_not_number", "is a boolean, not a number")
    return v


# YAML's `true` is not the number 1 (pydantic would take it as one).
Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]
# job.env names and values are kept as written (the model strips every other string).
Text = Annotated[str, StringConstraints(strip_whitespace=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_assignment=True)


def _reserved_name(k: str) -> str | None:
    if k in RESERVED_ENV or k.startswith("GTRAIN_"):
        return (f"{k!r} is set by gtrain/torchrun or the launcher on every rank (GTRAIN_* is reserved); " + (
            "name the folder in job.tracking.tensorboard" if k == "GTRAIN_TENSORBOARD_DIR" else "pick another name"))
    return None


class Resources(_Model):
    accelerators: str | None = Field(
        None, description="GPU model and count per node, `GPU:COUNT` (`A100:8`, `H100`); COUNT 1..16, default 1; "
        "a name in lower case is upper-cased; or a Cloud TPU slice, `tpu-v5p-32` (gcp; docs/providers/tpu.md)")
    instance_type: str | None = Field(None, description="the provider's machine type (aws, gcp)")
    use_spot: bool = Field(False, description="spot / preemptible capacity (aws, gcp; local refuses it)")
    region: str | None = Field(None, description="one region")
    regions: list[str] | None = Field(None, description="regions to try, in order; used instead of `region`")
    zones: list[str] | None = Field(None, description="zones to try")
    disk_gb: Int = Field(100, ge=10, le=65536, description="boot disk size per node, GB")
    image_id: str | None = Field(None, description="machine image (AMI / GCE image)")
    any_of: Annotated[list[Candidate] | None, AfterValidator(check_candidates)] = Field(
        None, description="candidate placements `{provider, region, regions, zones, use_spot, accelerators, "
        "instance_type}` tried in `order`; see docs/any_of.md")
    order: Order | None = Field(None, description="with `any_of`: `price` (cheapest first, the default) or "
                                "`listed` (as written)")

    @field_validator("accelerators")
    @classmethod
    def _accel(cls, v: str | None) -> str | None:
        return check_accelerators(v)

    @property
    def gpu_name(self) -> str | None:
        return self.accelerators.split(":")[0] if self.accelerators else None

    @property
    def tpu(self) -> bool:
        """``accelerators`` names a Cloud TPU slice (``tpu-v5p-32``): its hosts are the nodes, it has no GPUs."""
        return bool(self.accelerators) and self.accelerators.startswith("tpu-")  # type: ignore[union-attr]

    def accelerator_env(self) -> dict[str, str]:
        """What every rank's environment gets for the accelerator: a TPU slice's PyTorch/XLA needs
        ``PJRT_DEVICE=TPU`` (JAX finds the chips itself); ``job.env`` may override it."""
        return {"PJRT_DEVICE": "TPU"} if self.tpu else {}

    @property
    def gpus_per_node(self) -> int:
        return int(self.accelerators.split(":")[1]) if self.accelerators and not self.tpu else 0

    def region_list(self) -> list[str]:
        if self.regions:
            return list(self.regions)
        return [self.region] if self.region else []


class Job(_Model):
    workdir: str = Field(".", description="local folder copied to every node; `~` is expanded; relative to "
                         "the spec file's folder")
    setup: str | None = Field(None, description="bash script run on every node before the job starts")
    launcher: str = Field(launchers.DEFAULT, description="what starts the ranks: `torchrun`, `accelerate`, "
                          "`deepspeed`, `jax`, `tensorflow` or `python`; see docs/launchers.md")
    run: str = Field(..., min_length=1, description="script and its arguments, relative to the workdir, started "
                     "by the launcher; must split like a shell command line")
    nproc_per_node: Int | None = Field(None, ge=1, le=64, description="ranks per node; default: the GPU count "
                                       "of `resources.accelerators`, else 1")
    env: dict[Text, Text] = Field(default_factory=dict, description="environment of setup and every rank; "
                                  "names `^[A-Za-z_][A-Za-z0-9_]*$`, not reserved; values kept as written")
    secrets: list[str] = Field(default_factory=list, description="names of local environment variables sent "
                               "to every rank; not reserved, not one of this machine such as `PATH`, not in `env`")
    checkpoint_dir: str = Field("checkpoints", description="relative to the workdir, no `..`; exported as "
                                "`GTRAIN_CHECKPOINT_DIR`")
    data: list[DataEntry] = Field(default_factory=list, description="datasets each node downloads at launch; "
                                  "see [job.data](#jobdata)")
    max_restarts: Int = Field(0, ge=0, le=100, description="torchrun's `--max_restarts`")
    checkpoint_store: Annotated[str | None, AfterValidator(check_store),
                                no_credentials("job.checkpoint_store")] = Field(
        None, description="`s3://bucket[/prefix]`, `gs://…` or `az://container[/prefix]`: nodes upload checkpoints "
        "there and restore from it; see docs/durable.md")
    run_id: Annotated[str | None, AfterValidator(check_run_id)] = Field(
        None, description="the run the checkpoints in `checkpoint_store` belong to (a relaunch resumes it; "
        "`CLUSTER/ID`: another cluster's run); default: `run-` + a hash of `run` and `checkpoint_dir`")
    checkpoint_tuning: CheckpointTuning | None = Field(
        None, description="`{settle_s: 10, poll_s: 2, notice_poll_s: 5, restore: whole}`: the uploader's timings; "
                           "`restore: subset`: a DCP step only what the node's ranks read; see docs/durable.md")
    python: str | None = Field(None, description="interpreter on the nodes (default: python3; local: this one)")
    queue: bool = Field(False, description="on a busy cluster, wait in the cluster's queue (on its nodes) instead "
                        "of failing, as `launch --queue`; see docs/queue.md")
    priority: Int = Field(0, ge=-1000, le=1000, description="a queued job's place: higher starts first, then the "
                          "earliest queued (`launch --priority`)")
    gpus_per_node: Int | None = Field(None, ge=1, le=64, description="GPUs of a node the job takes (default: all); "
                                      "fewer, with `queue`: jobs side by side on a one-node cluster; see docs/queue.md")
    image: Annotated[str | None, AfterValidator(check_image)] = Field(
        None, description="container image every node runs the job in (`nvcr.io/nvidia/pytorch:25.01-py3`); "
        "required on kubernetes; see docs/containers.md")
    image_credentials: ImageCredentials | None = Field(
        None, description="`{username, password_secret}` for a private registry; `password_secret` names a "
        "local environment variable")
    container: ContainerOptions | None = Field(None, description="`{runtime, mounts, options}`; needs `image`")
    accelerate: launchers.AccelerateOptions | None = Field(None, description="`launcher: accelerate` options")
    deepspeed: launchers.DeepSpeedOptions | None = Field(None, description="`launcher: deepspeed` options")
    jax: launchers.JaxOptions | None = Field(None, description="`launcher: jax` options")
    tensorflow: launchers.TensorFlowOptions | None = Field(None, description="`launcher: tensorflow` options")
    fault_tolerance: Literal["torchft"] | None = Field(
        None, description="`torchft`: each node is a torchft replica group; see docs/durable.md, \"torchft mode\"")
    torchft: TorchftOptions | None = Field(None, description="`{lighthouse, port, min_replicas, join_timeout_ms, "
                                           "quorum_tick_ms, heartbeat_timeout_ms}`; only with fault_tolerance: torchft")
    tracking: Tracking | None = Field(None, description="`{wandb: {project, entity}, mlflow: {tracking_uri, "
                                      "experiment}, tensorboard: true}`: what each tracker reads is set on every "
                                      "rank; see docs/tracking.md")

    @field_validator("launcher")
    @classmethod
    def _launcher(cls, v: str) -> str:
        return launchers.check_launcher_name(v)

    @field_validator("accelerate", "deepspeed", "jax", "tensorflow")
    @classmethod
    def _launcher_block(cls, v: Any, info: ValidationInfo) -> Any:
        return launchers.check_block(str(info.field_name), v, info.data.get("launcher"))

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for k, val in v.items():
                if not isinstance(val, str):
                    raise ValueError(f"{k}: {_short(val)} is not text; quote it ({k}: '...'): a value is "
                                     "passed as written, never converted")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name (letters, digits, _)")
            if why := _reserved_name(k):
                raise ValueError(why)
            if "\x00" in val:
                raise ValueError(f"value of {k!r} holds a NUL byte")
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        for k in v:
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
            if why := _reserved_name(k):
                raise ValueError(why)
            if k in HOST_ENV:
                raise ValueError(f"{k!r} would send this machine's {k} to the nodes; set it in job.env instead")
        if twice := duplicates(v):
            raise ValueError(f"{twice} given more than once")
        return v

    @model_validator(mode="after")
    def _secret_not_env(self) -> Job:
        if both := sorted(set(self.secrets) & set(self.env)):
            raise ValueError(f"job.secrets and job.env both set {both}: keep one")
        if self.image is None and (self.image_credentials is not None or self.container is not None):
            raise ValueError("job.image_credentials and job.container need job.image (the image to run)")
        return self

    _no_nul = field_validator("workdir", "run", "checkpoint_dir", "setup", "python")(no_nul)

    @field_validator("checkpoint_dir")
    @classmethod
    def _ckpt(cls, v: str) -> str:
        p = Path(v)
        if not v or p.is_absolute() or ".." in p.parts:
            raise ValueError("must be a path inside the workdir, relative, without '..' (e.g. checkpoints)")
        return p.as_posix()

    @field_validator("run")
    @classmethod
    def _run(cls, v: str) -> str:
        try:
            parts = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"cannot be split into arguments ({e})") from None
        if not parts:
            raise ValueError("is empty; give a script and its arguments, e.g. train.py --steps 50")
        return v

    @property
    def argv(self) -> list[str]:
        """``run`` split like a shell would, without running one."""
        parts = shlex.split(self.run)
        if parts and parts[0] in ("python", "python3"):
            parts = parts[1:]
        return parts


class Policies(_Model):
    idle_minutes: Float | None = Field(None, gt=0, le=MAX_IDLE_MINUTES, allow_inf_nan=False,
                                       description="stop a node idle this long (aws, gcp)")
    max_hours: Float | None = Field(None, gt=0, le=MAX_HOURS, allow_inf_nan=False,
                                    description="each node deletes itself after this long (aws, gcp)")
    max_cost_usd: Float | None = Field(None, gt=0, le=MAX_COST_USD, allow_inf_nan=False,
                                       description="cost cap, spread over the nodes' lifetime (aws, gcp)")
    preflight: str = Field("off", pattern=PREFLIGHT_PATTERN, description="`gtrain health` before `launch` "
                           "starts the job: `quick`, `full` or `off`; a failed node stops the launch (exit 1)")
    min_gpu_util: MinGpuUtil | None = Field(None, description="`{percent, minutes, action}`: warn (`action: "
                                            "stop`: stop the job) when every GPU idles; see docs/health.md")
    recovery: Recovery = Field(default_factory=lambda: Recovery(), description="recover from lost nodes; see "
                               "docs/durable.md")


class ClusterSpec(_Model):
    name: str = Field(..., description="the cluster's name: 1-40 of `a-z`, `0-9`, `-`; starts with a letter, "
                      "does not end with `-`; `--name` overrides it")
    provider: str = Field("local", description="a registered provider (`gtrain/registry.py`: `local`, `ssh`, `aws`, "
                          "`gcp`, `azure`, `lambda`, `slurm`, `kubernetes`, `ray`, `runpod`, `vast`, `nebius`), or a "
                          "plug-in's")
    num_nodes: Int = Field(1, ge=1, le=MAX_NODES, description="nodes of the cluster (local: at most 16); "
                           "`{min: 2, max: 8}`: an elastic run (torchrun; see docs/durable.md, \"Elastic runs\")")
    min_nodes: Int | None = Field(None, ge=1, le=MAX_NODES, exclude=True)  # num_nodes.min (gtrain.spec.elastic)
    resources: Resources = Field(default_factory=lambda: Resources(), description="see [resources](#resources)")
    job: Job | None = Field(None, description="see [job](#job); `up` does without it, `launch` and `run` need it")
    policies: Policies = Field(default_factory=lambda: Policies(), description="see [policies](#policies)")
    notify: NotifySpec | None = Field(None, description="`{on, webhook, email, command}`: messages when the job "
                                      "ends, is preempted or recovered, nears its budget; see docs/notify.md")
    energy: EnergySpec | None = Field(None, description="`{grid_gco2_per_kwh, grid_source}`: the carbon "
                                      "estimate's grid intensity; see docs/energy.md")
    volumes: Annotated[list[Volume] | None, AfterValidator(check_list)] = Field(
        None, description="storage that outlives the cluster: `{name, size_gb, mount, type, path, read_only}`; "
        "see [volumes](#volumes) and docs/volumes.md")
    # The top-level mapping named like the chosen provider (`ssh:`, `aws:`, ...); its schema belongs to the
    # provider module, which validates it when it plans `up`. Read with section(name) or .ssh / .aws / ...
    _sections: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)

    # Where the spec came from; relative job.workdir is resolved against it. Not part of the YAML.
    base_dir: str | None = Field(None, exclude=True)

    @model_validator(mode="wrap")
    @classmethod
    def _provider_sections(cls, data: Any, handler: ModelWrapValidatorHandler[ClusterSpec]) -> ClusterSpec:
        sections: dict[str, Any] = {}
        if isinstance(data, dict):
            names = [k for k in data if isinstance(k, str) and k not in cls.model_fields and provider_known(k)]
            sections = {k: data[k] for k in names if data[k] is not None}
            data = {k: v for k, v in data.items() if k not in names}
        provider_given = isinstance(data, dict) and data.get("provider") is not None
        spec = handler(default_provider(elastic.split(data)) if isinstance(data, dict) else data)
        settle(spec, provider_given)
        elastic.check(spec)
        torchft.check(spec)
        volumes.check(spec)
        queue.check(spec)
        allowed = candidate_providers(spec) or [spec.provider]
        for name, section in sections.items():
            if name not in allowed:
                if spec.resources.any_of:
                    raise ValueError(f"section '{name}:' is given but no resources.any_of candidate uses "
                                     f"{name!r} (candidates: {', '.join(sorted(set(allowed)))})")
                raise ValueError(f"section '{name}:' is given but provider is {spec.provider!r}")
            if not isinstance(section, dict):
                raise ValueError(f"section '{name}:' must be a mapping of fields, got {type(section).__name__}")
        if sections:
            spec._sections = sections
        return spec

    @field_validator("provider")
    @classmethod
    def _provider(cls, v: str) -> str:
        if not provider_known(v):
            choices = _provider_choices()
            expected = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
            raise PydanticCustomError("literal_error", "not a provider", {"expected": expected})
        return v

    @property
    def elastic(self) -> bool:
        """``num_nodes: {min, max}`` with min < max: the run trains on any count in between."""
        return self.min_nodes is not None and self.min_nodes < self.num_nodes

    def section(self, name: str) -> dict[str, Any] | None:
        """The spec's section for provider ``name`` (``ssh:``), or None when it has none."""
        return self._sections.get(name)

    @property
    def ssh(self) -> dict[str, Any] | None:
        return self.section("ssh")

    @property
    def aws(self) -> dict[str, Any] | None:
        return self.section("aws")

    @property
    def gcp(self) -> dict[str, Any] | None:
        return self.section("gcp")

    @property
    def slurm(self) -> dict[str, Any] | None:
        return self.section("slurm")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                "must be 1-40 characters of a-z, 0-9 and '-', start with a letter and not end with '-' "
                "(e.g. demo-1)"
            )
        return v

    def workdir_path(self) -> Path:
        if self.job is None:
            raise ConfigError("the spec has no job section", hint="add job: {run: train.py}", field="job")
        p = Path(os.path.expanduser(self.job.workdir))
        if not p.is_absolute():
            p = Path(self.base_dir or ".") / p
        return p.resolve()

    def to_yaml_dict(self) -> dict[str, Any]:
        out = self.model_dump(mode="json", exclude_none=True, exclude={"base_dir"})
        out.update(to_jsonable_python(self._sections))
        if self.min_nodes is not None:
            out["num_nodes"] = {"min": self.min_nodes, "max": self.num_nodes}
        if self.resources.any_of:  # every candidate names its provider (and, not given, its own num_nodes)
            drop = {"provider"} | ({"num_nodes"} - self.model_fields_set)
            out = {k: v for k, v in out.items() if k not in drop}
        return out


# ---------------------------------------------------------------------------------------------------
# Loading


def translate_validation_error(err: ValidationError, model: type[BaseModel] | None = None) -> ConfigError:
    return translate.translate(err, model or ClusterSpec, ClusterSpec)


def parse_spec(data: Any, *, base_dir: str | None = None, source: str = "spec") -> ClusterSpec:
    if data is None:
        raise ConfigError(f"{source} is empty", hint="a spec needs at least `name:`", field="spec")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of fields, got {type(data).__name__}",
            hint="start with `name: demo`", field="spec",
        )
    check_keys(data, source)
    try:
        spec = ClusterSpec.model_validate({**data, "base_dir": base_dir})
    except ValidationError as e:
        raise translate_validation_error(e) from None
    return spec


def load_spec(path: str | os.PathLike[str], *, name: str | None = None,
              edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> ClusterSpec:
    """Read and validate a YAML spec file. ``name`` overrides ``name:`` (``--name``); ``edit`` changes the
    mapping read before it is validated (the command line's overrides)."""
    from gtrain.spec import loader as specyaml

    p = Path(path)
    if p.is_dir():
        inside = next((str(p / n) for n in ("spec.yaml", "spec.yml") if (p / n).is_file()), None)
        raise ConfigError(f"spec file {str(p)!r} is a directory, not a spec file",
                          hint=f"did you mean {inside}?" if inside else "pass the path to a YAML spec file",
                          field="SPEC")
    check_spec_file(p)
    if not p.is_file():
        raise ConfigError(f"spec file {str(p)!r} does not exist", hint="pass the path to a YAML spec", field="SPEC")
    try:
        with p.open("rb") as f:
            raw = f.read(specyaml.MAX_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read spec file {str(p)!r}: {e}", field="SPEC") from None
    data = specyaml.load(text, str(p))
    if name is not None and isinstance(data, dict):
        data = {**data, "name": name}
    if edit is not None and isinstance(data, dict):
        data = edit(data)
    return parse_spec(data, base_dir=str(p.parent.resolve()), source=str(p))
