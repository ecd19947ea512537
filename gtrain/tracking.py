"""``job.tracking`` (docs/tracking.md): what W&B, MLflow and TensorBoard read, set on every rank, so that a
training script that calls ``wandb.init()`` / ``mlflow.start_run()`` with no arguments lands in the right
place. gtrain imports no tracker: these are environment variables and links.

- W&B: ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_RUN_GROUP`` = the job id, ``WANDB_RUN_ID`` = an id made
  from the run key (``<cluster>/<run_id>``, the same across recoveries and relaunches of one run) with
  ``WANDB_RESUME=allow``, so a recovered job continues the same W&B run; ``WANDB_MODE`` when given. The API key
  goes as a secret (stdin, never on disk) when it is set locally.
- MLflow: ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_NAME`` = the job id, and
  ``MLFLOW_TRACKING_TOKEN`` as a secret. (A parent MLflow run made per job, and its ``MLFLOW_RUN_ID``, are
  not made yet: docs/tracking.md.)
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtrain.spec import Job


def run_id(run_key: str) -> str:
    """A W&B run id stable for one run key: ``[a-z0-9-]``, at most 64 characters (W&B's rule for ids)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_key.lower()).strip("-")[:48]
    return f"{slug}-{hashlib.sha256(run_key.encode()).hexdigest()[:12]}"


def env(job: Job, job_id: str, run_key: str) -> dict[str, str]:
    """The variables ``job.tracking`` sets on every rank (a name the user set in ``job.env`` wins)."""
    t = job.tracking
    out: dict[str, str] = {}
    if t is None:
        return out
    if t.wandb is not None:
        out.update({"WANDB_PROJECT": t.wandb.project, "WANDB_RUN_GROUP": job_id, "WANDB_RUN_ID": run_id(run_key),
                    "WANDB_RESUME": "allow", "WANDB_NAME": job_id})
        if t.wandb.entity:
            out["WANDB_ENTITY"] = t.wandb.entity
        if t.wandb.mode:
            out["WANDB_MODE"] = t.wandb.mode
    if t.mlflow is not None:
        out.update({"MLFLOW_TRACKING_URI": t.mlflow.tracking_uri, "MLFLOW_EXPERIMENT_NAME": t.mlflow.experiment,
                    "MLFLOW_RUN_NAME": job_id})
    return {k: v for k, v in out.items() if k not in job.env}


def secret_names(job: Job, environ: dict[str, str] | None = None) -> list[str]:
    """The trackers' keys sent as secrets: those set in this environment and not already in ``job.secrets``."""
    e = os.environ if environ is None else environ
    names = job.tracking.secrets() if job.tracking else []
    return [n for n in names if n in e and n not in job.secrets]


def links(job: Job, run_key: str) -> dict[str, str]:
    """Where the tracked runs are seen (status, report, notifications)."""
    t = job.tracking
    out: dict[str, str] = {}
    if t is None:
        return out
    if t.wandb is not None and t.wandb.entity:
        out["W&B"] = f"https://wandb.ai/{t.wandb.entity}/{t.wandb.project}/runs/{run_id(run_key)}"
    if t.mlflow is not None and t.mlflow.tracking_uri.startswith("http"):
        out["MLflow"] = f"{t.mlflow.tracking_uri.rstrip('/')}/#/experiments (experiment {t.mlflow.experiment})"
    return out
