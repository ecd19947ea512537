"""gtrain cost."""

from __future__ import annotations

import typer

from gtrain.cli import output as out


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)


def cost(
    json_: bool = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else."),
) -> None:
    """What every cluster ever run cost (running ones: so far)."""
    out.set_json(json_)
    import gtrain.api as api

    reports = api.cost()
    if json_:
        out.emit_json({"clusters": [r.to_dict() for r in reports],
                       "total_usd": round(sum(r.total_usd for r in reports), 6)})
        return
    if not reports:
        out.console().print("no clusters have run yet.")
        return
    rows = []
    for r in reports:
        start = min((ln.started_at for ln in r.lines), default=None)
        stops = [ln.stopped_at for ln in r.lines]
        stop = None if (not stops or None in stops) else max(s for s in stops if s is not None)
        rows.append([r.cluster, r.provider, r.status, out.fmt_time(start), out.fmt_time(stop),
                     f"{r.node_hours:.4f}", out.fmt_usd(r.total_usd) + ("*" if r.estimate else "")])
    out.table("cost history", ["cluster", "provider", "status", "start", "stop", "node-hours", "$"], rows)
    total = sum(r.total_usd for r in reports)
    out.console().print(f"total: {out.fmt_usd(total)}" + ("  (* estimate)" if any(r.estimate for r in reports) else ""))
