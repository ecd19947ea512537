"""The report's data model: one job's metrics, GPU samples, cost lines, events, spec and summary, read from
its archive folder (:mod:`gtrain.runlog.archive`) and the state store. The full data stays in the archive;
:func:`downsample` makes what is drawn."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.runlog.parse import ParseStats, Point, has_tensorboard, parse_kv_lines, read_jsonl, read_tensorboard

if TYPE_CHECKING:
    from gtrain.costs.report import CostLine

#: ranks drawn per metric (the lowest ones)
MAX_RANKS = 8


@dataclass
class Series:
    """One metric of one rank, in logging order. ``x`` is the step (or the record's index when none)."""

    metric: str
    rank: int
    x: list[float] = field(default_factory=list)
    y: list[float | None] = field(default_factory=list)
    t: list[float | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.x)

    @property
    def last(self) -> float | None:
        return next((v for v in reversed(self.y) if v is not None), None)

    @property
    def best(self) -> float | None:
        vals = [v for v in self.y if v is not None]
        return min(vals) if vals else None


@dataclass
class GpuSeries:
    node: int
    gpu: int
    t: list[float] = field(default_factory=list)
    util: list[float | None] = field(default_factory=list)
    mem_used: list[float | None] = field(default_factory=list)
    mem_total: float | None = None


@dataclass
class RunData:
    cluster: dict[str, Any]
    job: dict[str, Any]
    spec: dict[str, Any] = field(default_factory=dict)
    series: list[Series] = field(default_factory=list)
    gpus: list[GpuSeries] = field(default_factory=list)
    costs: list[CostLine] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    stats: ParseStats = field(default_factory=ParseStats)
    notes: list[str] = field(default_factory=list)
    archive: str = ""

    def metrics(self) -> list[str]:
        """Metric names, in the order they first appear."""
        return list(dict.fromkeys(s.metric for s in self.series))

    def of(self, metric: str) -> list[Series]:
        """The series of ``metric``, lowest rank first (at most :data:`MAX_RANKS`)."""
        return sorted((s for s in self.series if s.metric == metric), key=lambda s: s.rank)[:MAX_RANKS]

    @property
    def points(self) -> int:
        return sum(len(s) for s in self.series)

    @property
    def total_usd(self) -> float:
        return round(sum(c.cost_usd for c in self.costs), 6)

    def summary(self) -> dict[str, Any]:
        start = self.job.get("created_at")
        end = self.job.get("ended_at") or (time.time() if start else None)
        final = {}
        for m in self.metrics():
            s = self.of(m)[0]
            final[m] = {"last": s.last, "min": s.best, "points": len(s), "last_step": s.x[-1] if s.x else None}
        return {"status": self.job.get("status"), "exit_code": self.job.get("exit_code"),
                "duration_s": round(end - start, 3) if start and end else None,
                "total_usd": self.total_usd, "estimate": any(c.estimate for c in self.costs),
                "node_hours": round(sum(c.hours for c in self.costs), 6), "metrics": final,
                "points": self.points}


def series_from_points(points: Iterable[Point]) -> list[Series]:
    by: dict[tuple[str, int], Series] = {}
    for p in points:
        s = by.get((p.metric, p.rank))
        if s is None:
            s = by[(p.metric, p.rank)] = Series(p.metric, p.rank)
        s.x.append(p.step if p.step is not None else float(len(s.x)))
        s.y.append(p.value)
        s.t.append(p.t)
    return list(by.values())


def _rank_of(path: Path, default: int) -> int:
    tail = path.stem.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else default


def read_gpus(folder: Path) -> list[GpuSeries]:
    """Telemetry samples ``node-K.jsonl``: ``{"t", "gpu", "util", "mem_used", "mem_total"}`` per line."""
    out: dict[tuple[int, int], GpuSeries] = {}
    for path in sorted(folder.glob("node-*.jsonl")):
        node = _rank_of(path, 0)
        with open(path, "rb") as f:
            for raw in f:
                try:
                    rec = json.loads(raw)
                    t = float(rec["t"])
                except (ValueError, KeyError, TypeError):
                    continue
                gpu = rec.get("gpu", 0)
                g = out.get((node, gpu)) or out.setdefault((node, gpu), GpuSeries(node, int(gpu)))
                g.t.append(t)
                g.util.append(_f(rec.get("util")))
                g.mem_used.append(_f(rec.get("mem_used")))
                if _f(rec.get("mem_total")) is not None:
                    g.mem_total = _f(rec.get("mem_total"))
    return [out[k] for k in sorted(out)]


def _f(v: Any) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def derived_events(cluster: dict[str, Any], job: dict[str, Any], recorded: Sequence[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """The recorded events, plus up/launch/down from the state store's times when none was recorded."""
    kinds = {e.get("kind") for e in recorded}
    extra: list[dict[str, Any]] = []
    if "up" not in kinds and cluster.get("created_at"):
        extra.append({"t": cluster["created_at"], "kind": "up", "derived": True})
    if "launch" not in kinds and job.get("created_at"):
        extra.append({"t": job["created_at"], "kind": "launch", "job": job.get("id"), "derived": True})
    if job.get("ended_at"):
        extra.append({"t": job["ended_at"], "kind": "end", "job": job.get("id"),
                      "msg": f"{job.get('status')} (exit {job.get('exit_code')})", "derived": True})
    if "down" not in kinds and cluster.get("terminated_at"):
        extra.append({"t": cluster["terminated_at"], "kind": "down", "derived": True})
    return sorted([*recorded, *extra], key=lambda e: float(e["t"]))


def load_metrics(folder: Path, *, log_keys: Sequence[str] = (), stats: ParseStats | None = None,
                 notes: list[str] | None = None) -> list[Series]:
    """Every metric of a job's archive folder: ``metrics/rank-R.jsonl``, TensorBoard event files (when the
    reader is installed) and, for ``log_keys``, rank 0's log lines."""
    st = stats if stats is not None else ParseStats()
    points: list[Point] = []
    for path in sorted((folder / "metrics").glob("*.jsonl"), key=lambda p: _rank_of(p, 0)):
        points += read_jsonl(path, rank=_rank_of(path, 0), stats=st)
    tb = sorted((folder / "tensorboard").rglob("events.out.tfevents.*"))
    if tb and has_tensorboard():
        for path in tb:
            points += read_tensorboard(path, stats=st)
    elif tb and notes is not None:
        notes.append(f"{len(tb)} TensorBoard event file(s) kept but not read: pip install 'gtrain[tensorboard]'")
    if log_keys:
        points += parse_kv_lines(_rank0_lines(folder), log_keys, stats=st)
    return series_from_points(points)


def _rank0_lines(folder: Path) -> Iterable[str]:
    for path in sorted((folder / "logs").glob("node-*.log")):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("0\t"):
                    yield line[2:]


def load_run(folder: Path, cluster: dict[str, Any], job: dict[str, Any], *, costs: Sequence[CostLine] = (),
             events: Sequence[dict[str, Any]] = (), log_keys: Sequence[str] = ()) -> RunData:
    run = RunData(cluster=cluster, job=job, spec=cluster.get("spec") or {}, archive=str(folder))
    run.series = load_metrics(folder, log_keys=log_keys, stats=run.stats, notes=run.notes)
    run.gpus = read_gpus(folder / "telemetry")
    run.costs = list(costs)
    run.events = derived_events(cluster, job, [e for e in events if e.get("job") in (None, job.get("id"))])
    if run.stats.skipped:
        run.notes.append(f"{run.stats.skipped} metric line(s) were not JSON objects and were skipped")
    return run


def downsample(x: Sequence[float], y: Sequence[float | None], n: int) -> tuple[list[float], list[float]]:
    """At most ``n`` points to draw: each of ``n // 2`` buckets keeps its lowest and highest value (spikes
    stay visible), in order. Gaps (None) are dropped."""
    pts = [(a, b) for a, b in zip(x, y, strict=False) if b is not None]
    if len(pts) <= n:
        return [p[0] for p in pts], [p[1] for p in pts]
    buckets = max(1, n // 2)
    size = len(pts) / buckets
    ox: list[float] = []
    oy: list[float] = []
    for b in range(buckets):
        chunk = pts[int(b * size):int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(range(len(chunk)), key=lambda i: chunk[i][1])
        hi = max(range(len(chunk)), key=lambda i: chunk[i][1])
        for i in sorted({lo, hi}):
            ox.append(chunk[i][0])
            oy.append(chunk[i][1])
    return ox, oy


def cost_curves(costs: Sequence[CostLine], now: float | None = None
                ) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """Cumulative cost over time per (node, market): (t, usd) points, a straight line over each interval."""
    now = now or time.time()
    out: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    per_node: dict[int, float] = defaultdict(float)
    for c in sorted(costs, key=lambda c: c.started_at):
        key = (c.node_rank, c.market or "on-demand")
        start, stop = c.started_at, c.stopped_at or now
        acc = per_node[c.node_rank]
        out[key] += [(start, acc), (max(start, stop), acc + c.cost_usd)]
        per_node[c.node_rank] = acc + c.cost_usd
    return dict(out)
