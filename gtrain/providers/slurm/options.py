"""The spec's ``slurm:`` section: its model, and its errors as ``slurm.<field>`` ConfigErrors (exit 2)."""

from __future__ import annotations

import math
import re
import shlex
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gtrain.errors import ConfigError

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec

_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")
_NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]*"  # no leading '-', no '$(...)', no spaces or newlines
_LOGIN_RE = re.compile(rf"^(?:(?P<user>{_NAME})@)?(?P<host>\[[0-9a-fA-F:.]+\]|{_NAME})(?::(?P<port>\d+))?$")
#: #SBATCH options gtrain writes itself: extra_sbatch may not give them again
OWNED = ("job-name", "nodes", "N", "ntasks-per-node", "output", "o", "error", "e", "open-mode", "partition", "p",
         "account", "A", "qos", "q", "time", "t", "constraint", "C", "exclusive", "requeue", "no-requeue",
         "signal", "gpus-per-node", "gres", "comment", "chdir", "D", "wrap", "parsable")


class SlurmOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    login: str | None = Field(None, description="null: sbatch/squeue run on this machine; else USER@HOST[:PORT] "
                                                "of the login node, reached over SSH")
    login_identity_file: str | None = Field(None, description="SSH key for the login node")
    login_host_key: str | None = Field(None, description="the login node's host key line (pinned); default: "
                                                         "trusted on first use, fingerprint printed")
    partition: str | None = Field(None, description="--partition (default: the cluster's default partition)")
    account: str | None = Field(None, description="--account")
    qos: str | None = Field(None, description="--qos")
    time: str | None = Field(None, description="--time (D-HH:MM:SS, HH:MM:SS, MM); default from policies.max_hours")
    constraint: str | None = Field(None, description="--constraint (node features)")
    exclusive: bool = Field(True, description="--exclusive: whole nodes")
    gres_style: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node", description="how GPUs are asked: --gpus-per-node=N, or --gres=gpu:<type>:N")
    extra_sbatch: list[str] = Field(default_factory=list, description="more #SBATCH options (`--mem=0`); not "
                                                                        "those gtrain writes itself")
    shared_dir: str | None = Field(None, description="a folder every node sees (default: the login user's "
                                                     "home); gtrain's files live in <shared_dir>/gtrain/<cluster>")
    conf: str | None = Field(None, description="SLURM_CONF for every Slurm command gtrain runs (default: the "
                                               "login side's own)")
    python: str = Field("python3", description="python on the nodes (job.python overrides it)")
    requeue: bool = Field(True, description="--requeue: a preempted or failed-node job goes back in the queue")
    signal: str = Field("B:USR1@120", description="--signal: the batch shell gets USR1 120 s before the time "
                                                  "limit and writes $GTRAIN_PREEMPT_FILE")
    keep_files: bool = Field(False, description="`down` leaves <shared_dir>/gtrain/<cluster> (workdir, job "
                                                "folders, logs) in place")
    rate_per_gpu_hour: float = Field(0.0, ge=0, description="$ per GPU-hour, for the cost report")
    hold: bool = Field(False, description="`up` takes an allocation of num_nodes (salloc --no-shell) and holds it "
                                          "until `down`; each launch runs as a step in it (the held time is "
                                          "charged)")

    @field_validator("rate_per_gpu_hour", mode="before")
    @classmethod
    def _rate(cls, v: Any) -> Any:
        if isinstance(v, bool) or isinstance(v, float) and not math.isfinite(v):
            raise ValueError("is not a finite number of dollars")
        return v

    @field_validator("login_identity_file", "login_host_key", "partition", "account", "qos", "constraint",
                     "shared_dir", "conf", "python")
    @classmethod
    def _one_line(cls, v: str | None) -> str | None:
        if v is not None and any(c < " " or c == "\x7f" for c in v):
            raise ValueError("holds a control character (a newline, NUL, ...)")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and v not in ("UNLIMITED", "INFINITE") and not _TIME_RE.match(v):
            raise ValueError("is not a Slurm time (D-HH:MM:SS, HH:MM:SS, MM:SS or MM), e.g. \"24:00:00\"")
        return v

    @field_validator("login")
    @classmethod
    def _login(cls, v: str | None) -> str | None:
        if v is not None and not _LOGIN_RE.match(v):
            raise ValueError("is not USER@HOST or USER@HOST:PORT (letters, digits, '.', '_', '-', not starting "
                             "with '-')")
        return v

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        if not re.match(r"^(?:[RB]+:)?[A-Z0-9]+(?:@\d+)?$", v):
            raise ValueError("is not a --signal value like B:USR1@120")
        return v

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for line in v:
            opt = line.strip()
            if opt.startswith("#SBATCH"):
                opt = opt[len("#SBATCH"):].strip()
            name = opt.lstrip("-").split("=", 1)[0].split(" ", 1)[0]
            if not opt.startswith("-") or not name or any(c < " " or c == "\x7f" for c in opt):
                raise ValueError(f"{line!r} is not one sbatch option on one line (e.g. --mem=0)")
            if name in OWNED:
                raise ValueError(f"{line!r}: gtrain writes --{name} itself (use the slurm.* field for it)")
        return v

    def login_parts(self) -> tuple[str | None, str, int]:
        m = _LOGIN_RE.match(self.login or "")
        assert m is not None
        return m.group("user"), m.group("host").strip("[]"), int(m.group("port") or 22)

    def time_limit(self, max_hours: float | None) -> str | None:
        """--time: the spec's, else policies.max_hours in minutes (rounded up), else none (the partition's)."""
        if self.time:
            return self.time
        if max_hours:
            import math

            return str(max(1, math.ceil(max_hours * 60)))
        return None


def parse_options(spec: ClusterSpec) -> SlurmOptions:
    from gtrain.spec import translate_validation_error

    raw: dict[str, Any] | None = getattr(spec, "slurm", None)
    try:
        opts = SlurmOptions.model_validate(raw or {})
    except ValidationError as e:
        err = translate_validation_error(e, SlurmOptions)
        msg = err.message.replace("invalid spec: ", "invalid spec: slurm.").replace("; ", "; slurm.")
        raise ConfigError(msg, hint=err.hint, field=f"slurm.{err.field}") from None
    if spec.resources.use_spot:
        raise ConfigError("resources.use_spot: true — a Slurm cluster has no spot market",
                          hint="remove use_spot (preemption is the partition's/QOS's business)",
                          field="resources.use_spot")
    if spec.job is not None and spec.job.data:
        raise ConfigError("job.data: not supported on provider slurm yet",
                          hint="put the data under slurm.shared_dir and point the job at it", field="job.data")
    return opts


def shared_where(opts: SlurmOptions) -> str:
    """``slurm.shared_dir`` as a shell word (``~`` is the login user's home)."""
    shared = opts.shared_dir or "~"
    rest = shared[1:].lstrip("/") if shared.startswith("~") else None
    return f'"$HOME"/{shlex.quote(rest)}' if rest else '"$HOME"' if rest is not None else shlex.quote(shared)
