"""The spec's part of durable runs: ``job.checkpoint_store`` (checked here) and ``policies.recovery``."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

STORE_RE = re.compile(r"^(s3|gs|az)://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/[^\x00-\x1f\\]*)?$")

#: what a recovery can be for: a provider took a spot/preemptible node, a node (or its agent) died
CAUSES = ("preemption", "node_failure")


def _not_bool(v: object) -> object:
    if isinstance(v, bool):
        raise PydanticCustomError("bool_not_number", "is a boolean, not a number")
    return v


def _on_list(v: object) -> object:
    """``on: [preemption, node_failure, {exit_codes: [137]}]`` or a mapping ``{causes.., exit_codes: [..]}``."""
    if isinstance(v, list):
        causes, codes = [], []
        for item in v:
            if isinstance(item, dict) and set(item) == {"exit_codes"}:
                codes.extend(item["exit_codes"] if isinstance(item["exit_codes"], list) else [item["exit_codes"]])
            else:
                causes.append(item)
        return {"causes": causes, "exit_codes": codes}
    return v


Cause = Literal["preemption", "node_failure"]


def _all_causes() -> list[Cause]:
    return ["preemption", "node_failure"]


class RecoveryOn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    causes: list[Cause] = Field(default_factory=_all_causes)
    exit_codes: list[Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=255)]] = Field(default_factory=list)


class Recovery(BaseModel):
    """``policies.recovery``: what whoever waits on the job (``run``, ``launch --wait``, ``logs -f``,
    ``watch``) does when a node is lost. See docs/durable.md."""

    model_config = ConfigDict(extra="forbid")
    max_restarts: Annotated[int, BeforeValidator(_not_bool)] = Field(
        0, ge=0, le=1000, description="recoveries across the run; 0 = off")
    on: Annotated[RecoveryOn, BeforeValidator(_on_list)] = Field(
        default_factory=RecoveryOn, description="`[preemption, node_failure]` (default both); add "
        "`{exit_codes: [N, ...]}` to also recover from those exit codes of the job (137, a SIGKILL such as "
        "the OOM killer's, counts as node_failure)")
    backoff_s: Annotated[float, BeforeValidator(_not_bool)] = Field(
        30.0, ge=0, le=3600, description="wait before a recovery, doubled after each one that made no progress")
    hang_minutes: Annotated[float | None, BeforeValidator(_not_bool)] = Field(
        None, gt=0, le=10080, allow_inf_nan=False, description="a hang: no rank made progress (a metrics step, "
        "else a line in its log) for this long while every node is alive; each rank's Python stacks go into its "
        "log, then the job is recovered (kind `hang`); fractions allowed; default: off")

    def to_info(self) -> dict[str, object]:
        return {"max_restarts": self.max_restarts, "on": list(self.on.causes), "exit_codes": list(self.on.exit_codes),
                "backoff_s": self.backoff_s, **({"hang_minutes": self.hang_minutes} if self.hang_minutes else {})}


class CheckpointTuning(BaseModel):
    """``job.checkpoint_tuning``: the node uploader's and notice watcher's timings (exported to them as
    ``GTRAIN_CHECKPOINT_SETTLE_S``, ``GTRAIN_CHECKPOINT_POLL_S``, ``GTRAIN_NOTICE_POLL_S``,
    ``GTRAIN_CHECKPOINT_RESTORE``; ``job.env`` may not set ``GTRAIN_*``)."""

    model_config = ConfigDict(extra="forbid")
    settle_s: Annotated[float, BeforeValidator(_not_bool)] = Field(10.0, gt=0, le=3600)
    poll_s: Annotated[float, BeforeValidator(_not_bool)] = Field(2.0, gt=0, le=600)
    notice_poll_s: Annotated[float, BeforeValidator(_not_bool)] = Field(5.0, gt=0, le=600)
    #: what a node restores of a sharded step (docs/durable.md, "Sharded checkpoints"): ``whole``, every file;
    #: ``subset``, for a DCP step written by the same shape, only the metadata and the files its ranks read
    restore: Literal["whole", "subset"] = "whole"

    def to_env(self) -> dict[str, str]:
        return {"GTRAIN_CHECKPOINT_SETTLE_S": f"{self.settle_s:g}", "GTRAIN_CHECKPOINT_POLL_S": f"{self.poll_s:g}",
                "GTRAIN_NOTICE_POLL_S": f"{self.notice_poll_s:g}", "GTRAIN_CHECKPOINT_RESTORE": self.restore}


def check_store(v: str | None) -> str | None:
    if v is None:
        return v
    v = v.rstrip("/")
    if not STORE_RE.match(v) or "/../" in f"{v}/" or "//" in v.split("://", 1)[1]:
        raise ValueError("must be s3://bucket[/prefix], gs://bucket[/prefix] or az://container[/prefix]")
    return v


RUN_ID_RE = re.compile(r"^(?:[a-z][a-z0-9-]{0,38}[a-z0-9]/|[a-z]/)?[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def check_run_id(v: str | None) -> str | None:
    if v is not None and not RUN_ID_RE.match(v):
        raise ValueError("must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
                         "(e.g. gpt2-small), or CLUSTER/RUN_ID: that run of another cluster (e.g. big/gpt2-small)")
    return v


def default_run_id(run: str, checkpoint_dir: str) -> str:
    """``job.run_id`` when the spec has none: ``run-`` and the first 12 hex digits of the sha256 of ``job.run``
    (the script and its arguments, as written) and ``job.checkpoint_dir``, so every launch of the same spec is
    the same run, and a changed command line is a new one."""
    import hashlib

    return "run-" + hashlib.sha256(f"{run}\0{checkpoint_dir}".encode()).hexdigest()[:12]


def run_key(cluster: str, run_id: str | None, run: str, checkpoint_dir: str) -> str:
    """The run's folder in the checkpoint store: ``<cluster>/<run_id>``. Checkpoints belong to the run, not to
    one launch (job): a relaunch resumes from them; ``--fresh`` starts the run over. A ``run_id`` of the form
    ``<other-cluster>/<id>`` is that cluster's run: a cluster of another shape (or name) resumes and continues it."""
    if run_id and "/" in run_id:
        return run_id
    return f"{cluster}/{run_id or default_run_id(run, checkpoint_dir)}"
