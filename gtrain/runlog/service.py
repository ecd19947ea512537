"""What `gtrain report` and `gtrain plot` (and `down`/`run`, through :func:`write_report`) call: a job's data,
fresh from its nodes while the cluster is up, else from the archive."""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.runlog import archive

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gtrain.context import Context
    from gtrain.costs.report import CostLine
    from gtrain.events import Reporter
    from gtrain.runlog.model import RunData
    from gtrain.state import Cluster, Job


def _ctx(report: Reporter | None) -> Context:
    from gtrain.context import Context
    from gtrain.events import SILENT

    return Context(report=report or SILENT)


def _cluster_dict(c: Cluster) -> dict[str, Any]:
    return {"id": c.id, "name": c.name, "provider": c.provider, "status": c.status, "num_nodes": c.num_nodes,
            "instance_type": c.instance_type, "region": c.region, "market": c.market, "spec": c.spec,
            "created_at": c.created_at, "terminated_at": c.terminated_at, "price_per_hour": c.price_per_hour,
            "by": c.extra.get("by")}


def _job_dict(j: Job, c: Cluster | None = None) -> dict[str, Any]:
    doc = {"id": j.id, "status": j.status, "exit_code": j.exit_code, "created_at": j.created_at,
           "ended_at": j.ended_at, "run": j.info.get("run"), "tracking": j.info.get("tracking_links") or {},
           "by": j.info.get("by")}
    if c is not None:  # the world size over time and the spec's total (gtrain.runlog.progress)
        from gtrain.runlog.progress import job_spec, total_hint, world

        doc.update(world_sizes=[w.to_dict() for w in world(c, j)], total_hint=total_hint(job_spec(c, j)))
    return doc


def refresh(ctx: Context, cluster: Cluster, job: Job, *, logs: bool = False) -> None:
    """While the cluster is up: bring the job's new metric files (and, with ``logs``, its logs) into the
    archive. A node that cannot be reached leaves what was kept before."""
    if cluster.status != "up":
        return
    try:
        if logs:
            archive.archive_job(ctx, cluster, job)
        else:
            for w in archive.fetch_files(ctx, cluster, job).warnings:
                ctx.report.warn(w)
    except GtrainError as e:
        ctx.report.warn(f"could not reach {cluster.name}'s nodes ({e.message}); showing what gtrain kept")


def cost_lines(ctx: Context, cluster: Cluster) -> list[CostLine]:
    """The cluster's cost lines: as `down` priced them when every interval is closed and priced (no provider
    is loaded), else priced now by the provider (``gtrain cost``'s numbers)."""
    from gtrain.costs.report import CostLine, cluster_cost

    ivs = ctx.store.intervals(cluster.id)
    if ivs and all(iv.stopped_at is not None and iv.cost_usd is not None for iv in ivs):
        return [CostLine(iv.node_rank, iv.instance_type, iv.market, iv.started_at, iv.stopped_at,
                         round(max(0.0, (iv.stopped_at or 0) - iv.started_at) / 3600, 6), iv.price_per_hour,
                         round(iv.cost_usd or 0.0, 6), iv.estimate, iv.note) for iv in ivs]
    return cluster_cost(ctx.store, cluster, ctx.provider(cluster.provider)).lines


def collect(ctx: Context, cluster: Cluster, job: Job, *, log_keys: Sequence[str] = (), fresh: bool = True,
            costs: bool = True, gpus: bool = True, progress: bool = True) -> RunData:
    """The job's :class:`RunData`: metrics, events, GPU samples, cost lines and steps (unless not
    ``gpus``/``costs``/``progress``)."""
    from gtrain.runlog.model import load_run

    if fresh:
        refresh(ctx, cluster, job, logs=bool(log_keys))
    home = ctx.store.home
    return load_run(archive.job_dir(home, cluster.id, job.id), _cluster_dict(cluster), _job_dict(job, cluster),
                    costs=cost_lines(ctx, cluster) if costs else (),
                    events=archive.read_events(home, cluster.id), log_keys=log_keys, gpus=gpus, progress=progress)


def default_report_path(cluster: str, next_to: Path | None = None) -> Path:
    """``<cluster>-report.html`` in the folder the checkpoints were pulled into (``next_to``'s parent), else here."""
    base = Path(next_to).parent if next_to is not None else Path.cwd()
    return base / f"{cluster}-report.html"


def write_report(ctx: Context, cluster: Cluster, job: Job, out: Path | None = None, *, next_to: Path | None = None,
                 log_keys: Sequence[str] = (), fresh: bool = True) -> Path:
    """Write the job's HTML report (atomically) and return its path: ``out``, else next to the pulled
    checkpoints (:func:`default_report_path`)."""
    from gtrain.runlog.html import render_report

    run = collect(ctx, cluster, job, log_keys=log_keys, fresh=fresh)
    path = report_target(out, cluster.name) if out is not None else default_report_path(cluster.name, next_to)
    from gtrain.redact import scrub
    from gtrain.termsafe import safe

    write_text(path, safe(scrub(render_report(run))))  # no raw ESC byte from the job's output in the page
    ctx.report.info(f"report: {path}")
    return path


def report_target(out: str | os.PathLike[str], cluster: str) -> Path:
    """Where ``--out`` puts the report: a folder (existing, or named with a trailing ``/``) means
    ``<folder>/<cluster>-report.html``."""
    text = os.fspath(out)
    path = Path(text)
    if path.is_dir() or text.endswith(("/", os.sep)):
        return path / f"{cluster}-report.html"
    return path


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path``: a regular file (or a new one) atomically, through a temporary file next to it
    that never outlives a failure; anything else (a FIFO, ``/dev/stdout``, a terminal) is written in place,
    never replaced by a regular file."""
    import stat

    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise GtrainError(f"cannot write the report to {path}: {e.strerror or e}",
                          hint="give --out a file path") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise GtrainError(f"cannot write the report to {path}: it is a folder", hint="give --out a file path")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise GtrainError(f"cannot write the report to {path}: {e.strerror or e}",
                              hint="give --out a regular file or a folder") from None
        return
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise GtrainError(f"cannot write the report to {path}: {e.strerror or e}",
                          hint="give --out a writable file or folder") from None


def report(cluster: str, *, job_id: str | None = None, out: str | os.PathLike[str] | None = None,
           log_keys: Sequence[str] = (), report: Reporter | None = None) -> Path:
    """`gtrain report`: the job's (default: the newest) HTML report; works on a cluster that is gone."""
    ctx = _ctx(report)
    try:
        c = archive.find_cluster(ctx.store, cluster)
        job = archive.find_job(ctx.store, c, job_id)
        return write_report(ctx, c, job, Path(out) if out else None, log_keys=log_keys)
    finally:
        ctx.store.close()


def summary(run: RunData) -> dict[str, Any]:
    """The run as JSON: its summary and the kept cost lines (for ``--json``)."""
    return {"cluster": run.cluster["name"], "job": run.job["id"], "archive": run.archive, **run.summary(),
            "costs": [asdict(c) for c in run.costs]}
