"""Jobs: launch on every node (detached), ask the nodes for the truth, cancel, follow until the end.

A job's truth lives on its nodes (``JOB/state.json``, rank exit files, the launch script's pid), so
``status`` and ``logs`` are right after the CLI that launched it has exited. The state database keeps a
copy that is refreshed whenever a command asks.
"""

from __future__ import annotations

import os
import queue
import secrets as _secrets
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, GtrainError, JobConflict, RemoteError
from gtrain.jobs.render import NodeContext, render_all
from gtrain.remote.fanout import parallel
from gtrain.state import TERMINAL_JOB, Cluster
from gtrain.state import Job as JobRecord
from gtrain.sync.workdir import list_workdir

if TYPE_CHECKING:
    from gtrain.cluster import Context
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec, Job

CANCEL_EXIT = 130


def job_dir(runner: Runner, job_id: str) -> str:
    return f"{runner.root}/jobs/{job_id}"


def new_job_id(cluster: str) -> str:
    return f"{cluster}-{time.strftime('%Y%m%d-%H%M%S')}-{_secrets.token_hex(2)}"


def check_job(spec: ClusterSpec) -> tuple[Job, str]:
    """Validate what can be checked before anything is touched: workdir, script, secrets."""
    if spec.job is None:
        raise ConfigError("the spec has no job section", hint="add `job: {run: train.py}`", field="job")
    job = spec.job
    workdir = spec.workdir_path()
    if not workdir.is_dir():
        raise ConfigError(f"job.workdir: {str(workdir)!r} is not a directory",
                          hint="point job.workdir at the folder holding your training script", field="job.workdir")
    argv = job.argv
    if not argv:
        raise ConfigError("job.run: no script given", hint="e.g. run: train.py --steps 50", field="job.run")
    script = argv[0]
    if not script.startswith("-") and not os.path.isabs(script) and not (workdir / script).is_file():
        raise ConfigError(
            f"job.run: script {script!r} not found in workdir {str(workdir)!r}",
            hint="job.run starts with a path relative to job.workdir, e.g. train.py", field="job.run",
        )
    missing = [n for n in job.secrets if n not in os.environ]
    if missing:
        raise ConfigError(f"job.secrets: {', '.join(missing)} not set in this environment",
                          hint="export them before launching; their values go to the nodes, never to disk",
                          field="job.secrets")
    return job, str(workdir)


def _secret_stdin(job: Job) -> bytes:
    return b"".join(f"{n}={os.environ[n]}".encode() + b"\x00" for n in job.secrets)


@dataclass
class LaunchResult:
    job_id: str
    cluster: str
    status: str
    scripts: dict[int, dict[str, str]] = field(default_factory=dict)
    master: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "cluster": self.cluster, "status": self.status, "master": self.master}


def node_contexts(cluster: Cluster, spec: ClusterSpec, job: Job, runners: list[Runner], job_id: str,
                  master_port: int) -> list[NodeContext]:
    addrs = [r.address for r in runners]
    nproc = job.nproc_per_node or spec.resources.gpus_per_node or 1
    out = []
    for rank, r in enumerate(runners):
        workdir = f"{r.root}/workdir"
        out.append(NodeContext(
            job_id=job_id, cluster=cluster.name, node_rank=rank, num_nodes=len(runners), node_ips=addrs,
            node_addr=r.address, master_addr=addrs[0], master_port=master_port, nproc_per_node=nproc,
            job_dir=job_dir(r, job_id), workdir=workdir, checkpoint_dir=f"{workdir}/{job.checkpoint_dir}",
            python=job.python or r.python, argv=job.argv, env=dict(job.env), secret_names=list(job.secrets),
            setup=job.setup, max_restarts=job.max_restarts,
        ))
    return out


