"""Line charts as inline SVG (no script, no fetch): axes with round ticks, one ``<polyline>`` per line
(``data-points`` says how many points it has), a legend, and vertical markers (recoveries, launches)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


@dataclass
class Line:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    color: str = ""
    dash: bool = False


@dataclass
class Marker:
    x: float
    label: str
    color: str = "#b00"


@dataclass
class Chart:
    title: str
    lines: list[Line]
    x_label: str = "step"
    y_label: str = ""
    markers: list[Marker] = field(default_factory=list)
    kind: str = "metric"  # metric | cost | gpu: a data attribute the report's tests and styles use
    width: int = 760
    height: int = 280


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out = []
    v = first
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.2e}"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.4g}"


def _bounds(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if lo == hi:
        pad = abs(lo) * 0.05 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def render(chart: Chart) -> str:
    W, H = chart.width, chart.height
    left, right, top, bottom = 64, 16, 28, 40
    pw, ph = W - left - right, H - top - bottom
    xs = [v for ln in chart.lines for v in ln.x] + [m.x for m in chart.markers]
    ys = [v for ln in chart.lines for v in ln.y]
    title = escape(chart.title)
    head = (f'<svg class="chart" data-kind="{escape(chart.kind)}" data-title="{title}" role="img" '
            f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}">'
            f'<title>{title}</title><text class="ct" x="{left}" y="18">{title}</text>')
    if not xs or not ys:
        return head + f'<text class="empty" x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text></svg>'
    x0, x1 = _bounds(xs)
    y0, y1 = _bounds(ys)

    def sx(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def sy(v: float) -> float:
        return top + ph - (v - y0) / (y1 - y0) * ph

    parts = [head, f'<rect class="plot" x="{left}" y="{top}" width="{pw}" height="{ph}"/>']
    for t in nice_ticks(y0, y1):
        y = sy(t)
        parts.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    for t in nice_ticks(x0, x1, 6):
        x = sx(t)
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{fmt(t)}</text>')
    parts.append(f'<text class="axis" x="{left + pw / 2}" y="{H - 6}" text-anchor="middle">'
                 f'{escape(chart.x_label)}</text>')
    if chart.y_label:
        parts.append(f'<text class="axis" transform="rotate(-90)" x="{-(top + ph / 2)}" y="14" '
                     f'text-anchor="middle">{escape(chart.y_label)}</text>')
    for m in chart.markers:
        x = sx(m.x)
        parts.append(f'<g class="marker" data-label="{escape(m.label)}"><line x1="{x:.1f}" x2="{x:.1f}" '
                     f'y1="{top}" y2="{top + ph}" stroke="{m.color}" stroke-dasharray="4 3"/>'
                     f'<title>{escape(m.label)}</title></g>')
    for i, ln in enumerate(chart.lines):
        color = ln.color or PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in zip(ln.x, ln.y, strict=False))
        dash = ' stroke-dasharray="6 3"' if ln.dash else ""
        parts.append(f'<polyline class="series" data-label="{escape(ln.label)}" data-points="{len(ln.x)}" '
                     f'fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{pts}">'
                     f'<title>{escape(ln.label)}</title></polyline>')
        ly = top + 4 + 14 * i
        parts.append(f'<g class="legend"><line x1="{left + pw - 150}" x2="{left + pw - 134}" y1="{ly + 6}" '
                     f'y2="{ly + 6}" stroke="{color}" stroke-width="2"{dash}/><text x="{left + pw - 130}" '
                     f'y="{ly + 10}">{escape(ln.label)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
