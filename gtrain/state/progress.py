"""A run's progress and world size, from what its ranks wrote and what the job record holds; no server.

Two halves, both standard library only:

- :func:`scan` reads a job's ``metrics/`` folder (``rank-R.jsonl``, written by :func:`gtrain.metrics.log`):
  each rank's newest ``(t, step)`` samples and its newest ``total_steps`` hint, from the last
  :data:`TAIL_BYTES` of each file (and its first :data:`TAIL_BYTES` when the tail names no total). It runs ON a
  node too: this file's source is sent there (``python3 - scan JOB/metrics``) and answers one JSON document, as
  :mod:`gtrain.remote.nodeside` does; the run archive's copy of the folder is read the same way.
- :func:`progress` (pure: samples in, figures out) gives the current step, the rate over a recent window, the
  ETA and the percent done; :func:`world_sizes` the job's world size over time from ``job.info["world_sizes"]``
  (``[unix_time, nodes, ranks]`` entries; absent: ``num_nodes x nproc_per_node`` for the whole run).

A resume from a checkpoint shows as the step falling back: each stretch between two fall-backs (or a pause far
longer than the run's usual interval) is a *segment*; the rate is measured in the newest one only.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

__all__ = ["Progress", "WorldSize", "combine", "describe", "duration", "progress", "scan", "segments",
           "world_line", "world_sizes"]

#: bytes read from the end (and, for the total, the start) of each metrics file
TAIL_BYTES = 64 * 1024
#: samples kept per rank (the newest)
MAX_SAMPLES = 512
#: the rate is measured over the newest samples within this many seconds of the last ...
WINDOW_S = 120.0
#: ... and over at least this many samples (when the segment has them)
MIN_POINTS = 5
#: a pause longer than this many usual intervals (and :data:`GAP_MIN_S`) starts a new segment
GAP_FACTOR = 20.0
GAP_MIN_S = 30.0
_RANK_FILE = re.compile(r"^rank-(\d+)\.jsonl$")

if TYPE_CHECKING:
    Sample = tuple[float, float]


# ---- reading the files (on a node, or the archive's copy) ------------------------------------------------

def _num(v: object) -> float | None:
    # what runs on a node keeps to Python 3.8 (a tuple here, no zip(strict=)): the node's python3 is not ours
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _records(data: bytes, cut: bool) -> list[dict[str, Any]]:
    """The JSON objects of ``data``'s lines: its whole lines in one decode (fast), else line by line; ``cut``:
    ``data`` starts mid-file, so its first line is a piece. A last line still being written is skipped."""
    lines = data.split(b"\n")
    whole, last = [ln for ln in lines[1 if cut else 0:-1] if ln.strip()], lines[-1]
    try:
        recs = json.loads(b"[" + b",".join(whole) + b"]")
    except ValueError:
        recs = []
        for line in whole:
            try:
                recs.append(json.loads(line))
            except ValueError:
                continue  # not JSON: skipped, as the report's reader does
    if last.strip():
        try:
            recs.append(json.loads(last))  # a writer that ends its last line with no newline
        except ValueError:
            pass
    return [r for r in recs if isinstance(r, dict)]


def _read_file(path: str, tail_bytes: int, max_samples: int) -> dict[str, Any]:
    """One rank file: its newest samples ``[[t, step], ...]``, newest total and that total's time."""
    samples: list[list[float]] = []
    total = total_t = None
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - tail_bytes))
        tail = f.read(tail_bytes)
        head = b""
        if size > tail_bytes:
            f.seek(0)
            head = f.read(min(tail_bytes, size - tail_bytes))
    for rec in _records(tail, size > tail_bytes):
        t, step, tot = _num(rec.get("t", rec.get("time"))), _num(rec.get("step")), _num(rec.get("total_steps"))
        if t is not None and step is not None:
            samples.append([t, step])
        if tot is not None and tot > 0:
            total, total_t = tot, t
    if total is None and head:
        for rec in _records(head, False):
            tot = _num(rec.get("total_steps"))
            if tot is not None and tot > 0:
                total, total_t = tot, _num(rec.get("t", rec.get("time")))
    return {"samples": samples[-max_samples:], "total": total, "total_t": total_t, "bytes": size}


def scan(folder: str, tail_bytes: str | int = TAIL_BYTES, max_samples: str | int = MAX_SAMPLES) -> dict[str, Any]:
    """Every ``rank-R.jsonl`` of ``folder``: ``{"ranks": {"R": {"samples", "total", "total_t", "bytes"}},
    "time"}``. The lowest rank here keeps its samples; the others only their newest (a node of 8 ranks answers
    in a few KB). Missing folder: no ranks."""
    out: dict[str, Any] = {"ranks": {}, "time": time.time()}
    try:
        names = sorted((int(m.group(1)), n) for n in os.listdir(folder) if (m := _RANK_FILE.match(n)))
    except OSError:
        return out
    for i, (rank, name) in enumerate(names):
        try:  # the others' newest sample and total are in their last lines
            got = _read_file(os.path.join(folder, name), int(tail_bytes) if i == 0 else min(int(tail_bytes), 8192),
                             int(max_samples) if i == 0 else 1)
        except OSError:
            continue
        out["ranks"][str(rank)] = got
    return out


