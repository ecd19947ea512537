"""The YAML spec: pydantic models of cluster, resources, job and policies.

Every validation failure becomes one :class:`~gtrain.errors.ConfigError` line that names the field path,
the bad value and the fix. Relative paths in a spec file (``job.workdir``) are resolved against the
directory of the spec file, so ``gtrain run examples/quickstart/spec.yaml`` works from anywhere.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gtrain.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$|^[a-z]$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ACCEL_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]*)(?::(\d+))?$")
# Names gtrain sets itself on every rank; a user env var may not shadow them.
RESERVED_ENV = {
    "GTRAIN_NODE_RANK", "GTRAIN_NUM_NODES", "GTRAIN_NODE_IPS", "GTRAIN_MASTER_ADDR", "GTRAIN_MASTER_PORT",
    "GTRAIN_JOB_ID", "GTRAIN_CHECKPOINT_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
}
PROVIDERS = ("local", "ssh", "aws", "gcp", "slurm")
MAX_NODES = 512


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_assignment=True)


class Resources(_Model):
    accelerators: str | None = Field(None, description="GPU model and count per node, e.g. A100:8")
    instance_type: str | None = None
    use_spot: bool = False
    region: str | None = None
    regions: list[str] | None = None
    zones: list[str] | None = None
    disk_gb: int = Field(100, ge=10, le=65536)
    image_id: str | None = None

    @field_validator("accelerators")
    @classmethod
    def _accel(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = ACCEL_RE.match(v)
        if not m:
            raise ValueError("must look like GPU:COUNT, e.g. A100:8 or H100:1")
        count = int(m.group(2) or 1)
        if not 1 <= count <= 16:
            raise ValueError("GPU count must be between 1 and 16 per node")
        return f"{m.group(1).upper() if m.group(1).islower() else m.group(1)}:{count}"

    @property
    def gpu_name(self) -> str | None:
        return self.accelerators.split(":")[0] if self.accelerators else None

    @property
    def gpus_per_node(self) -> int:
        return int(self.accelerators.split(":")[1]) if self.accelerators else 0

    def region_list(self) -> list[str]:
        if self.regions:
            return list(self.regions)
        return [self.region] if self.region else []


class DataEntry(_Model):
    """A dataset the nodes download at launch, with their own credentials (an instance role on a cloud)."""

    src: str = Field(..., description="s3://bucket/prefix or gs://bucket/prefix")
    dst: str = Field(..., description="folder inside the workdir")
    delete: bool = Field(False, description="mirror: remove files under dst that src lacks")

    @field_validator("src")
    @classmethod
    def _src(cls, v: str) -> str:
        if not re.match(r"^(s3|gs|az)://[a-z0-9][a-z0-9._-]{1,221}(/.*)?$", v):
            raise ValueError("must be s3://bucket[/prefix], gs://bucket[/prefix] or az://container[/prefix]")
        return v

    @field_validator("dst")
    @classmethod
    def _dst(cls, v: str) -> str:
        p = Path(v)
        if not v or p.is_absolute() or ".." in p.parts:
            raise ValueError("must be a folder inside the workdir, relative, without '..' (e.g. data)")
        return p.as_posix()


class Job(_Model):
    workdir: str = "."
    setup: str | None = None
    run: str = Field(..., min_length=1, description="python script and its arguments, started by torchrun")
    nproc_per_node: int | None = Field(None, ge=1, le=64)
    env: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list, description="names of local env vars passed to every rank")
    checkpoint_dir: str = "checkpoints"
    data: list[DataEntry] = Field(default_factory=list, description="datasets each node downloads at launch")
    max_restarts: int = Field(0, ge=0, le=100)
    python: str | None = Field(None, description="interpreter on the nodes (default: python3; local: this one)")

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out: dict[Any, Any] = {}
        for k, val in v.items():
            if isinstance(val, bool):
                val = "true" if val else "false"
            elif isinstance(val, int | float):
                val = str(val)
            out[k] = val
        return out

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name (letters, digits, _)")
            if k in RESERVED_ENV or k.startswith("GTRAIN_"):
                raise ValueError(f"{k!r} is set by gtrain/torchrun on every rank (GTRAIN_* is reserved); "
                                 "pick another name")
            if "\x00" in val:
                raise ValueError(f"value of {k!r} holds a NUL byte")
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        for k in v:
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
        return v

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
    idle_minutes: float | None = Field(None, gt=0)
    max_hours: float | None = Field(None, gt=0)
    max_cost_usd: float | None = Field(None, gt=0)


class ClusterSpec(_Model):
    name: str
    provider: Literal["local", "ssh", "aws", "gcp", "slurm"] = "local"
    num_nodes: int = Field(1, ge=1, le=MAX_NODES)
    resources: Resources = Field(default_factory=lambda: Resources())
    job: Job | None = None
    policies: Policies = Field(default_factory=lambda: Policies())
    # Provider-specific sections are kept as validated-later mappings so a provider module owns its schema.
    ssh: dict[str, Any] | None = None
    aws: dict[str, Any] | None = None
    gcp: dict[str, Any] | None = None
    slurm: dict[str, Any] | None = None

    # Where the spec came from; relative job.workdir is resolved against it. Not part of the YAML.
    base_dir: str | None = Field(None, exclude=True)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                "must be 1-40 characters of a-z, 0-9 and '-', start with a letter and not end with '-' "
                "(e.g. demo-1)"
            )
        return v

    @model_validator(mode="after")
    def _provider_section(self) -> ClusterSpec:
        for section in ("ssh", "aws", "gcp", "slurm"):
            if getattr(self, section) is not None and section != self.provider:
                raise ValueError(f"section '{section}:' is given but provider is {self.provider!r}")
        return self

    def workdir_path(self) -> Path:
        if self.job is None:
            raise ConfigError("the spec has no job section", hint="add job: {run: train.py}", field="job")
        p = Path(os.path.expanduser(self.job.workdir))
        if not p.is_absolute():
            p = Path(self.base_dir or ".") / p
        return p.resolve()

    def to_yaml_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True, exclude={"base_dir"})


# ---------------------------------------------------------------------------------------------------
# Loading and error translation


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "spec"


def _known_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            continue
        f = cur.model_fields.get(str(part))
        if f is None:
            return []
        ann = f.annotation
        args = getattr(ann, "__args__", ())
        cands = [a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)]
        cur = cands[0] if cands else None
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return [k for k in cur.model_fields if k != "base_dir"]
    return []


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def translate_validation_error(err: ValidationError, model: type[BaseModel] = ClusterSpec) -> ConfigError:
    lines: list[str] = []
    first_field: str | None = None
    hint: str | None = None
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        path = _loc(loc)
        first_field = first_field or path
        typ = e["type"]
        if typ == "extra_forbidden":
            known = _known_fields(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"known fields here: {', '.join(known)}"
            lines.append(f"{path}: unknown field — {fix}")
        elif typ == "missing":
            lines.append(f"{path}: required field is missing")
            hint = hint or "see docs/spec.md for every field"
        elif typ == "literal_error":
            expected = e.get("ctx", {}).get("expected", "")
            lines.append(f"{path}: {_short(e.get('input'))} is not one of {expected}")
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            lines.append(f"{path}: {_short(e.get('input'))} — {msg}")
    return ConfigError("invalid spec: " + "; ".join(lines), hint=hint, field=first_field)


def parse_spec(data: Any, *, base_dir: str | None = None, source: str = "spec") -> ClusterSpec:
    if data is None:
        raise ConfigError(f"{source} is empty", hint="a spec needs at least `name:`", field="spec")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of fields, got {type(data).__name__}",
            hint="start with `name: demo`", field="spec",
        )
    try:
        spec = ClusterSpec.model_validate({**data, "base_dir": base_dir})
    except ValidationError as e:
        raise translate_validation_error(e) from None
    return spec


def load_spec(path: str | os.PathLike[str], *, name: str | None = None) -> ClusterSpec:
    """Read and validate a YAML spec file. ``name`` overrides ``name:`` (``--name``)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"spec file {str(p)!r} does not exist", hint="pass the path to a YAML spec", field="SPEC")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read spec file {str(p)!r}: {e}", field="SPEC") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{p}: malformed YAML{where}: {problem}", hint="check indentation and quoting", field="SPEC"
        ) from None
    if name is not None and isinstance(data, dict):
        data = {**data, "name": name}
    return parse_spec(data, base_dir=str(p.parent.resolve()), source=str(p))
