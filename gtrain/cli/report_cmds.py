"""gtrain plot / report: a run's metrics in the terminal, and the whole run as one HTML file."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.params import CLUSTER, JOB, JSON

LOG_KEYS = typer.Option(None, "--log-keys", metavar="K1,K2",
                        help="Also read these keys from rank 0's log lines (key=value, key: value, key value).")


def register(app: typer.Typer) -> None:
    app.command("plot")(plot)
    app.command("report")(report)


def _keys(log_keys: str | None) -> list[str]:
    from gtrain.errors import ConfigError

    keys = [k.strip() for k in (log_keys or "").split(",") if k.strip()]
    bad = [k for k in keys if not k.replace("_", "").replace("/", "").replace(".", "").isalnum()]
    if bad:
        raise ConfigError(f"--log-keys {log_keys}: {bad[0]!r} is not a metric name", field="--log-keys",
                          hint="give names like loss,lr (letters, digits, _ . /), comma-separated")
    return keys


def plot(
    cluster: str = CLUSTER,
    job: list[str] = typer.Option(None, "--job", metavar="ID",
                                  help="Job id (default: the newest); repeat it to overlay jobs."),
    metric: str = typer.Option(None, "--metric", "-m", metavar="NAME", help="Metric to draw (default: loss)."),
    x: str = typer.Option("step", "--x", metavar="step|time", help="Against the step, or minutes since the start."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Redraw as new points arrive, until the jobs end."),
    log_keys: str = LOG_KEYS,
) -> None:
    """A metric of one or more jobs as a terminal chart; works after `down`, from what gtrain kept."""
    import sys

    from gtrain.runlog.plot import plot as draw

    tty = sys.stdout.isatty()

    def write(text: str, first: bool) -> None:
        if follow and tty:
            sys.stdout.write("\x1b[H\x1b[2J")
        elif not first:
            sys.stdout.write("\n")
        text = out.clean(text, keep_sgr=True)  # plotext's colours; a title from the job cannot move the screen
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))
        sys.stdout.flush()

    draw(cluster, job_ids=job or [], metric=metric, x=x, follow=follow, log_keys=_keys(log_keys), write=write,
         color=out._color(sys.stdout), report=out.CLIReporter())


def report(
    cluster: str = CLUSTER,
    job: str = JOB,
    out_: str = typer.Option(None, "--out", "-o", metavar="FILE",
                             help="Where to write it (default: ./CLUSTER-report.html)."),
    log_keys: str = LOG_KEYS,
    json_: bool = JSON,
) -> None:
    """One self-contained HTML report of a job: metrics, cost over time, GPU use, events, spec, summary."""
    out.set_json(json_)
    from gtrain.runlog.service import report as write

    path = write(cluster, job_id=job, out=out_, log_keys=_keys(log_keys), report=out.CLIReporter())
    if json_:
        out.emit_json({"cluster": cluster, "report": str(path), "bytes": path.stat().st_size})
    else:
        out.say(str(path))