def launch(cluster: Cluster, spec: ClusterSpec, ctx: Context, *, force: bool = False,
           dry_run: bool = False) -> LaunchResult:
    job, local_workdir = check_job(spec)
    runners = ctx.runners(cluster)
    if dry_run:
        ctxs = node_contexts(cluster, spec, job, runners, "<job-id>", 29500)
        return LaunchResult("<job-id>", cluster.name, "dry-run", {c.node_rank: render_all(c) for c in ctxs})

    active = active_job(cluster, ctx)
    if active is not None:
        if not force:
            raise JobConflict(f"job {active.id} is still {active.status} on {cluster.name}",
                              hint=f"wait for it (`gtrain logs {cluster.name} -f`), "
                                   "or launch with --force to cancel it")
        ctx.report.info(f"cancelling {active.id} (--force)")
        cancel_job(cluster, active, ctx)

    job_id = new_job_id(cluster.name)
    master_port = int(runners[0].call("free_port"))
    ctxs = node_contexts(cluster, spec, job, runners, job_id, master_port)
    ctx.store.create_job(cluster.id, job_id, {
        "run": job.run, "argv": job.argv, "nproc_per_node": ctxs[0].nproc_per_node, "num_nodes": len(runners),
        "master": f"{ctxs[0].master_addr}:{master_port}", "checkpoint_dir": job.checkpoint_dir,
        "workdir": local_workdir, "env_names": sorted(job.env), "secret_names": list(job.secrets),
    })
    try:
        files = list_workdir(Path(local_workdir))
        secret_in = _secret_stdin(job)

        def prepare(i: int) -> int:
            r, c = runners[i], ctxs[i]
            r.run(f"mkdir -p {shlex.quote(c.workdir)} {shlex.quote(c.job_dir)}/logs")
            moved = r.put_files(Path(local_workdir), files, c.workdir)
            for name, text in render_all(c).items():
                r.write_file(f"{c.job_dir}/{name}", text.encode(), 0o700)
            ctx.report.node(i, f"workdir synced ({moved} of {len(files)} files changed)")
            return moved

        parallel(prepare, list(range(len(runners))))
        if job.data:
            fetch_data(job, runners, ctxs, secret_in, ctx)
        if job.setup:
            ctx.report.info("running setup on every node")

            def setup(i: int) -> None:
                r, c = runners[i], ctxs[i]
                tail: list[str] = []

                def on_line(text: str) -> None:
                    tail.append(text)
                    del tail[:-30]
                    ctx.report.line(i, None, text)

                rc = r.stream(f"bash {shlex.quote(c.job_dir)}/setup.sh", on_line, stdin=secret_in)
                if rc != 0:
                    from gtrain.errors import RemoteCommandError

                    raise RemoteCommandError(r.label, "job.setup", rc, "\n".join(tail))

            parallel(setup, list(range(len(runners))))

        def start(i: int) -> None:
            r, c = runners[i], ctxs[i]
            q = shlex.quote(c.job_dir)
            r.start_detached(f"exec bash {q}/launch.sh >{q}/node.log 2>&1", stdin=secret_in)

        parallel(start, list(range(len(runners))))
    except BaseException as exc:
        # don't leave half a job behind on the nodes that did start
        try:
            parallel(lambda r: r.call("cancel", job_dir(r, job_id), "2"), runners)
        except Exception:  # noqa: BLE001 - best effort; the original error is what matters
            pass
        reason = exc.message if isinstance(exc, GtrainError) else type(exc).__name__
        ctx.store.update_job(job_id, status="failed", exit_code=1,
                             info={**ctx.store.get_job(job_id).info, "final": True, "error": reason})
        raise
    ctx.store.update_job(job_id, status="running")
    ctx.report.info(f"job {job_id} started on {len(runners)} node(s), rendezvous {ctxs[0].master_addr}:{master_port}")
    return LaunchResult(job_id, cluster.name, "running", master=f"{ctxs[0].master_addr}:{master_port}")


def fetch_data(job: Job, runners: list[Runner], ctxs: list[NodeContext], secret_in: bytes, ctx: Context) -> None:
    """Every node downloads job.data itself, in parallel, with its own credentials."""
    import json

    from gtrain.errors import RemoteCommandError, SyncError
    from gtrain.jobs import data
    from gtrain.jobs.render import render

    ctx.report.info(f"downloading {len(job.data)} dataset(s) on every node")

    def one(i: int) -> None:
        r, c = runners[i], ctxs[i]
        bundle_path = f"{r.root}/gtrain-sync.pyz"
        r.write_file(bundle_path, data.bundle(), 0o600)
        script = render("data.sh", c, bundle=bundle_path, data_main=data.DATA_MAIN,
                        data_json=data.entries_json(job.data, c.workdir))
        r.write_file(f"{c.job_dir}/data.sh", script.encode(), 0o700)
        res = r.run(f"bash {shlex.quote(c.job_dir)}/data.sh", stdin=secret_in, check=False, timeout=6 * 3600)
        last = (res.stdout.strip().splitlines() or [""])[-1]
        try:
            doc = json.loads(last)
        except ValueError:
            raise RemoteCommandError(r.label, "job.data download", res.rc, res.stderr[-2000:]) from None
        if "error" in doc:
            raise SyncError(f"node {i}: job.data: {doc['error']}", hint=doc.get("hint"))
        for d in doc["results"]:
            ctx.report.node(i, f"{d['src']} -> {d['dst']}: {d['downloaded']} downloaded, {d['skipped']} unchanged")

    parallel(one, list(range(len(runners))))


