"""The run archive: what gtrain keeps of each job under ``$GTRAIN_HOME/runs/``, so that `logs`, `plot` and
`report` work after `down` (docs/report.md)::

    runs/<cluster-id>/events.jsonl                  {"t": ..., "kind": "up|launch|recovery|preflight|down", ...}
    runs/<cluster-id>/jobs/<job-id>/job.json        the job record and its cluster's name, provider and spec
    runs/<cluster-id>/jobs/<job-id>/logs/node-K.log every line of node K: "TAG<TAB>TEXT" (TAG: global rank, or -)
    runs/<cluster-id>/jobs/<job-id>/metrics/rank-R.jsonl     what rank R logged (gtrain.metrics / JSON lines)
    runs/<cluster-id>/jobs/<job-id>/telemetry/node-K.jsonl   GPU samples {"t","gpu","util","mem_used","mem_total"}
    runs/<cluster-id>/jobs/<job-id>/tensorboard/node-K/...   TensorBoard event files (job.tracking.tensorboard)
    runs/<cluster-id>/jobs/<job-id>/.cache/                  parsed metric columns (rebuilt when missing)

Bounded: the last :data:`MAX_LOG_LINES` lines of each log file, metric/telemetry/event files up to
:data:`MAX_FILE_BYTES` each, and the whole archive under ``$GTRAIN_ARCHIVE_MAX_MB`` (default 2048): the
oldest jobs' folders are deleted first (never the one just written). Log lines are scrubbed of secrets.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain import redact
from gtrain.errors import ClusterNotFound, GtrainError
from gtrain.state.runs import EVENT_KINDS as EVENT_KINDS  # re-exported: the archive's public names
from gtrain.state.runs import cluster_dir as cluster_dir
from gtrain.state.runs import job_dir, kept_log, read_kept_log, runs_root, write_kept_log
from gtrain.state.runs import read_events as read_events
from gtrain.state.runs import record_event as record_event

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.jobs.backend import LogLine
    from gtrain.remote.base import Runner
    from gtrain.state import Cluster, Job, StateStore

MAX_LOG_LINES = 200_000
MAX_FILE_BYTES = 64 * 2**20
DEFAULT_MAX_MB = 2048
TB_DEFAULT = "tensorboard"


# ---- finding a cluster or a job, gone or not -----------------------------------------------------------


def find_cluster(store: StateStore, name: str) -> Cluster:
    """The live cluster called ``name``, else the newest terminated one (its archive is what is left)."""
    live = store.find_cluster(name)
    if live is not None and live.status != "terminated":
        return live
    gone = [c for c in store.list_clusters(include_terminated=True) if c.name == name]
    if not gone:
        raise ClusterNotFound(name)
    return max(gone, key=lambda c: c.created_at)


def find_job(store: StateStore, cluster: Cluster, job_id: str | None) -> Job:
    from gtrain.errors import ConfigError

    if job_id:
        job = store.get_job(job_id)
        if job.cluster_id != cluster.id:
            raise ConfigError(f"--job {job_id}: not a job of cluster {cluster.name!r}", field="--job",
                              hint=f"`gtrain status {cluster.name}` lists its jobs")
        return job
    latest = store.latest_job(cluster.id)
    if latest is None:
        raise ConfigError(f"cluster {cluster.name!r} has no jobs", field="--job",
                          hint=f"`gtrain launch --cluster {cluster.name}` starts one")
    return latest


# ---- archiving -----------------------------------------------------------------------------------------


@dataclass
class ArchiveResult:
    path: Path
    files: int = 0
    bytes: int = 0
    log_lines: int = 0
    warnings: list[str] = field(default_factory=list)


def _write_job_json(dest: Path, cluster: Cluster, job: Job) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    doc = {"cluster": {"id": cluster.id, "name": cluster.name, "provider": cluster.provider,
                       "num_nodes": cluster.num_nodes, "spec": cluster.spec, "market": cluster.market,
                       "instance_type": cluster.instance_type, "created_at": cluster.created_at},
           "job": {"id": job.id, "status": job.status, "exit_code": job.exit_code, "created_at": job.created_at,
                   "ended_at": job.ended_at, "info": job.info},
           "archived_at": time.time()}
    tmp = dest / ".job.json.tmp"
    tmp.write_text(redact.scrub(json.dumps(redact.scrub_obj(doc), indent=1, default=str)))
    os.replace(tmp, dest / "job.json")


def _remote_files(runner: Runner, jdir: str, tb_dir: str | None) -> list[tuple[int, str, str]]:
    """(size, remote path, archive-relative path) of the node's metric, telemetry and TensorBoard files."""
    q = shlex.quote(jdir)
    show = "printf '%s\\t%s\\n' \"$(wc -c <\"$f\")\" \"$f\""
    parts = [f'for f in {q}/metrics/*.jsonl {q}/telemetry/*.jsonl; do if [ -f "$f" ]; then {show}; fi; done']
    if tb_dir:
        t = shlex.quote(tb_dir)
        parts.append(f"if [ -d {t} ]; then find {t} -type f -name 'events.out.tfevents.*' | "
                     f'while IFS= read -r f; do {show}; done; fi')
    res = runner.run("; ".join(parts), check=True, timeout=60)
    out = []
    for line in res.stdout.splitlines():
        size, _, path = line.partition("\t")
        if not size.strip().isdigit() or not path:
            continue
        if path.startswith(jdir + "/"):
            rel = path[len(jdir) + 1:]
        elif tb_dir and path.startswith(tb_dir.rstrip("/") + "/"):
            rel = "tensorboard/node-{node}/" + path[len(tb_dir.rstrip("/")) + 1:]
        else:
            continue
        out.append((int(size.strip()), path, rel))
    return out


