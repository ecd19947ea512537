"""The report's data model: one job's metrics, GPU samples, cost lines, events, spec and summary, read from
its archive folder (:mod:`gtrain.runlog.archive`) and the state store. The full data stays in the archive;
:func:`downsample` makes what is drawn."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import install_hint
from gtrain.runlog.parse import (
    ParseStats,
    Point,
    has_tensorboard,
    jsonl_records,
    parse_kv_lines,
    read_tensorboard,
    record_values,
)

if TYPE_CHECKING:
    from gtrain.costs.report import CostLine

#: ranks drawn per metric (the lowest ones)
MAX_RANKS = 8
#: the format of the parsed-metrics cache (``ARCHIVE/.cache/``); another version is parsed again
CACHE_VERSION = 2


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
    power: list[float | None] = field(default_factory=list)


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
    #: gtrain.health.energy.Energy.to_dict() of the job's telemetry (kwh None: no energy data)
    energy: dict[str, Any] = field(default_factory=dict)
    #: rank 0's (t, step) samples, and gtrain.state.progress.Progress.to_dict() of them (None: no step logged)
    steps: list[tuple[float, float]] = field(default_factory=list)
    progress: dict[str, Any] | None = None
    #: the job's world size over time (gtrain.state.progress.WorldSize dicts; the job dict's ``world_sizes``)
    world_sizes: list[dict[str, Any]] = field(default_factory=list)

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
                "points": self.points, "energy": self.energy or None, "progress": self.progress,
                "world_size": self.world_sizes[-1] if self.world_sizes else None, "world_sizes": self.world_sizes}


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
                if "host" in rec:  # the node's RAPL counters (gtrain.health.energy), not a GPU
                    continue
                gpu = rec.get("gpu", 0)
                g = out.get((node, gpu)) or out.setdefault((node, gpu), GpuSeries(node, int(gpu)))
                g.t.append(t)
                g.util.append(_f(rec.get("util")))
                g.mem_used.append(_f(rec.get("mem_used")))
                g.power.append(_f(rec.get("power")))
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


def _merge(into: dict[tuple[str, int], Series], series: Iterable[Series]) -> None:
    for s in series:
        have = into.get((s.metric, s.rank))
        if have is None:
            into[(s.metric, s.rank)] = s
        else:
            have.x += s.x
            have.y += s.y
            have.t += s.t


def _nan(values: list[Any]) -> array[float]:
    return array("d", [math.nan if v is None else v for v in values])


def _unnan(a: array[float]) -> list[float | None]:
    return [None if v != v else v for v in a.tolist()]


def _read_cache(cache: Path, size: int) -> dict[str, Any] | None:
    """The cached columns of a metrics file: a JSON header line, then each series' x, y and t as doubles
    (NaN for a gap); None when missing, of another version, or covering more than the file has now."""
    try:
        raw = cache.read_bytes()
        nl = raw.index(b"\n")
        head = json.loads(raw[:nl])
        if head.get("v") != CACHE_VERSION or not 0 <= head["offset"] <= size:
            return None
        pos, cols = nl + 1, {}
        for key, n in head["series"]:
            parts = []
            for _ in range(3):
                a = array("d")
                a.frombytes(raw[pos:pos + 8 * n])
                pos += 8 * n
                parts.append(a)
            cols[key] = [parts[0].tolist(), _unnan(parts[1]), _unnan(parts[2])]
        head["series"] = cols
        return dict(head)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(cache: Path, state: dict[str, Any]) -> None:
    cols = state["series"]
    head = {**state, "series": [[k, len(c[0])] for k, c in cols.items()]}
    body = b"".join(array("d", c[0]).tobytes() + _nan(c[1]).tobytes() + _nan(c[2]).tobytes() for c in cols.values())
    with contextlib.suppress(OSError):  # a read-only archive: parse again next time
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_name(cache.name + ".tmp")
        tmp.write_bytes(json.dumps(head, separators=(",", ":")).encode() + b"\n" + body)
        os.replace(tmp, cache)


def read_metrics_file(path: Path, rank: int, cache_dir: Path | None, stats: ParseStats) -> list[Series]:
    """One JSON-lines file's series. The parsed columns are cached in ``cache_dir`` with the byte offset they
    cover, so a later read (the next report, each `plot --follow` frame) parses only the lines added since."""
    cache = cache_dir / f"{path.name}.cols" if cache_dir is not None else None
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64).decode("latin-1")  # a file rewritten in place (not appended to) is parsed again
    state = _read_cache(cache, size) if cache is not None else None
    if state is None or not head.startswith(state.get("head", "")[:len(head)]):
        state = {"v": CACHE_VERSION, "offset": 0, "lines": 0, "skipped": 0, "series": {}, "head": head}
    state["head"] = head
    if state["offset"] < size:
        with open(path, "rb") as f:
            f.seek(state["offset"])
            data = f.read(size - state["offset"])
        end = data.rfind(b"\n") + 1  # a torn last line waits for its end
        if end:
            st = ParseStats()
            cols: dict[str, list[list[Any]]] = state["series"]
            for rec in jsonl_records(data[:end], st):
                step, t, r, values = record_values(rec, rank)
                for key, v in values:
                    col = cols.get(f"{key}\t{r}")
                    if col is None:
                        col = cols[f"{key}\t{r}"] = [[], [], []]
                    col[0].append(step if step is not None else float(len(col[0])))
                    col[1].append(v)
                    col[2].append(t)
            state["offset"] += end
            state["lines"] += st.lines
            state["skipped"] += st.skipped
            if cache is not None:
                _write_cache(cache, state)
    out = []
    for key, (x, y, t) in state["series"].items():
        metric, _, r = key.rpartition("\t")
        out.append(Series(metric, int(r), x, y, t))
        stats.points += len(x)
    stats.lines += state["lines"]
    stats.skipped += state["skipped"]
    return out


def load_metrics(folder: Path, *, log_keys: Sequence[str] = (), stats: ParseStats | None = None,
                 notes: list[str] | None = None) -> list[Series]:
    """Every metric of a job's archive folder: ``metrics/rank-R.jsonl``, TensorBoard event files (when the
    reader is installed) and, for ``log_keys``, rank 0's log lines."""
    st = stats if stats is not None else ParseStats()
    by: dict[tuple[str, int], Series] = {}
    cache_dir = folder / ".cache" if folder.is_dir() else None
    for path in sorted((folder / "metrics").glob("*.jsonl"), key=lambda p: _rank_of(p, 0)):
        _merge(by, read_metrics_file(path, _rank_of(path, 0), cache_dir, st))
    points: list[Point] = []
    tb = sorted((folder / "tensorboard").rglob("events.out.tfevents.*"))
    if tb and has_tensorboard():
        for path in tb:
            points += read_tensorboard(path, stats=st)
    elif tb and notes is not None:
        notes.append(f"{len(tb)} TensorBoard event file(s) kept but not read: {install_hint('tensorboard')}")
    if log_keys:
        points += parse_kv_lines(_rank0_lines(folder), log_keys, stats=st)
    _merge(by, series_from_points(points))
    return list(by.values())


