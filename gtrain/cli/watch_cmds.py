"""gtrain watch: follow a cluster's job and recover it from lost nodes (no controller needed)."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.params import CLUSTER, JOB, JSON


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)


def watch(
    cluster: str = CLUSTER,
    job: str = JOB,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Don't print the job's lines; only what gtrain does."),
    json_: bool = JSON,
) -> None:
    """Follow the cluster's job to its end, recovering it from lost nodes; exit with the job's exit code."""
    out.set_json(json_)
    import gtrain.api as api

    final = api.watch(cluster, job_id=job, on_line=None if quiet or json_ else out.LinePrinter(),
                      report=out.CLIReporter())
    recs = list(final.info.get("recoveries") or [])
    if json_:
        out.emit_json({"job_id": final.id, "status": final.status, "exit_code": final.exit_code,
                       "attempt": final.info.get("attempt", 1), "recoveries": recs,
                       "recovery_stopped": final.info.get("recovery_stopped")})
    else:
        from gtrain.runs.recovery import summary_line

        for r in recs:
            out.err(summary_line(r))
        out.err(f"job {final.id} {final.status} (exit {final.exit_code})")
    raise typer.Exit(1 if final.exit_code is None else (final.exit_code if 0 <= final.exit_code <= 255 else 1))