def combine(answers: Iterable[Mapping[str, Any] | None]) -> tuple[list[Sample], float | None]:
    """The samples to measure (rank 0's; else the lowest rank that has any), merged over every node that
    holds a file of that rank (an elastic run may move rank 0), and the newest total hint of that rank (else of
    any rank)."""
    by_rank: dict[int, list[Sample]] = {}
    totals: list[tuple[float, float, int]] = []
    for doc in answers:
        for key, r in ((doc or {}).get("ranks") or {}).items():
            if not (isinstance(r, Mapping) and str(key).isdigit()):
                continue
            pts = [(float(s[0]), float(s[1])) for s in r.get("samples") or []
                   if isinstance(s, list | tuple) and len(s) == 2 and _num(s[0]) is not None and _num(s[1]) is not None]
            by_rank.setdefault(int(key), []).extend(pts)
            tot = _num(r.get("total"))
            if tot is not None and tot > 0:
                totals.append((_num(r.get("total_t")) or 0.0, tot, int(key)))
    with_samples = sorted(k for k, v in by_rank.items() if v)
    samples = sorted(by_rank[with_samples[0]], key=lambda s: s[0]) if with_samples else []
    own = [x for x in totals if with_samples and x[2] == with_samples[0]] or totals
    return samples, (max(own)[1] if own else None)


# ---- the figures (pure) ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Progress:
    step: float | None = None
    total: float | None = None
    #: steps per second over the newest samples (:data:`WINDOW_S`) of the newest segment
    rate: float | None = None
    #: seconds from the newest sample to ``total`` at ``rate`` (0 once there)
    eta_s: float | None = None
    percent: float | None = None
    #: time of the newest sample, and how long before ``now`` it was
    updated_at: float | None = None
    age_s: float | None = None
    #: how often the step fell back (a resume from an older checkpoint)
    restarts: int = 0
    #: steps done per second of training over every segment (the whole run's pace)
    mean_rate: float | None = None

    @property
    def known(self) -> bool:
        return self.step is not None

    @property
    def eta_at(self) -> float | None:
        return None if self.eta_s is None or self.updated_at is None else self.updated_at + self.eta_s

    def to_dict(self) -> dict[str, Any]:
        d = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        d["eta_at"] = None if self.eta_at is None else round(self.eta_at, 3)
        return d


def _clean(samples: Iterable[Sequence[float]]) -> list[Sample]:
    out = []
    for s in samples:
        t, step = _num(s[0]), _num(s[1])
        if t is not None and step is not None:
            out.append((t, step))
    return out