def _rank0_lines(folder: Path) -> Iterable[str]:
    for path in sorted((folder / "logs").glob("node-*.log")):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("0\t"):
                    yield line[2:]


def load_run(folder: Path, cluster: dict[str, Any], job: dict[str, Any], *, costs: Sequence[CostLine] = (),
             events: Sequence[dict[str, Any]] = (), log_keys: Sequence[str] = (), gpus: bool = True,
             progress: bool = True) -> RunData:
    run = RunData(cluster=cluster, job=job, spec=cluster.get("spec") or {}, archive=str(folder))
    run.series = load_metrics(folder, log_keys=log_keys, stats=run.stats, notes=run.notes)
    run.gpus = read_gpus(folder / "telemetry") if gpus else []
    run.costs = list(costs)
    run.energy = _energy(folder, cluster)
    run.events = derived_events(cluster, job, [e for e in events if e.get("job") in (None, job.get("id"))])
    if progress:
        run.steps, run.progress = read_progress(folder, job)
    run.world_sizes = [w for w in job.get("world_sizes") or [] if isinstance(w, dict)]
    if run.stats.skipped:
        run.notes.append(f"{run.stats.skipped} metric line(s) were not JSON objects and were skipped")
    return run


#: how much of rank 0's kept metrics file the report reads for its steps (the archive keeps at most 64 MiB)
PROGRESS_BYTES = 64 * 2**20
PROGRESS_SAMPLES = 200_000


def read_progress(folder: Path, job: dict[str, Any]) -> tuple[list[tuple[float, float]], dict[str, Any] | None]:
    """Rank 0's (t, step) samples kept in ``folder/metrics`` and their figures (gtrain.state.progress) as of the
    job's end (now while it runs); the total from the files, else the job dict's ``total_hint``."""
    from gtrain.state import progress as pg

    samples, total = pg.combine([pg.scan(str(folder / "metrics"), PROGRESS_BYTES, PROGRESS_SAMPLES)])
    p = pg.progress(samples, total or job.get("total_hint"), now=job.get("ended_at") or None)
    return samples, (p.to_dict() if p.known else None)


def _energy(folder: Path, cluster: dict[str, Any]) -> dict[str, Any]:
    from gtrain.health.energy import from_folders

    spec = cluster.get("spec") or {}
    res = spec.get("resources") or {}
    accel = str(res.get("accelerators") or "")
    region = cluster.get("region") or res.get("region") or (res.get("regions") or [None])[0]
    return from_folders([folder / "telemetry"], gpu_name=accel.split(":")[0] or None, region=region,
                        override=spec.get("energy")).to_dict()


def downsample(x: Sequence[float], y: Sequence[float | None], n: int) -> tuple[list[float], list[float]]:
    """At most ``n`` points to draw: each of ``n // 2`` buckets keeps its lowest and highest value (spikes
    stay visible), in order. Gaps (None) are dropped."""
    xs, ys = list(x), list(y)
    if None in ys:
        keep = [i for i, v in enumerate(ys) if v is not None]
        xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
    vals: list[float] = ys  # type: ignore[assignment]  # no None left
    if len(vals) <= n:
        return xs, vals
    buckets = max(1, n // 2)
    size = len(vals) / buckets
    ox: list[float] = []
    oy: list[float] = []
    for b in range(buckets):
        i, j = int(b * size), int((b + 1) * size)
        if i >= j:
            continue
        chunk = vals[i:j]
        lo, hi = chunk.index(min(chunk)), chunk.index(max(chunk))
        for k in (lo, hi) if lo < hi else (hi, lo) if hi < lo else (lo,):
            ox.append(xs[i + k])
            oy.append(chunk[k])
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
