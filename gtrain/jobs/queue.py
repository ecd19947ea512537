"""``gtrain launch --queue``: a job put in its cluster's queue, held by the nodes themselves.

The node-script backend's nodes keep the queue (:mod:`gtrain.remote.nodequeue`, shipped to every node's
``ROOT/jobs/.queue/``): the job is rendered and shipped as a started one is, its workdir staged in its job
folder, and one detached waiter per node starts it when its turn comes -- with no gtrain running anywhere.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.events import SILENT, Reporter
from gtrain.remote.fanout import parallel

if TYPE_CHECKING:
    from gtrain.jobs.backend import JobBackend, JobPlan, JobRequest
    from gtrain.remote.base import Runner
    from gtrain.spec import Job

QUEUE_DIR = "jobs/.queue"
SCRIPT = "gtrain-queue.py"


def queue_dir(r: Runner) -> str:
    return f"{r.root}/{QUEUE_DIR}"


def queue_source() -> str:
    from gtrain.remote import nodequeue

    return Path(nodequeue.__file__).read_text(encoding="utf-8")


def check_queueable(backend: JobBackend, job: Job) -> None:
    """What a queued job cannot have (exit 2, before anything is touched)."""
    from gtrain.jobs.nodescript import NodeScriptBackend

    if not isinstance(backend, NodeScriptBackend):
        raise ConfigError(f"--queue: the {backend.name} backend's scheduler queues jobs itself",
                          hint="launch without --queue (job.queue: false)", field="job.queue")
    for name, value in (("job.setup", job.setup), ("job.data", job.data)):
        if value:
            raise ConfigError(f"{name} with --queue: a queued job starts on the nodes with no gtrain to run it",
                              hint="put it at the start of job.run, or launch without --queue", field=name)


def enqueue(backend: Any, plan: JobPlan, priority: int, report: Reporter | None = None) -> float:
    """Ship ``plan`` to every node (workdir staged in the job's folder, scripts, a queue entry) and start its
    waiters; returns the enqueue time (the order among equal priorities). A failure leaves nothing waiting."""
    from gtrain.jobs.nodescript import _stop_node, job_dir, secret_stdin
    from gtrain.spec.queue import packed
    from gtrain.sync.workdir import list_workdir

    rep = report or SILENT
    job = plan.request.spec.job
    assert job is not None
    runners, ctxs = backend.runners, plan.private["contexts"]
    local = Path(plan.request.workdir)
    seq = time.time()
    src = queue_source().encode()
    files = list_workdir(local)
    try:
        if job.image:
            from gtrain.containers.pull import pull_all

            pull_all(job, runners, rep)

        def prepare(i: int) -> None:
            r, c = runners[i], ctxs[i]
            stage, qdir = f"{c.job_dir}/stage", queue_dir(r)
            r.run(f"mkdir -p {shlex.quote(stage)} {shlex.quote(c.job_dir)}/logs {shlex.quote(qdir)}")
            moved = r.put_files(local, files, stage)
            for name, text in plan.files[i].items():
                r.write_file(f"{c.job_dir}/{name}", text.encode(), 0o700)
            r.write_file(f"{c.job_dir}/state.json", json.dumps({"state": "queued", "time": seq}).encode())
            r.write_file(f"{qdir}/{SCRIPT}", src)
            entry = {"job_id": plan.job_id, "priority": priority, "seq": seq, "job_dir": c.job_dir,
                     "workdir": c.workdir, "run": job.run, "node": i, "port": plan.request.master_port,
                     "gpus": job.gpus_per_node if packed(plan.request.spec, job) else None,
                     "node_gpus": plan.request.spec.resources.gpus_per_node}
            r.write_file(f"{qdir}/{plan.job_id}.json", json.dumps(entry).encode())
            rep.node(i, f"queued (workdir staged: {moved} of {len(files)} files)")

        parallel(prepare, list(range(len(runners))))
        secret_in = secret_stdin(job)

        def start(i: int) -> None:
            r, c = runners[i], ctxs[i]
            q = shlex.quote
            r.start_detached(f"exec {q(r.python)} {q(queue_dir(r) + '/' + SCRIPT)} wait {q(queue_dir(r))} "
                             f"{q(plan.job_id)} >>{q(c.job_dir)}/queue.log 2>&1", stdin=secret_in)

        parallel(start, list(range(len(runners))))
    except BaseException:
        try:
            parallel(lambda r: _stop_node(r, job_dir(r, plan.job_id), 2), runners)
        except Exception:  # noqa: BLE001 - best effort; the original error is what matters
            pass
        raise
    return seq


def list_queue(backend: Any) -> list[dict[str, Any]]:
    """Node 0's queue: every entry with its state (waiting, running, succeeded, failed, cancelled, lost) and a
    waiting one's position."""
    from gtrain.jobs.nodescript import NodeScriptBackend

    if not isinstance(backend, NodeScriptBackend):
        raise ConfigError(f"gtrain queue: the {backend.name} backend's scheduler keeps its own queue",
                          field="CLUSTER")
    r = backend.runners[0]
    res = r.run_python(queue_source(), ["list", queue_dir(r)], timeout=60)
    doc = json.loads(res.stdout or "[]")
    keep = ("job_id", "state", "position", "priority", "seq", "started_at", "run", "gpus", "devices", "port")
    return [{k: d.get(k) for k in keep} for d in doc]


def reserve(backend: Any, request: JobRequest) -> JobRequest:
    """The backend's free rendezvous port on node 0, not one a job waiting or running in the queue holds (jobs
    side by side each need their own)."""
    held = {d.get("port") for d in list_queue(backend) if d.get("state") in ("waiting", "running")}
    for _ in range(20):
        request = backend.reserve(request)
        if request.master_port not in held:
            break
    return request
