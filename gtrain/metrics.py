"""Log training metrics from the job, for `gtrain plot` and `gtrain report`.

    import gtrain.metrics
    gtrain.metrics.log(step=step, loss=loss.item(), lr=sched.get_last_lr()[0])

Progress (`gtrain status`, `top`, the report, notifications): the ``step`` of rank 0's records gives the step and
the rate; a total gives the ETA and the percent done: ``log(step=..., total_steps=N)`` once (or on every call),
:func:`total_steps`, or ``GTRAIN_TOTAL_STEPS`` in the job's environment (``job.env``). It is written as
``"total_steps": N`` in the record (again every :data:`TOTAL_EVERY` records, so the newest lines always name it).

Each call appends one JSON object to ``$GTRAIN_METRICS_FILE`` (gtrain sets it on every rank:
``JOB/metrics/rank-R.jsonl``): ``{"t": <epoch seconds>, "step": 12, "rank": 0, "loss": 0.53, ...}``. Any
language can do the same: one JSON object per line, numbers for values, ``step`` and ``t`` optional.

This module is the one piece of gtrain a job imports on a node: standard library only, no other gtrain
import, and it works when it is the only gtrain file there. Outside a gtrain job (no ``$GTRAIN_METRICS_FILE``)
:func:`log` does nothing, so a script runs unchanged on a laptop. It never raises for a value it cannot
store: non-numbers are dropped, NaN and infinities are written as ``null``.

Forwarding (``job.tracking.forward_metrics``, docs/tracking.md): gtrain sets ``$GTRAIN_METRICS_FORWARD``
(``mlflow``, ``wandb``) and rank 0's records also go to the job's MLflow run (``runs/log-batch`` of the tracking
server's REST API, from a background thread, drained at exit and by :func:`flush`) and to ``wandb.log`` when
the script started a W&B run. A tracker that fails never stops training.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import queue
import sys
import threading
import time
import urllib.request
from typing import IO, Any

__all__ = ["log", "flush", "metrics_file", "total_steps"]

ENV = "GTRAIN_METRICS_FILE"
TOTAL_ENV = "GTRAIN_TOTAL_STEPS"
#: the total is written again after this many records (readers look at a file's newest lines)
TOTAL_EVERY = 200

_lock = threading.Lock()
_state: dict[str, IO[str] | str] = {}
#: the total steps hint: "total" (None: unknown) and how many records ago it was written ("since")
_total: dict[str, float | int | None] = {}


def metrics_file() -> str | None:
    """The file this process logs to, or None outside a gtrain job."""
    return os.environ.get(ENV) or None


def _number(value: object) -> float | int | None | bool:
    """A JSON-safe number for ``value``, None for NaN/inf; False means: not a number, drop it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        f = float(value)  # type: ignore[arg-type]  # floats, numpy scalars, 0-d tensors
    except (TypeError, ValueError):
        return False
    return f if math.isfinite(f) else None


def _handle(path: str) -> IO[str]:
    f = _state.get("file")
    if not isinstance(f, str) and f is not None and _state.get("path") == path:
        return f
    if f is not None and not isinstance(f, str):
        f.close()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    new = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - kept open across calls
    _state["file"], _state["path"] = new, path
    return new


def _positive(value: object) -> float | int | None:
    n = _number(value)
    return n if n is not False and n is not None and n > 0 else None


def _total_for_record(given: object) -> float | int | None:
    """The total to write in this record: one given now (kept for the records after), else the kept one (or
    ``$GTRAIN_TOTAL_STEPS``'s) on the process's first record and every :data:`TOTAL_EVERY` records after."""
    if given is not None and (n := _positive(given)) is not None:
        _total.update(total=n, since=0)
        return n
    if "total" not in _total:
        _total["total"] = _positive(os.environ.get(TOTAL_ENV, "").strip() or None)
    since = int(_total.get("since") or 0) + 1
    if _total["total"] is None:
        return None
    if "since" in _total and since < TOTAL_EVERY:
        _total["since"] = since
        return None
    _total["since"] = 0
    return _total["total"]


