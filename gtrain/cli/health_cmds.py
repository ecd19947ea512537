"""gtrain health / top, and the GPU table of `status --gpus`."""

from __future__ import annotations

from typing import Any

import typer

from gtrain.cli import output as out
from gtrain.cli.params import CLUSTER, JSON

GPU_COLUMNS = ["node", "gpu", "util", "memory", "temp", "power", "steps/s", "sample"]
#: `top`: the node's energy so far beside the GPUs' watts
TOP_COLUMNS = [*GPU_COLUMNS[:6], "energy", *GPU_COLUMNS[6:]]
#: `top` integrates the kept samples at most this often (the watts are fresh each frame)
ENERGY_EVERY_S = 30.0


def register(app: typer.Typer) -> None:
    app.command("health")(health)
    app.command("top")(top)


def health(
    cluster: str = CLUSTER,
    quick: bool = typer.Option(False, "--quick", help="The default: GPU checks, one all-reduce sweep, one GEMM "
                               "digest per device (seconds)."),
    full: bool = typer.Option(False, "--full", help="Also repeat the GEMMs and all-reduces under load for 60 s."),
    json_: bool = JSON,
) -> None:
    """Check every node: GPUs vs the spec, ECC, Xid, an all-reduce, GEMM digests (silent data corruption)."""
    out.set_json(json_)
    from gtrain.context import Context
    from gtrain.errors import ConfigError
    from gtrain.health.checks import run_health

    if quick and full:
        raise ConfigError("--quick and --full: give one of them", field="--full",
                          hint=f"gtrain health {cluster} --full")
    ctx = Context(report=out.CLIReporter())
    report = run_health(ctx.cluster(cluster), ctx, "full" if full else "quick")
    if json_:
        out.emit_json(report.to_dict())
    else:
        out.table(None, ["node", "check", "verdict", "figure", "reason"],
                  [["-" if c.node is None else c.node, c.name, c.verdict.value, c.figure, c.reason]
                   for c in sorted(report.checks, key=lambda c: (-1 if c.node is None else c.node, c.name))])
        out.say(f"{report.summary()} [{report.seconds:.1f}s]")
    if report.failed():
        raise typer.Exit(1)


def gpu_table(cluster: str, *, energy: bool = False) -> tuple[list[list[Any]], str | None, dict[str, Any] | None]:
    """Rows of the newest telemetry of the cluster's newest job, the job id (None: no job yet) and, with
    ``energy``, the job's energy so far (gtrain.health.energy: per node and in all, its carbon estimate)."""
    rows, job, doc, _ = gpu_view(cluster, energy=energy)
    return rows, job, doc


def gpu_view(cluster: str, *, energy: bool = False, progress: bool = False
             ) -> tuple[list[list[Any]], str | None, dict[str, Any] | None, dict[str, Any] | None]:
    """:func:`gpu_table`, and with ``progress`` the job's step, rate, ETA and world size
    (gtrain.runlog.progress.fields; each node's steps/s in its rows), asked of the nodes beside the telemetry."""
    from gtrain.context import Context
    from gtrain.health import telemetry
    from gtrain.health.energy import Energy, carbon, from_integral

    ctx = Context(report=out.CLIReporter())
    c = ctx.cluster(cluster)
    jobs = ctx.store.jobs(c.id)
    if not jobs:
        return [], None, None, None
    reading = None
    if progress and c.status == "up":
        from gtrain.runlog.progress import Live

        reading = Live(c, jobs[-1], ctx)
    tele = telemetry.read(c, jobs[-1], ctx, samples=64, energy=energy)
    doc = None
    if energy:
        e = Energy([from_integral(t.node, t.energy or {}) for t in tele if not t.error])
        e.carbon = carbon(e.total_kwh, c.region, c.spec.get("energy"))
        doc = e.to_dict()
    rows = telemetry.rows(tele)
    prog = None
    if progress:
        from gtrain.runlog.progress import fields, per_node_rates

        answers = reading.result() if reading else None
        prog = {"status": jobs[-1].status, "id": jobs[-1].id,
                **fields(c, jobs[-1], answers, home=ctx.store.home)}
        rates = per_node_rates(answers)
        rows = [[*r[:6], f"{rates[r[0]]:.3g}" if r[0] in rates else r[6], *r[7:]] for r in rows]
    return rows, jobs[-1].id, doc, prog


