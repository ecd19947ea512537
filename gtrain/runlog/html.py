"""The HTML report: one self-contained file (inline CSS and SVG, no script, a Content-Security-Policy that
forbids every fetch), from :class:`~gtrain.runlog.model.RunData`."""

from __future__ import annotations

import json
import time
from functools import lru_cache
from typing import Any

from gtrain.runlog import svg
from gtrain.runlog.model import RunData, cost_curves, downsample

#: points drawn per line at most (the archive keeps every point)
DISPLAY_POINTS = 1200
#: points drawn over all metric lines at most (~12 bytes each: the report stays well under 2 MB)
POINT_BUDGET = 100_000
EVENT_COLORS = {"recovery": "#d62728", "launch": "#2ca02c", "preflight": "#9467bd", "up": "#1f77b4",
                "down": "#555", "end": "#ff7f0e"}


@lru_cache(maxsize=1)
def _template() -> Any:
    import jinja2

    from gtrain.jobs.render import templates_dir

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir() / "report")),
                             autoescape=True)
    return env.get_template("report.html.j2")


def _fmt(v: Any) -> str:
    return "-" if v is None else svg.fmt(float(v))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def metric_charts(run: RunData, points: int = DISPLAY_POINTS) -> list[svg.Chart]:
    """A chart per metric, a line per rank; many lines share :data:`POINT_BUDGET` (the file stays small)."""
    charts = []
    lines_total = sum(len(run.of(m)) for m in run.metrics())
    points = max(20, min(points, POINT_BUDGET // max(1, lines_total)))
    for metric in run.metrics():
        lines = []
        for s in run.of(metric):
            x, y = downsample(s.x, s.y, points)
            lines.append(svg.Line(f"rank {s.rank}", x, y))
        charts.append(svg.Chart(metric, lines, x_label="step", kind="metric"))
    return charts


def _origin(run: RunData) -> float:
    starts = [c.started_at for c in run.costs] + [float(e["t"]) for e in run.events]
    return min(starts) if starts else float(run.cluster.get("created_at") or time.time())


def _markers(run: RunData, t0: float, kinds: tuple[str, ...] = ("recovery", "launch", "preflight")) -> list[svg.Marker]:
    return [svg.Marker((float(e["t"]) - t0) / 60, f"{e['kind']}" + (f" node {e['node']}" if "node" in e else ""),
                       EVENT_COLORS.get(str(e["kind"]), "#b00"))
            for e in run.events if e.get("kind") in kinds]


def cost_chart(run: RunData) -> svg.Chart:
    t0 = _origin(run)
    end = run.cluster.get("terminated_at") or time.time()
    lines = []
    for (node, market), pts in sorted(cost_curves(run.costs, end).items()):
        lines.append(svg.Line(f"node {node} ({market})", [(t - t0) / 60 for t, _ in pts], [c for _, c in pts],
                              svg.PALETTE[node % len(svg.PALETTE)], dash=market == "spot"))
    return svg.Chart("cumulative cost per node (USD; spot dashed)", lines, x_label="minutes since up", kind="cost",
                     markers=_markers(run, t0))


def gpu_charts(run: RunData, points: int = DISPLAY_POINTS) -> list[svg.Chart]:
    if not run.gpus:
        return []
    t0 = _origin(run)
    util, mem, power = [], [], []
    for g in run.gpus:
        x = [(t - t0) / 60 for t in g.t]
        label = f"node {g.node} gpu {g.gpu}"
        ux, uy = downsample(x, g.util, points)
        mx, my = downsample(x, g.mem_used, points)
        if ux:
            util.append(svg.Line(label, ux, uy))
        if mx:
            mem.append(svg.Line(label, mx, my))
        px, py = downsample(x, g.power, points)
        if px:
            power.append(svg.Line(label, px, py))
    markers = _markers(run, t0, ("recovery",))
    return [svg.Chart("GPU utilisation (%)", util, x_label="minutes since up", kind="gpu", markers=markers),
            svg.Chart("GPU memory used", mem, x_label="minutes since up", kind="gpu", markers=markers)] + (
        [svg.Chart("GPU power draw (W)", power, x_label="minutes since up", kind="power", markers=markers)]
        if power else [])


def step_chart(run: RunData, points: int = DISPLAY_POINTS) -> svg.Chart | None:
    """Rank 0's step over time (a resume from a checkpoint shows as a drop), its total dashed."""
    if not run.steps:
        return None
    t0 = _origin(run)
    x, y = downsample([(t - t0) / 60 for t, _ in run.steps], [s for _, s in run.steps], points)
    lines = [svg.Line("step", x, y)]
    total = (run.progress or {}).get("total")
    if total and x:
        lines.append(svg.Line("total_steps", [x[0], x[-1]], [float(total)] * 2, "#888", dash=True))
    return svg.Chart("step (rank 0)", lines, x_label="minutes since up", kind="progress",
                     markers=_markers(run, t0, ("recovery", "launch")))


def world_rows(run: RunData) -> list[dict[str, Any]]:
    """The world size over time as table rows: since (UTC), +min, nodes, ranks."""
    t0 = _origin(run)
    return [{"when": "-" if w.get("since") is None else time.strftime("%Y-%m-%d %H:%M:%S",
                                                                      time.gmtime(float(w["since"]))),
             "rel": "-" if w.get("since") is None else f"{(float(w['since']) - t0) / 60:.1f}",
             "nodes": "-" if w.get("nodes") is None else w["nodes"],
             "ranks": "-" if w.get("ranks") is None else w["ranks"]} for w in run.world_sizes]


def _events(run: RunData) -> list[dict[str, Any]]:
    t0 = _origin(run)
    out = []
    for e in run.events:
        t = float(e["t"])
        detail = {k: v for k, v in e.items() if k not in ("t", "kind", "node", "derived")}
        text = str(detail.pop("msg", "")) or ", ".join(f"{k}={v}" for k, v in detail.items())
        out.append({"kind": e["kind"], "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)),
                    "rel": f"{(t - t0) / 60:.1f}", "node": e.get("node", ""),
                    "detail": text + (" (from the state store)" if e.get("derived") else "")})
    return out


def render_report(run: RunData) -> str:
    """The report as one HTML document."""
    from importlib.metadata import PackageNotFoundError, version

    from gtrain.errors import DIST

    try:
        __version__ = version(DIST)
    except PackageNotFoundError:
        __version__ = "dev"

    from gtrain.state.progress import describe, world_line

    summary = run.summary()
    steps = step_chart(run)
    return str(_template().render(
        progress=describe(run.progress, live=run.job.get("status") in ("running", "pending", "recovering")),
        world=world_line(run.world_sizes[-1]) if run.world_sizes else "-", world_rows=world_rows(run),
        step_chart=svg.render(steps) if steps else None,
        cluster=run.cluster, job=run.job, summary=summary, duration=_duration(summary["duration_s"]),
        fmt=_fmt, notes=run.notes, version=__version__,
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        metric_charts=[svg.render(c) for c in metric_charts(run)], cost_chart=svg.render(cost_chart(run)),
        gpu_charts=[svg.render(c) for c in gpu_charts(run)], events=_events(run),
        spec_json=json.dumps(run.spec, indent=2, sort_keys=True, default=str), archive=run.archive))