def _tb_dir(cluster: Cluster, runner: Runner) -> str | None:
    job = cluster.spec.get("job") or {}
    tb = job["tracking"].get("tensorboard") if isinstance(job.get("tracking"), dict) else None
    # job.tracking.tensorboard: true or a folder; gtrain set GTRAIN_TENSORBOARD_DIR to it (gtrain.tracking)
    rel = TB_DEFAULT if tb is True else (tb.strip() if isinstance(tb, str) else None)
    if not rel:
        return None
    rel = str(rel)
    return rel if rel.startswith("/") else f"{runner.root}/workdir/{rel}"


def _ended(status: str) -> bool:
    from gtrain.jobs.backend import JobState

    try:
        return JobState(status).terminal
    except ValueError:
        return False


def fetch_files(ctx: Context, cluster: Cluster, job: Job, dest: Path | None = None) -> ArchiveResult:
    """Bring the job's metric, telemetry and TensorBoard files into its archive folder; only what is new since
    the last call moves (the files are append-only). Unreachable nodes are warnings."""
    from gtrain.jobs.nodescript import job_dir as remote_job_dir
    from gtrain.remote.fanout import parallel

    dest = dest or job_dir(ctx.store.home, cluster.id, job.id)
    res = ArchiveResult(dest)
    runners = ctx.runners(cluster)
    if not ctx.provider(cluster.provider).node_disks_outlive_jobs and _ended(job.status):
        runners = []  # pods: their files ended with the job (what the job put in the store stays there)

    def one(item: tuple[int, Runner]) -> tuple[int, int, list[str]]:
        node, r = item
        files = bytes_ = 0
        warns: list[str] = []
        try:
            listing = _remote_files(r, remote_job_dir(r, job.id), _tb_dir(cluster, r))
        except GtrainError as e:
            return 0, 0, [f"node {node}: could not list the job's metric files: {e.message}"]
        for size, remote, rel in listing:
            local = dest / rel.replace("{node}", str(node))
            if size > MAX_FILE_BYTES:
                warns.append(f"node {node}: {remote} is {size} bytes, over the archive's {MAX_FILE_BYTES}; not kept")
                continue
            mark = local.with_name(f".{local.name}.fetched")  # remote bytes fetched (the kept file is scrubbed)
            have = local.stat().st_size if local.exists() else 0
            if mark.exists() and local.exists():
                have = int(mark.read_text() or 0)
            if have == size:
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            offset = have if have < size else 0
            try:
                buf = io.BytesIO()
                got = r.fetch(remote, buf, offset)
                raw = buf.getvalue()
                kept = redact.scrub_bytes(raw)  # a secret the job printed or used as a metric name
                with open(local, "ab" if offset else "wb") as f:
                    f.write(kept)
                if kept != raw or mark.exists():  # sizes differ from the node's: remember how far we read
                    mark.write_text(str(offset + got))
                bytes_ += got
                files += 1
            except GtrainError as e:
                warns.append(f"node {node}: could not fetch {remote}: {e.message}")
        return files, bytes_, warns

    for files, nbytes, warns in parallel(one, list(enumerate(runners))):
        res.files += files
        res.bytes += nbytes
        res.warnings += warns
    return res