def show_gpus(cluster: str, json_: bool) -> None:
    """`gtrain status CLUSTER --gpus`."""
    rows, job, energy = gpu_table(cluster, energy=True)
    if json_:
        out.emit_json({"cluster": cluster, "job": job, "gpus": [dict(zip(GPU_COLUMNS, r, strict=True)) for r in rows],
                       "energy": energy})
        return
    if job is None:
        out.say(f"no job on {cluster} yet: nothing sampled")
        return
    out.table(f"GPUs of job {job}", GPU_COLUMNS, rows)
    if energy is not None:
        out.say(out.energy_line(energy) + " (so far)")


def top(
    cluster: str = CLUSTER,
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit (no live view); the default when "
                                                    "stdout is not a terminal."),
) -> None:
    """A live view of every node's GPUs: utilisation, memory, temperature, power, steps/s."""
    import sys
    import time

    if not 0.2 <= interval <= 3600:  # click's min= lets NaN through (every comparison with it is false)
        from gtrain.errors import ConfigError

        raise ConfigError(f"--interval {interval}: must be a number of seconds from 0.2 to 3600", field="--interval",
                          hint="e.g. --interval 2")

    from gtrain.cli.views import progress_line

    if once or not _is_terminal(sys.stdout):  # a pipe or a file gets one frame, then the command ends
        rows, job, energy, prog = gpu_view(cluster, energy=True, progress=True)
        if job is None:
            out.say(f"no job on {cluster} yet: nothing sampled")
            return
        out.table(f"GPUs of job {job}", TOP_COLUMNS, with_kwh(rows, energy))
        line = progress_line(prog) if prog else None
        if line:
            out.say(line)
        if energy is not None:
            out.say(out.energy_line(energy) + " (so far)")
        return
    from rich.live import Live
    from rich.table import Table

    last: dict[str, Any] = {"at": 0.0, "energy": None}

    def frame() -> Table:
        fresh = time.monotonic() - last["at"] >= max(interval, ENERGY_EVERY_S)
        rows, job, energy, prog = gpu_view(cluster, energy=fresh, progress=True)
        if fresh:
            last.update(at=time.monotonic(), energy=energy)
        caption = [x for x in (progress_line(prog) if prog else None,
                               out.energy_line(last["energy"]) + " (so far)" if last["energy"] else None) if x]
        t = Table(title=f"{cluster}: job {job or '-'}  ({time.strftime('%H:%M:%S')}, Ctrl+C to quit)",
                  caption=out.clean("\n".join(caption)) if caption else None)
        for col in TOP_COLUMNS:
            t.add_column(col)
        for r in with_kwh(rows, last["energy"]):
            t.add_row(*(str(x) for x in r))
        return t

    with Live(frame(), console=out.rich_console(), auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(frame(), refresh=True)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def with_kwh(rows: list[list[Any]], energy: dict[str, Any] | None) -> list[list[Any]]:
    """`top`'s rows: each node's kWh so far (its GPUs, plus its CPU packages where RAPL was read, marked)
    beside the watts; "-" where the node has no energy data (never 0)."""
    per = {n.get("node"): n for n in (energy or {}).get("nodes") or []}
    out_rows = []
    for r in rows:
        n = per.get(r[0]) or {}
        gpu, host = n.get("kwh"), n.get("host_kwh")
        if gpu is None and host is None:
            cell = "-"
        else:
            cell = f"{(gpu or 0.0) + (host or 0.0):.4g} kWh" + (" (incl. CPU)" if host is not None else "")
        out_rows.append([*r[:6], cell, *r[6:]])
    return out_rows
