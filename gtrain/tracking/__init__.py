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
    if t.tensorboard_dir:  # the ranks' working directory is the workdir; the archive keeps this folder
        out["GTRAIN_TENSORBOARD_DIR"] = t.tensorboard_dir
        out["TENSORBOARD_LOGDIR"] = t.tensorboard_dir
    forward = [n for n, on in (("mlflow", t.mlflow is not None), ("wandb", t.wandb is not None)) if on]
    if t.forward_metrics and forward:
        out["GTRAIN_METRICS_FORWARD"] = ",".join(forward)
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
        base = t.mlflow.tracking_uri.rstrip("/")
        rid, exp = job.env.get("MLFLOW_RUN_ID"), job.env.get("MLFLOW_EXPERIMENT_ID")
        out["MLflow"] = f"{base}/#/experiments/{exp}/runs/{rid}" if rid and exp else f"{base}/#/experiments"
    return out


# ---- MLflow: one parent run per job, over the tracking server's REST API (no mlflow import) ----------------
# REST API reference: https://mlflow.org/docs/latest/rest-api.html -- experiments/get-by-name (GET,
# ``experiment_name``), experiments/create (POST ``{name}``), runs/create (POST ``{experiment_id, run_name,
# start_time, tags}`` -> ``{run: {info: {run_id}}}``), runs/update (POST ``{run_id, status, end_time}``; status
# FINISHED | FAILED | KILLED), runs/log-batch (POST ``{run_id, metrics: [{key, value, timestamp, step}]}``).


def _mlflow_call(uri: str, path: str, body: dict[str, object] | None, token: str | None) -> dict[str, object]:
    import json
    import urllib.parse
    import urllib.request

    url = f"{uri.rstrip('/')}/api/2.0/mlflow/{path}"
    if body is None:
        req = urllib.request.Request(url, method="GET")
    else:
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=15) as resp:  # noqa: S310 -- the spec's tracking server
        return json.loads(resp.read() or b"{}")  # type: ignore[no-any-return]


def start_mlflow_run(job: Job, job_id: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The job's parent MLflow run, made on the tracking server before the job starts: ``{"MLFLOW_RUN_ID",
    "MLFLOW_EXPERIMENT_ID"}`` to set on every rank (kept with the job's spec, so a recovery keeps the same run),
    or ``{}`` (no MLflow server in the spec). A server that cannot be reached stops the launch (exit 2)."""
    import time
    import urllib.error
    import urllib.parse

    from gtrain.errors import ConfigError

    t = job.tracking
    if t is None or t.mlflow is None or not t.mlflow.tracking_uri.startswith(("http://", "https://")):
        return {}
    e = os.environ if environ is None else environ
    uri, name = t.mlflow.tracking_uri, t.mlflow.experiment
    token = e.get(t.mlflow.token_secret) if t.mlflow.token_secret else None
    try:
        try:
            got = _mlflow_call(uri, "experiments/get-by-name?" + urllib.parse.urlencode({"experiment_name": name}),
                               None, token)
            exp = str(got["experiment"]["experiment_id"])  # type: ignore[index]
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
            exp = str(_mlflow_call(uri, "experiments/create", {"name": name}, token)["experiment_id"])
        run = _mlflow_call(uri, "runs/create", {
            "experiment_id": exp, "run_name": job_id, "start_time": int(time.time() * 1000),
            "tags": [{"key": "gtrain.job_id", "value": job_id}, {"key": "mlflow.runName", "value": job_id}]}, token)
        rid = str(run["run"]["info"]["run_id"])  # type: ignore[index]
    except (urllib.error.URLError, OSError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"job.tracking.mlflow.tracking_uri: {uri} did not make the job's run "
                          f"({getattr(err, 'reason', err)})",
                          hint="start the tracking server, or fix the URI", field="job.tracking.mlflow") from None
    return {"MLFLOW_RUN_ID": rid, "MLFLOW_EXPERIMENT_ID": exp}


def finish_mlflow_run(spec_job: dict[str, object] | None, job_status: str) -> None:
    """Mark the job's parent run FINISHED / FAILED / KILLED when its follower sees it end (best effort)."""
    import contextlib

    env = (spec_job or {}).get("env") or {}
    tr = (spec_job or {}).get("tracking") or {}
    ml = tr.get("mlflow") if isinstance(tr, dict) else None
    rid = env.get("MLFLOW_RUN_ID") if isinstance(env, dict) else None
    if not (isinstance(ml, dict) and rid and str(ml.get("tracking_uri", "")).startswith("http")):
        return
    import time

    status = {"succeeded": "FINISHED", "cancelled": "KILLED"}.get(job_status, "FAILED")
    tok = os.environ.get(str(ml["token_secret"])) if ml.get("token_secret") else None
    with contextlib.suppress(Exception):
        _mlflow_call(str(ml["tracking_uri"]), "runs/update",
                     {"run_id": rid, "status": status, "end_time": int(time.time() * 1000)}, tok)