# ---- the truth from the nodes ----------------------------------------------------------------------


def _node_state(r: Runner, job_id: str) -> dict[str, Any]:
    try:
        return dict(r.call("job_state", job_dir(r, job_id), timeout=60))
    except RemoteError as e:
        return {"state": "unreachable", "error": e.message, "ranks": {}}


def _node_cancel(r: Runner, job_id: str) -> None:
    try:
        r.call("cancel", job_dir(r, job_id), "5", timeout=60)
    except RemoteError:
        pass  # unreachable now: the state read that follows reports it


def aggregate(states: list[dict[str, Any]]) -> tuple[str, int | None]:
    names = [s.get("state") for s in states]
    if any(n in ("unreachable",) for n in names):
        return "failed", 255
    if all(n in TERMINAL_JOB for n in names):
        if all(n == "succeeded" for n in names):
            return "succeeded", 0
        if any(n == "failed" for n in names):  # a node failed; others may have been stopped because of it
            return "failed", job_exit_code(states)
        return "cancelled", CANCEL_EXIT
    if any(n == "missing" for n in names) and not any(n == "running" for n in names):
        return "failed", 1
    if any(n == "running" for n in names):
        return "running", None
    return "pending", None


def job_exit_code(states: list[dict[str, Any]]) -> int:
    """The job's own exit code: the first rank (in time, across nodes) that exited non-zero."""
    failed: list[tuple[float, int]] = []
    for s in states:
        for rc, t in (s.get("ranks") or {}).values():
            if int(rc) != 0:
                failed.append((float(t), int(rc)))
    if failed:
        return min(failed)[1]
    for s in states:
        code = s.get("exit_code")
        if isinstance(code, int) and code != 0:
            return code
    return 1


def refresh_job(cluster: Cluster, job: JobRecord, ctx: Context, *, fail_fast: bool = True) -> JobRecord:
    if job.status in TERMINAL_JOB and job.info.get("final"):
        return job
    runners = ctx.runners(cluster)
    states = parallel(lambda r: _node_state(r, job.id), runners)
    status, code = aggregate(states)
    names = [s.get("state") for s in states]
    dead = [i for i, n in enumerate(names) if n in ("failed", "missing", "unreachable")]
    alive = [i for i, n in enumerate(names) if n in ("running", "pending")]
    orphaned = [i for i, s in enumerate(states) if s.get("orphans")]
    if orphaned:  # a node whose agent died left workers running: end them whatever the job's fate
        ctx.report.warn(f"job {job.id}: ending workers left behind on node(s) {orphaned}")
        parallel(lambda i: _node_cancel(runners[i], job.id), orphaned)
    if fail_fast and dead and alive:
        # One node's job died (or its node did) while the others wait in a collective: stop them instead
        # of letting them hang until a timeout.
        ctx.report.warn(f"job {job.id} failed on node(s) {dead}; stopping it on node(s) {alive}")
        parallel(lambda i: _node_cancel(runners[i], job.id), alive)
        states = [states[i] if i in dead else _node_state(runners[i], job.id) for i in range(len(runners))]
        names = [s.get("state") for s in states]
        failed = [s for s in states if s.get("state") == "failed"]
        status, code = "failed", (job_exit_code(failed) if failed else 255)
    info = dict(job.info)
    info["nodes"] = [{"state": s.get("state"), "exit_code": s.get("exit_code"), "error": s.get("error")}
                     for s in states]
    # terminal is final: a node that was unreachable may come back, but the rest of the job was stopped
    info["final"] = status in TERMINAL_JOB and any(n != "unreachable" for n in names)
    if status != job.status or code != job.exit_code or info != job.info:
        ctx.store.update_job(job.id, status=status, exit_code=code, info=info)
    return ctx.store.get_job(job.id)


def active_job(cluster: Cluster, ctx: Context) -> JobRecord | None:
    for job in reversed(ctx.store.jobs(cluster.id)):
        if job.status not in TERMINAL_JOB:
            job = refresh_job(cluster, job, ctx)
            if job.status not in TERMINAL_JOB:
                return job
    return None


