"""Metric sources, each parsed into :class:`Point` records.

- JSON lines (``gtrain.metrics.log`` or any program): one object per line; ``step`` and ``t`` optional, every
  other number is a metric. A torn last line (a rank still writing) and lines that are not JSON objects are
  skipped and counted, never fatal.
- ``key=value`` / ``key: value`` / ``key value`` in log lines, opt-in and only for the keys asked for (a
  script that cannot change: ``step 10 loss=0.52``). The step is the line's ``step``/``iter``/``it`` number,
  else the count of matching lines.
- TensorBoard event files, when ``tensorboard`` is installed (the ``[tensorboard]`` extra); without it they
  are listed as skipped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: keys of a metrics record that are not metrics
RESERVED = frozenset({"t", "step", "rank", "node", "time", "timestamp", "total_steps"})


@dataclass(frozen=True, slots=True)
class Point:
    metric: str
    step: float | None
    value: float | None  # None: NaN/inf (a gap in the line)
    t: float | None = None
    rank: int = 0


@dataclass
class ParseStats:
    lines: int = 0
    points: int = 0
    skipped: int = 0


def _num(v: object) -> float | None | bool:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        f = float(v)
        return f if math.isfinite(f) else None
    if v is None:
        return None
    return False


def record_values(rec: dict[str, object], rank: int) -> tuple[float | None, float | None, int,
                                                              list[tuple[str, float | None]]]:
    """(step, t, rank, [(metric, value)]) of one JSON-lines record; None values are gaps (null, NaN, inf)."""
    step = _num(rec.get("step"))
    t = _num(rec.get("t", rec.get("time")))
    r = rec.get("rank", rank)
    r = r if isinstance(r, int) and not isinstance(r, bool) else rank
    values = []
    for key, value in rec.items():
        if key in RESERVED:
            continue
        v = _num(value)
        if v is not False:
            values.append((key, v))
    return (step if isinstance(step, float) else None, t if isinstance(t, float) else None, r,
            values)  # type: ignore[return-value]  # v is float | None once False is filtered out


def jsonl_records(data: bytes | Iterable[str | bytes], stats: ParseStats) -> list[dict[str, object]]:
    """The JSON objects of JSON lines: the whole text in one decode when every line is sound (fast), else
    line by line, skipping what is not an object."""
    if isinstance(data, bytes | bytearray):
        lines = [ln for ln in bytes(data).split(b"\n") if ln.strip()]
        try:
            recs = json.loads(b"[" + b",".join(lines) + b"]")
            if all(isinstance(r, dict) for r in recs):
                stats.lines += len(lines)
                return recs  # type: ignore[no-any-return]
        except ValueError:
            pass
    else:
        lines = list(data)  # type: ignore[arg-type]
    out = []
    for raw in lines:
        stats.lines += 1
        try:
            rec = json.loads(raw)
        except ValueError:
            stats.skipped += 1
            continue
        if isinstance(rec, dict):
            out.append(rec)
        else:
            stats.skipped += 1
    return out


def parse_jsonl(lines: Iterable[str | bytes], *, rank: int = 0, stats: ParseStats | None = None) -> Iterator[Point]:
    """Points from JSON lines; ``rank`` is used when a record has none."""
    st = stats if stats is not None else ParseStats()
    for rec in jsonl_records(lines, st):
        step, t, r, values = record_values(rec, rank)
        for key, v in values:
            st.points += 1
            yield Point(key, step, v, t, r)


def read_jsonl(path: Path, *, rank: int = 0, stats: ParseStats | None = None) -> list[Point]:
    with open(path, "rb") as f:
        return list(parse_jsonl(f, rank=rank, stats=stats))


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
_STEP_KEYS = ("step", "iter", "it", "iteration")


def kv_pattern(keys: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching ``key=value``, ``key: value`` and ``key value`` for the given keys (and the step keys)."""
    names = sorted({*keys, *_STEP_KEYS}, key=len, reverse=True)
    alt = "|".join(re.escape(k) for k in names)
    return re.compile(rf"(?<![\w.])({alt})(?:\s*[=:]\s*|\s+)({_NUMBER})(?![\w.])", re.IGNORECASE)


def parse_kv_lines(lines: Iterable[str], keys: Iterable[str], *, rank: int = 0,
                   stats: ParseStats | None = None) -> Iterator[Point]:
    """Points for ``keys`` found in free-form log lines (opt-in: only the keys asked for are read)."""
    wanted = {k.lower(): k for k in keys}
    if not wanted:
        return
    pat = kv_pattern(wanted.values())
    st = stats if stats is not None else ParseStats()
    count = 0
    for line in lines:
        st.lines += 1
        found = pat.findall(line)
        if not found:
            continue
        values: dict[str, float | None] = {}
        step: float | None = None
        for key, raw in found:
            f = float(raw)
            v = f if math.isfinite(f) else None
            lk = key.lower()
            if lk in wanted:
                values.setdefault(wanted[lk], v)
            elif step is None and v is not None:
                step = v
        if not values:
            continue
        count += 1
        for key, v in values.items():
            st.points += 1
            yield Point(key, step if step is not None else float(count), v, None, rank)


def has_tensorboard() -> bool:
    try:
        import tensorboard.backend.event_processing.event_file_loader  # noqa: F401
    except ImportError:
        return False
    return True


def read_tensorboard(path: Path, *, rank: int = 0, stats: ParseStats | None = None) -> list[Point]:
    """Scalar points of one TensorBoard event file (``tensorboard`` must be installed: :func:`has_tensorboard`)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    st = stats if stats is not None else ParseStats()
    out: list[Point] = []
    for event in EventFileLoader(str(path)).Load():
        st.lines += 1
        if not event.HasField("summary"):
            continue
        for v in event.summary.value:
            if v.HasField("simple_value"):
                value = float(v.simple_value)
            elif v.HasField("tensor"):
                try:
                    value = float(tensor_util.make_ndarray(v.tensor).item())
                except (ValueError, TypeError):
                    st.skipped += 1
                    continue
            else:
                continue
            st.points += 1
            out.append(Point(v.tag, float(event.step), value if math.isfinite(value) else None,
                             float(event.wall_time), rank))
    return out
