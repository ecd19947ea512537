"""Notifications (docs/notify.md): sending one event to the spec's ``notify:`` targets, and claiming it first.
Who sends what, and when, is the run's layer's (:mod:`gtrain.runs.notify`).

One event, one message: before sending, the sender claims the event with a marker file in the job's run archive
(``runs/<cluster-id>/jobs/<job-id>/notify/<key>.json``, created exclusively); a second follower of the same job
finds it and sends nothing. The marker then records each target's outcome (never a secret)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.notify import deliver

if TYPE_CHECKING:
    from gtrain.spec.notify import NotifySpec

__all__ = ["claim", "marker_dir", "send"]


def send(spec: NotifySpec, ev: dict[str, Any], environ: dict[str, str] | None = None) -> list[deliver.Outcome]:
    """Every configured target, each retried as :mod:`~gtrain.notify.deliver` says; never raises."""
    env = os.environ if environ is None else environ
    out: list[deliver.Outcome] = []
    if spec.webhook is not None:
        url = env.get(spec.webhook.url_secret)
        out.append(deliver.webhook(url, spec.webhook.format, ev) if url else
                   deliver.Outcome(f"webhook ({spec.webhook.format})", False, 0,
                                   f"notify.webhook.url_secret: {spec.webhook.url_secret} is not set here"))
    if spec.email is not None:
        smtp = env.get(spec.email.smtp_secret)
        out.append(deliver.email(smtp, spec.email.sender, spec.email.to, ev) if smtp else
                   deliver.Outcome("email", False, 0,
                                   f"notify.email.smtp_secret: {spec.email.smtp_secret} is not set here"))
    if spec.command:
        out.append(deliver.command(spec.command, ev))
    return out


def marker_dir(home: Path, cluster_id: str, job_id: str) -> Path:
    from gtrain.state.runs import job_dir

    return job_dir(home, cluster_id, job_id) / "notify"


def claim(home: Path, cluster_id: str, job_id: str, key: str) -> Path | None:
    """The marker of ``key`` for this sender, or None when another sender has it already."""
    d = marker_dir(home, cluster_id, job_id)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{key}.json"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"claimed_at": time.time(), "pid": os.getpid()}, f)
    return path
