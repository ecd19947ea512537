"""Notifications (docs/notify.md): the spec's ``notify:`` block, sent by whoever follows a job (`run`,
`launch --wait`, `logs -f`, `watch`) when it ends, is preempted, recovers, reaches 80% of its budget or is
stopped for idle GPUs.

One event, one message: before sending, the sender claims the event with a marker file in the job's run archive
(``runs/<cluster-id>/jobs/<job-id>/notify/<key>.json``, created exclusively); a second follower of the same job
finds it and sends nothing. The marker then records each target's outcome (never a secret)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain import redact
from gtrain.notify import deliver, message

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.notify.options import NotifySpec
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

__all__ = ["claim", "job_event", "notify_cluster", "notify_job", "send"]


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
    from gtrain.runlog.events import job_dir

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


def _last_lines(cluster: Cluster, job: JobRecord, ctx: Context, failed: dict[str, Any] | None) -> list[str]:
    if not failed:
        return []
    node, rank = int(failed.get("node") or 0), failed.get("rank")
    with contextlib.suppress(Exception):
        from gtrain.jobs.backend import LogLine

        lines = [it.text for it in ctx.backend(cluster).log_iter(job, node, rank, follow=False, tail=200)
                 if isinstance(it, LogLine)]
        return [ln for ln in lines if ln.strip()][-message.LAST_LINES:]
    with contextlib.suppress(Exception):  # the cluster is gone: what the archive kept
        from gtrain.runlog.archive import archived_log_lines

        return [it.text for it in archived_log_lines(ctx.store.home, cluster.id, job.id, nodes=[node],
                                                      rank=rank, tail=message.LAST_LINES)]
    return []


def job_event(cluster: Cluster, job: JobRecord, ctx: Context, kind: str, detail: str | None = None
              ) -> dict[str, Any]:
    """The event of ``kind`` for this job, with what the store knows now."""
    cost = None
    with contextlib.suppress(Exception):
        from gtrain.costs.report import cluster_cost

        cost = cluster_cost(ctx.store, cluster, ctx.provider(cluster.provider)).total_usd
    failed = job.info.get("failed_first") if kind == "failed" else None
    report = None
    with contextlib.suppress(Exception):
        from gtrain.runlog.events import job_dir

        html = job_dir(ctx.store.home, cluster.id, job.id) / "report.html"
        report = str(html) if html.is_file() else str(job_dir(ctx.store.home, cluster.id, job.id))
    end = job.ended_at or time.time()
    return message.event(kind, cluster=cluster.name, job=job.id, state=job.status, exit_code=job.exit_code,
                         duration_s=max(0.0, end - job.created_at), cost_usd=cost, failed=failed,
                         last_lines=_last_lines(cluster, job, ctx, failed), report=report, detail=detail,
                         links=dict(job.info.get("tracking_links") or {}), provider=cluster.provider)


def notify_job(cluster: Cluster, job: JobRecord, ctx: Context, kind: str, *, key: str | None = None,
               detail: str | None = None) -> list[deliver.Outcome] | None:
    """Send ``kind`` for ``job`` if the spec asks for it and no other sender has; None when nothing was sent.
    Best effort: a failure is a warning, never the command's failure."""
    try:
        spec = ctx.spec_of(cluster).notify
    except Exception:  # noqa: BLE001 -- a cluster whose spec no longer parses sends nothing
        return None
    if spec is None or kind not in spec.on or not spec.targets():
        return None
    marker = claim(ctx.store.home, cluster.id, job.id, key or kind)
    if marker is None:
        return None
    from gtrain.notify.nodestart import node_claim

    if node_claim(ctx, cluster, kind) is False:  # the node's own watcher sent it (docs/notify.md)
        with contextlib.suppress(OSError):
            marker.write_text(json.dumps({"event": kind, "sent_by": "node", "at": time.time()}), encoding="utf-8")
        return None
    redact.register_secrets([n for n in (spec.webhook and spec.webhook.url_secret,
                                         spec.email and spec.email.smtp_secret) if n])
    outcomes = send(spec, job_event(cluster, job, ctx, kind, detail))
    with contextlib.suppress(OSError):
        marker.write_text(json.dumps({"event": kind, "sent_at": time.time(), "outcomes": [
            {"target": o.target, "ok": o.ok, "tries": o.tries, "detail": o.detail} for o in outcomes]}),
            encoding="utf-8")
    for o in outcomes:
        if not o.ok:
            ctx.report.warn(f"notify: {o.target}: not delivered after {o.tries} tr{'y' if o.tries == 1 else 'ies'}"
                            f" ({o.detail}); the run goes on")
    return outcomes


def ended(cluster: Cluster, job: JobRecord, ctx: Context) -> None:
    """Whoever followed ``job`` to its end: its terminal state's message."""
    if job.status in ("succeeded", "failed", "cancelled", "preempted"):
        notify_job(cluster, job, ctx, job.status,
                   key=job.status if job.status != "preempted" else f"preempted-{job.info.get('attempt', 1)}")


def notify_cluster(cluster: Cluster, ctx: Context, kind: str, spec: NotifySpec | None, *, detail: str
                   ) -> list[deliver.Outcome] | None:
    """An event of the cluster before any job exists (``health_failed``: the preflight stopped a launch), sent
    by the one command that saw it; marked in ``runs/<cluster-id>/notify/``."""
    if spec is None or kind not in spec.on or not spec.targets():
        return None
    from gtrain.runlog.events import cluster_dir

    d = cluster_dir(ctx.store.home, cluster.id) / "notify"
    with contextlib.suppress(OSError):
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{kind}-{time.time():.3f}-{os.getpid()}.json").write_text(json.dumps({"event": kind}),
                                                                        encoding="utf-8")
    redact.register_secrets([n for n in (spec.webhook and spec.webhook.url_secret,
                                         spec.email and spec.email.smtp_secret) if n])
    outcomes = send(spec, message.event(kind, cluster=cluster.name, job=None, state="launch stopped",
                                        detail=detail, provider=cluster.provider))
    for o in outcomes:
        if not o.ok:
            ctx.report.warn(f"notify: {o.target}: not delivered after {o.tries} tries ({o.detail})")
    return outcomes