def total_steps(n: int | float) -> None:
    """Say how many steps the run takes in all (for the ETA and the percent done); written at once, and kept
    for this process's later records. ``log(step=..., total_steps=n)`` does the same."""
    if _positive(n) is None:
        return
    log(total_steps=n)


def log(step: int | float | None = None, *, total_steps: int | float | None = None, **scalars: object) -> None:
    """Append one record: ``step`` (optional) and named scalar values, stamped with the time and the rank;
    ``total_steps``: the run's total (the ETA), kept for the records after."""
    path = metrics_file()
    if path is None:
        return
    rec: dict[str, object] = {"t": round(time.time(), 3)}
    if step is not None:
        s = _number(step)
        if s is not False and s is not None:
            rec["step"] = s
    rank = os.environ.get("RANK")
    if rank is not None and rank.isdigit():
        rec["rank"] = int(rank)
    with _lock:
        total = _total_for_record(total_steps)
    if total is not None:
        rec["total_steps"] = total
    for key, value in scalars.items():
        if key in ("t", "rank", "total_steps"):
            continue
        v = _number(value)
        if v is not False:
            rec[key] = v
    if os.environ.get("GTRAIN_METRICS_FORWARD") and (rank is None or rank == "0"):
        _forward(rec)
    line = json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n"
    with _lock:
        try:
            _handle(path).write(line)
        except OSError:  # a full or vanished disk must not crash training
            _state.pop("file", None)


def flush() -> None:
    """Flush the file (each line is already written through; this is for the paranoid) and send what waits
    for the trackers."""
    _drain()
    with _lock:
        f = _state.get("file")
        if f is not None and not isinstance(f, str):
            f.flush()


# ---- forwarding to trackers (rank 0) ----------------------------------------------------------------------

_outbox: queue.Queue[dict[str, Any]] = queue.Queue()
_sender: dict[str, threading.Thread] = {}
_send_lock = threading.Lock()


def _forward(rec: dict[str, object]) -> None:
    targets = os.environ.get("GTRAIN_METRICS_FORWARD", "").split(",")
    values = {k: v for k, v in rec.items() if k not in ("t", "step", "rank", "total_steps")
              and isinstance(v, int | float)}
    step = rec.get("step")
    if "wandb" in targets:
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            try:
                wandb.log(values, step=int(step) if isinstance(step, int | float) else None)
            except Exception:  # noqa: BLE001 -- a tracker never stops training
                pass
    if "mlflow" in targets and os.environ.get("MLFLOW_RUN_ID") and os.environ.get("MLFLOW_TRACKING_URI"):
        ts = int(float(rec["t"]) * 1000)  # type: ignore[arg-type]
        for k, v in values.items():
            _outbox.put({"key": k, "value": float(v), "timestamp": ts,
                         "step": int(step) if isinstance(step, int | float) else 0})
        if "t" not in _sender:
            _sender["t"] = threading.Thread(target=_send_loop, daemon=True, name="gtrain-metrics-forward")
            _sender["t"].start()
            atexit.register(_drain)


def _send_loop() -> None:
    while True:
        time.sleep(1.0)
        _drain()


def _drain() -> None:
    """Send what waits (log-batch takes at most 1000 metrics a call)."""
    with _send_lock:
        while not _outbox.empty():
            batch: list[dict[str, Any]] = []
            while len(batch) < 1000:
                try:
                    batch.append(_outbox.get_nowait())
                except queue.Empty:
                    break
            uri = os.environ.get("MLFLOW_TRACKING_URI", "").rstrip("/")
            body = json.dumps({"run_id": os.environ.get("MLFLOW_RUN_ID"), "metrics": batch}).encode()
            req = urllib.request.Request(f"{uri}/api/2.0/mlflow/runs/log-batch", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            if tok := os.environ.get("MLFLOW_TRACKING_TOKEN"):
                req.add_header("Authorization", f"Bearer {tok}")
            try:
                urllib.request.urlopen(req, timeout=10).close()  # noqa: S310 -- the job's tracking server
            except Exception:  # noqa: BLE001 -- a tracker never stops training; these points stay in the file
                return