def archive_job(ctx: Context, cluster: Cluster, job: Job, *, max_mb: float | None = None) -> ArchiveResult:
    """Keep the job's logs (through the job backend's ``log_iter``), its metric/telemetry/TensorBoard files
    (the runners' ``fetch``) and its record under ``$GTRAIN_HOME/runs/``, then bound the archive's size. Call it
    when the job has ended and before the nodes are deleted; calling it again refreshes. Never raises for an
    unreachable node: what could not be kept is in ``warnings`` (and reported)."""
    from gtrain.jobs.backend import LogLine
    from gtrain.remote.fanout import parallel

    dest = job_dir(ctx.store.home, cluster.id, job.id)
    _write_job_json(dest, cluster, job)
    res = ArchiveResult(dest)
    try:
        backend = ctx.backend(cluster)
        got = fetch_files(ctx, cluster, job, dest)
        res.files, res.bytes, res.warnings = got.files, got.bytes, got.warnings
    except GtrainError as e:
        res.warnings.append(f"could not reach the nodes to keep the job's files: {e.message}")
        backend = None
    if backend is not None:
        (dest / "logs").mkdir(exist_ok=True)

        def keep_logs(node: int) -> tuple[int, str | None]:
            path = kept_log(ctx.store.home, cluster.id, job.id, node)
            try:
                got = [(i.rank, i.text) for i in backend.log_iter(job, node, tail=MAX_LOG_LINES)
                       if isinstance(i, LogLine)]
                if not got and path.exists() and path.stat().st_size:  # its lines went with the job (pods
                    return 0, None  # deleted by a cancel): what was kept before stays
                return write_kept_log(path, got), None
            except GtrainError as e:
                return 0, f"node {node}: could not keep its logs: {e.message}"

        for n, warn in parallel(keep_logs, list(range(cluster.num_nodes))):
            res.log_lines += n
            if warn:
                res.warnings.append(warn)
    for w in res.warnings:
        ctx.report.warn(w)
    from gtrain.runlog.model import load_metrics

    load_metrics(dest)  # parsed once now: the report and plot read the cached columns (ARCHIVE/.cache/)
    prune(ctx.store.home, max_mb=max_mb, keep=dest)
    return res


def archive_cluster(ctx: Context, cluster: Cluster) -> list[ArchiveResult]:
    """Archive every job of ``cluster`` not kept yet in its final state (what `down` calls before deleting
    the nodes). A job archived after it ended is not fetched again."""
    out = []
    for job in ctx.store.jobs(cluster.id):
        kept = job_dir(ctx.store.home, cluster.id, job.id) / "job.json"
        try:
            done = json.loads(kept.read_text()).get("job", {}).get("ended_at") is not None
        except (OSError, ValueError, AttributeError):
            done = False
        if not done:
            out.append(archive_job(ctx, cluster, job))
    return out


# ---- reading back --------------------------------------------------------------------------------------


def archived_log_lines(home: Path, cluster_id: str, job_id: str, *, nodes: list[int] | None = None,
                       rank: int | None = None, tail: int | None = None) -> Iterator[LogLine]:
    """The job's kept log lines, node by node (only ``nodes``' / ``rank``'s; the last ``tail`` of each node)."""
    from gtrain.jobs.backend import LogLine

    logs = job_dir(home, cluster_id, job_id) / "logs"
    picked = sorted(int(p.stem.split("-", 1)[1]) for p in logs.glob("node-*.log") if p.stem[5:].isdigit())
    for node in picked:
        if nodes is not None and node not in nodes:
            continue
        items = [LogLine(node, r, text) for r, text in read_kept_log(logs / f"node-{node}.log")
                 if rank is None or r == rank]
        if tail is not None:
            items = items[-tail:] if tail else []
        yield from items


def logs_from_archive(store: StateStore, name: str, *, job_id: str | None = None, on_line: Any = None,
                      node: int | None = None, rank: int | None = None, tail: int | None = None) -> Job:
    """`gtrain logs` of a cluster that is gone: the archived lines of its job, through ``on_line``."""
    from gtrain.errors import ConfigError

    cluster = find_cluster(store, name)
    job = find_job(store, cluster, job_id)
    if not (job_dir(store.home, cluster.id, job.id) / "logs").is_dir():
        raise ConfigError(f"cluster {name!r} is gone and gtrain kept no logs of job {job.id}", field="CLUSTER",
                          hint="logs are kept when a job ends or at `gtrain down`")
    for line in archived_log_lines(store.home, cluster.id, job.id, nodes=None if node is None else [node],
                                   rank=rank, tail=tail):
        if on_line is not None:
            on_line(line)
    return job


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def prune(home: Path, *, max_mb: float | None = None, keep: Path | None = None) -> list[Path]:
    """Delete the oldest jobs' folders until the archive is under ``max_mb`` (default ``$GTRAIN_ARCHIVE_MAX_MB``
    or 2048); ``keep`` is never deleted. Returns what was deleted."""
    if max_mb is None:
        try:
            max_mb = float(os.environ.get("GTRAIN_ARCHIVE_MAX_MB") or DEFAULT_MAX_MB)
        except ValueError:
            max_mb = DEFAULT_MAX_MB
    limit = int(max_mb * 2**20)
    jobs = [(p.stat().st_mtime, p) for p in runs_root(home).glob("*/jobs/*") if p.is_dir()]
    sizes = {p: _du(p) for _, p in jobs}
    total = sum(sizes.values())
    deleted: list[Path] = []
    for _, p in sorted(jobs):
        if total <= limit:
            break
        if keep is not None and p.resolve() == Path(keep).resolve():
            continue
        shutil.rmtree(p, ignore_errors=True)
        total -= sizes[p]
        deleted.append(p)
    return deleted
