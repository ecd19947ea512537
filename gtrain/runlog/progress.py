"""A job's progress and world size as `status`, `top`, the report and the notifications show them: read from
its nodes (one call each, all at once: :func:`gtrain.state.progress.scan` sent as source) while they are up,
else from what the run archive kept. No server: the ranks' own metrics files are the record."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.state import progress as pg

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.remote.base import Runner
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

__all__ = ["Live", "archived", "fields", "job_spec", "total_hint", "world"]

#: seconds one node may take to answer
NODE_TIMEOUT_S = 30.0


def _source() -> str:
    return Path(pg.__file__).read_text(encoding="utf-8")


def ask(runners: list[Runner], job_id: str, timeout: float = NODE_TIMEOUT_S) -> list[dict[str, Any] | None]:
    """Every node's :func:`~gtrain.state.progress.scan` of the job's ``metrics/`` (None: it could not say)."""
    from gtrain.jobs.nodescript import job_dir
    from gtrain.remote.fanout import parallel
    from gtrain.remote.local import LocalRunner

    src = _source()

    def one(r: Runner) -> dict[str, Any] | None:
        folder = f"{job_dir(r, job_id)}/metrics"
        if isinstance(r, LocalRunner):  # this machine's folders: read in-process, as LocalRunner.call does
            return pg.scan(folder)
        try:
            res = r.run_python(src, ["scan", folder], timeout=timeout)
            doc = json.loads(res.stdout)
        except (GtrainError, ValueError, OSError):
            return None
        return doc if isinstance(doc, dict) else None

    return parallel(one, runners)


class Live:
    """The nodes asked in the background, from the moment it is made (beside `status`'s own state read); the
    runners are made on the caller's thread."""

    def __init__(self, cluster: Cluster, job: JobRecord, ctx: Context, timeout: float = NODE_TIMEOUT_S) -> None:
        self.answers: list[dict[str, Any] | None] | None = None
        # what the thread needs is imported here, on the caller's thread: two threads importing the same
        # packages at once can deadlock (lightkube's did, under `status`); and only node-script backends' runners
        # reach the job's folders (kubernetes, slurm and ray keep their metrics elsewhere)
        from gtrain.jobs import nodescript  # noqa: F401
        from gtrain.remote import fanout, local  # noqa: F401

        try:
            runners = ctx.runners(cluster) if ctx.backend(cluster).name == "node-script" else []
        except GtrainError:
            runners = []
        self._thread = threading.Thread(target=self._run, args=(runners, job.id, timeout), daemon=True,
                                        name="gtrain-progress")
        self._thread.start()

    def _run(self, runners: list[Runner], job_id: str, timeout: float) -> None:
        try:
            self.answers = ask(runners, job_id, timeout)
        except Exception:  # noqa: BLE001 -- progress is a nicety: never the command's failure
            self.answers = None

    def result(self, wait_s: float = 10.0) -> list[dict[str, Any] | None] | None:
        """What the nodes said, waiting at most ``wait_s`` more (None: not in time, or no node answered)."""
        self._thread.join(wait_s)
        got = self.answers
        return got if got and any(a is not None for a in got) else None


def archived(home: Path, cluster_id: str, job_id: str) -> dict[str, Any] | None:
    """The scan of the job's metrics kept in the run archive (None: nothing kept)."""
    from gtrain.state.runs import job_dir

    doc = pg.scan(str(job_dir(home, cluster_id, job_id) / "metrics"))
    return doc if doc["ranks"] else None


def total_hint(spec: dict[str, Any] | None) -> float | None:
    """``GTRAIN_TOTAL_STEPS`` in the spec's ``job.env`` (for a job that writes its JSON lines itself)."""
    env = ((spec or {}).get("job") or {}).get("env") if isinstance(spec, dict) else None
    raw = env.get("GTRAIN_TOTAL_STEPS") if isinstance(env, dict) else None
    try:
        n = float(str(raw).strip()) if raw is not None else None
    except ValueError:
        return None
    return n if n is not None and n > 0 else None


def job_spec(cluster: Cluster, job: JobRecord) -> dict[str, Any]:
    """The spec the job was launched with (its record's), else its cluster's."""
    spec = job.info.get("spec")
    return spec if isinstance(spec, dict) else dict(cluster.spec or {})


def world(cluster: Cluster, job: JobRecord) -> list[pg.WorldSize]:
    """The job's world size over time (:func:`gtrain.state.progress.world_sizes`, from its record)."""
    section = job_spec(cluster, job).get("job") or {}
    nproc = section.get("nproc_per_node") if isinstance(section, dict) else None
    return pg.world_sizes(job.info, num_nodes=cluster.num_nodes, nproc_per_node=nproc, started_at=job.created_at)


def fields(cluster: Cluster, job: JobRecord, answers: list[dict[str, Any] | None] | None = None, *,
           home: Path | None = None, now: float | None = None) -> dict[str, Any]:
    """``progress`` (:class:`~gtrain.state.progress.Progress` as a dict, None when no step was logged),
    ``progress_from`` (``nodes``, ``archive`` or None), ``world_size`` (the newest entry) and ``world_sizes``
    (the timeline) of ``job``: from the nodes' ``answers``, else from the archive under ``home``."""
    source = "nodes" if answers else None
    if not answers and home is not None and (kept := archived(home, cluster.id, job.id)) is not None:
        answers, source = [kept], "archive"
    samples, total = pg.combine(answers or [])
    p = pg.progress(samples, total or total_hint(job_spec(cluster, job)), now=now)
    ws = world(cluster, job)
    return {"progress": p.to_dict() if p.known else None, "progress_from": source if p.known else None,
            "world_size": ws[-1].to_dict() if ws else None, "world_sizes": [w.to_dict() for w in ws]}


def per_node_rates(answers: list[dict[str, Any] | None] | None) -> dict[int, float]:
    """Each node's steps/s (its lowest rank's newest samples), for `top`'s column."""
    out = {}
    for node, doc in enumerate(answers or []):
        samples, _ = pg.combine([doc])
        rate = pg.progress(samples).rate
        if rate is not None:
            out[node] = rate
    return out


def read(cluster: Cluster, job: JobRecord, ctx: Context, *, wait_s: float = 10.0) -> dict[str, Any]:
    """:func:`fields` from the nodes when the cluster is up (at most ``wait_s``), else from the archive."""
    answers = Live(cluster, job, ctx).result(wait_s) if cluster.status == "up" else None
    return fields(cluster, job, answers, home=ctx.store.home)
