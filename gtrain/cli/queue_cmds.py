"""gtrain queue: a cluster's job queue, as its node 0 keeps it (docs/queue.md)."""

from __future__ import annotations

import time

import typer

from gtrain.cli import output as out
from gtrain.cli.params import CLUSTER, JSON


def register(app: typer.Typer) -> None:
    app.command("queue")(queue)


def queue(cluster: str = CLUSTER, json_: bool = JSON) -> None:
    """The cluster's queued jobs, as its nodes keep them: waiting (in the order they start), running, ended."""
    out.set_json(json_)
    from gtrain.context import Context
    from gtrain.errors import GtrainError
    from gtrain.jobs.queue import list_queue
    from gtrain.jobs.status import refresh_job

    ctx = Context(report=out.CLIReporter())
    try:
        c = ctx.cluster(cluster)
        rows = list_queue(ctx.backend(c))
        mine = {j.id: j for j in ctx.store.jobs(c.id)}
        for r in rows:  # this machine's records of them learn their start and end from the nodes
            job = mine.get(str(r["job_id"]))
            if job is not None and r["state"] != "waiting" and not job.info.get("final"):
                try:
                    refresh_job(c, job, ctx, act=False)
                except GtrainError:
                    pass  # the listing is what was asked for
    finally:
        ctx.store.close()
    if json_:
        out.emit_json({"cluster": cluster, "jobs": rows})
        return
    if not rows:
        out.say(f"no queued job on {cluster} (`gtrain launch --queue` puts one there)")
        return

    def when(t: object) -> str:
        return time.strftime("%H:%M:%S", time.localtime(float(t))) if isinstance(t, int | float) else "-"

    out.table(f"queue of {cluster}", ["JOB", "STATE", "#", "PRIORITY", "QUEUED", "STARTED", "RUN"],
              [[r["job_id"], r["state"], r.get("position") or "", r.get("priority", 0), when(r.get("seq")),
                when(r.get("started_at")), r.get("run") or ""] for r in rows])