def cancel_job(cluster: Cluster, job: JobRecord, ctx: Context) -> JobRecord:
    runners = ctx.runners(cluster)
    parallel(lambda r: r.call("cancel", job_dir(r, job.id), "10", timeout=60), runners)
    job = refresh_job(cluster, job, ctx, fail_fast=False)
    if job.status not in TERMINAL_JOB:
        ctx.store.update_job(job.id, status="cancelled", exit_code=CANCEL_EXIT)
    return ctx.store.get_job(job.id)


def cancel_active_jobs(cluster: Cluster, ctx: Context) -> None:
    for job in ctx.store.jobs(cluster.id):
        if job.status not in TERMINAL_JOB:
            ctx.report.info(f"stopping job {job.id}")
            cancel_job(cluster, job, ctx)


def resolve_job(cluster: Cluster, ctx: Context, job_id: str | None) -> JobRecord:
    if job_id:
        job = ctx.store.get_job(job_id)
        if job.cluster_id != cluster.id:
            raise ConfigError(f"job {job_id!r} is not a job of cluster {cluster.name!r}", field="--job")
        return job
    latest = ctx.store.latest_job(cluster.id)
    if latest is None:
        raise ConfigError(f"cluster {cluster.name!r} has no jobs yet", field="--job",
                          hint=f"`gtrain launch --cluster {cluster.name}` starts one")
    return latest


# ---- following output --------------------------------------------------------------------------------


@dataclass
class LogLine:
    node: int
    rank: int | None
    text: str


def follow(cluster: Cluster, job: JobRecord, ctx: Context, on_line: Callable[[LogLine], None], *,
           follow: bool = True, tail: int | None = None, nodes: list[int] | None = None,
           rank: int | None = None) -> JobRecord:
    """Stream every node's and rank's lines to ``on_line`` (in the caller's thread). With ``follow``, return
    when the job has ended (everywhere), with its record refreshed from the nodes."""
    runners = ctx.runners(cluster)
    picked = [i for i in range(len(runners)) if nodes is None or i in nodes]
    q: queue.Queue[tuple[str, int, Any]] = queue.Queue()

    def pump(i: int) -> None:
        r = runners[i]
        cmd, stdin = r.follow_command(job_dir(r, job.id), follow=follow, tail=tail)

        def on_raw(raw: str) -> None:
            if raw.startswith("\x00END\t"):
                q.put(("end", i, raw.split("\t", 1)[1]))
                return
            tag, _, text = raw.partition("\t")
            q.put(("line", i, (None if tag == "-" else int(tag) if tag.isdigit() else None, text)))

        try:
            r.stream(cmd, on_raw, stdin=stdin)
        except GtrainError as e:
            q.put(("error", i, e.message))
        finally:
            q.put(("done", i, None))

    threads = [threading.Thread(target=pump, args=(i,), daemon=True, name=f"gtrain-logs-{i}") for i in picked]
    for t in threads:
        t.start()
    open_streams = set(picked)
    ended: dict[int, str] = {}
    last_check = time.monotonic()
    settled_at: float | None = None  # when a refresh found the job over while streams were still open
    while open_streams:
        if settled_at is not None and time.monotonic() - settled_at > 10:
            break  # streams of nodes that are gone never end by themselves
        try:
            kind, i, payload = q.get(timeout=0.5)
        except queue.Empty:
            kind, i, payload = "tick", -1, None
        if kind == "line":
            r_rank, text = payload
            if rank is None or r_rank == rank:
                on_line(LogLine(i, r_rank, text))
        elif kind == "end":
            ended[i] = payload
        elif kind == "error":
            ctx.report.warn(f"node {i}: {payload}")
            ended[i] = '{"state": "unreachable"}'
        elif kind == "done":
            open_streams.discard(i)
        # A node that ended badly while others still run: refresh (which stops the rest, see refresh_job).
        if follow and ended and open_streams and time.monotonic() - last_check > 2:
            last_check = time.monotonic()
            if any('"succeeded"' not in v for v in ended.values()):
                job = refresh_job(cluster, ctx.store.get_job(job.id), ctx)
                if job.status in TERMINAL_JOB and settled_at is None:
                    settled_at = time.monotonic()
    for t in threads:
        t.join(timeout=5)
    return refresh_job(cluster, ctx.store.get_job(job.id), ctx) if follow else ctx.store.get_job(job.id)