def segments(samples: Iterable[Sequence[float]]) -> list[list[Sample]]:
    """The samples (in time order) cut where the step falls back, or where a pause is far longer than the run's
    usual interval between samples (:data:`GAP_FACTOR`, at least :data:`GAP_MIN_S`)."""
    pts = _clean(samples)
    if not pts:
        return []
    gaps = [b[0] - a[0] for a, b in zip(pts, pts[1:], strict=False) if b[0] > a[0]]
    limit = max(GAP_MIN_S, GAP_FACTOR * sorted(gaps)[len(gaps) // 2]) if gaps else math.inf
    out = [[pts[0]]]
    for prev, cur in zip(pts, pts[1:], strict=False):
        if cur[1] < prev[1] or cur[0] - prev[0] > limit:
            out.append([cur])
        else:
            out[-1].append(cur)
    return out


def _rate(seg: Sequence[Sample], window_s: float) -> float | None:
    if len(seg) < 2:
        return None
    t_last = seg[-1][0]
    i = len(seg) - 1
    while i > 0 and (seg[i - 1][0] >= t_last - window_s or len(seg) - i < MIN_POINTS):
        i -= 1
    (t0, s0), (t1, s1) = seg[i], seg[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def progress(samples: Iterable[Sequence[float]], total: float | None = None, *, now: float | None = None,
             window_s: float = WINDOW_S) -> Progress:
    """The figures of ``samples`` (``(t, step)`` pairs, oldest first) against ``total`` (None: no ETA, no
    percent). The step is the newest sample's; the rate comes from the newest segment (the one before it when
    the newest has a single sample: a resume just logged its first step)."""
    segs = segments(samples)
    total = _num(total)
    total = total if total is not None and total > 0 else None
    if not segs:
        return Progress(total=total)
    t_last, step = segs[-1][-1]
    rate = None
    for seg in reversed(segs):
        rate = _rate(seg, window_s)
        if rate is not None:
            break
    rate = rate if rate is not None and rate >= 0 else None
    done = sum(seg[-1][1] - seg[0][1] for seg in segs)
    spent = sum(seg[-1][0] - seg[0][0] for seg in segs)
    eta = percent = None
    if total is not None:
        percent = min(100.0, max(0.0, 100.0 * step / total))
        if step >= total:
            eta = 0.0
        elif rate:
            eta = (total - step) / rate
    restarts = sum(1 for a, b in zip(segs, segs[1:], strict=False) if b[0][1] < a[-1][1])
    now = time.time() if now is None else now
    return Progress(step, total, rate, eta, percent, t_last, max(0.0, now - t_last), restarts,
                    done / spent if spent > 0 and done >= 0 else None)


@dataclass(frozen=True)
class WorldSize:
    since: float | None
    nodes: int | None
    ranks: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(v: object) -> int | None:
    n = _num(v)
    return int(n) if n is not None and n >= 0 and n == int(n) else None


def world_sizes(info: Mapping[str, Any] | None, *, num_nodes: int | None = None, nproc_per_node: int | None = None,
                started_at: float | None = None) -> list[WorldSize]:
    """The job's world size over time, oldest first: ``info["world_sizes"]`` (``[unix_time, nodes, ranks]``
    entries; malformed ones are skipped) when it has any, else one entry of ``num_nodes`` nodes and
    ``num_nodes x nproc_per_node`` ranks (``info``'s own ``num_nodes`` / ``nproc_per_node`` first) since
    ``started_at``. Empty when nothing is known."""
    info = info if isinstance(info, Mapping) else {}
    out = []
    raw = info.get("world_sizes")
    for e in raw if isinstance(raw, list) else []:
        if isinstance(e, list | tuple) and len(e) >= 3 and _num(e[0]) is not None:
            nodes, ranks = _int(e[1]), _int(e[2])
            if nodes is not None or ranks is not None:
                out.append(WorldSize(float(e[0]), nodes, ranks))
    if out:
        return sorted(out, key=lambda w: w.since or 0.0)
    nodes = _int(info.get("num_nodes")) or _int(num_nodes)
    nproc = _int(info.get("nproc_per_node")) or _int(nproc_per_node)
    if nodes is None:
        return []
    return [WorldSize(_num(started_at), nodes, nodes * nproc if nproc else None)]


# ---- words ---------------------------------------------------------------------------------------------

def duration(seconds: float | None) -> str:
    """``45s``, ``12m 05s``, ``3h 02m``, ``2d 04h``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _n(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"


def rate_text(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.3g} steps/s" if rate >= 0.1 or rate == 0 else f"{rate * 60:.3g} steps/min"


def describe(p: Progress | Mapping[str, Any] | None, *, live: bool = True) -> str:
    """One line: ``step 1200/5000 (24.0%) · 3.41 steps/s · ETA 18m 34s``; ``live``: the ETA and a stale
    newest step's age are said (a finished job's are not). "-" when no step was logged."""
    if isinstance(p, Mapping):
        p = Progress(**{k: v for k, v in p.items() if k in Progress.__dataclass_fields__})
    if p is None or p.step is None:
        return "-"
    parts = [f"step {_n(p.step)}" + (f"/{_n(p.total)} ({p.percent:.1f}%)" if p.total and p.percent is not None else "")]
    if p.rate is not None:
        parts.append(rate_text(p.rate))
    if live and p.eta_s is not None and p.total and p.step < p.total:
        parts.append(f"ETA {duration(p.eta_s)}")
    if p.restarts:
        parts.append(f"{p.restarts} resume(s)")
    if live and p.age_s is not None and p.age_s >= 60:
        parts.append(f"last step {duration(p.age_s)} ago")
    return " · ".join(parts)


def world_line(w: WorldSize | Mapping[str, Any] | None) -> str:
    """``2 nodes, 8 ranks`` (``-`` when unknown)."""
    if isinstance(w, Mapping):
        w = WorldSize(w.get("since"), w.get("nodes"), w.get("ranks"))
    if w is None or (w.nodes is None and w.ranks is None):
        return "-"
    nodes = "-" if w.nodes is None else f"{w.nodes} node{'s' if w.nodes != 1 else ''}"
    return nodes + ("" if w.ranks is None else f", {w.ranks} rank{'s' if w.ranks != 1 else ''}")


if __name__ == "__main__":  # on a node: python3 - scan FOLDER [TAIL_BYTES] [MAX_SAMPLES]
    print(json.dumps({"scan": scan}[sys.argv[1]](*sys.argv[2:])))
