"""Who sends which notification, and when (docs/notify.md): the spec's ``notify:`` block, sent by whoever
follows a job (`run`, `launch --wait`, `logs -f`, `watch`) when it ends, is preempted, recovers, reaches 80% of
its budget or is stopped for idle GPUs. One event, one message: :func:`gtrain.notify.dispatch.claim` first (on
rank 0 too, where the cluster runs a node watcher), then :func:`gtrain.notify.dispatch.send`."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import TYPE_CHECKING, Any

from gtrain import redact
from gtrain.notify import deliver, message
from gtrain.notify.dispatch import claim, send
from gtrain.notify.nodestart import NODE_KEYS, claim_on

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec.notify import NotifySpec
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

__all__ = ["ended", "job_event", "node_claim", "notify_cluster", "notify_job"]


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
        from gtrain.state.runs import job_dir

        html = job_dir(ctx.store.home, cluster.id, job.id) / "report.html"
        report = str(html) if html.is_file() else str(job_dir(ctx.store.home, cluster.id, job.id))
    end = job.ended_at or time.time()
    progress, world = _progress(cluster, job, ctx, live=kind in ("preempted", "recovered"))
    return message.event(kind, cluster=cluster.name, job=job.id, state=job.status, exit_code=job.exit_code,
                         duration_s=max(0.0, end - job.created_at), cost_usd=cost, failed=failed,
                         last_lines=_last_lines(cluster, job, ctx, failed), report=report, detail=detail,
                         links=dict(job.info.get("tracking_links") or {}), provider=cluster.provider,
                         progress=progress, world_size=world)


#: seconds a notification waits for the nodes' step (a lost node's SSH must not hold a recovery up)
PROGRESS_WAIT_S = 5.0


def _progress(cluster: Cluster, job: JobRecord, ctx: Context, *, live: bool
              ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The job's step, rate (and, ``live``, ETA) and its world size now, each with its ``text``; (None, None)
    when they cannot be had. From the nodes (at most :data:`PROGRESS_WAIT_S`), else the run archive."""
    with contextlib.suppress(Exception):
        from gtrain.runlog.progress import read
        from gtrain.state.progress import describe, world_line

        got = read(cluster, job, ctx, wait_s=PROGRESS_WAIT_S)
        p, w = got["progress"], got["world_size"]
        return ({**p, "text": describe(p, live=live)} if p else None,
                {**w, "text": world_line(w)} if w else None)
    return None, None


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
    from gtrain.state.runs import cluster_dir

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


def node_claim(ctx: Context, cluster: Cluster, kind: str) -> bool | None:
    """Claim ``kind``'s marker on rank 0 before the laptop sends it: False when the node's watcher sent it
    already; None when the cluster has no node watcher or its node cannot be asked (the laptop sends)."""
    from gtrain.errors import GtrainError

    if kind not in NODE_KEYS or not getattr(ctx.provider(cluster.provider), "node_watchers", False):
        return None
    try:
        return claim_on(ctx.runners(cluster)[0], cluster.name, kind)
    except (GtrainError, OSError, ValueError, IndexError, KeyError):
        return None
