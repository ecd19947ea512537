"""The run archive's layout and its timeline of events: where each cluster's and job's kept files live under
``$GTRAIN_HOME/runs/``, and ``events.jsonl`` (up, launch, recovery, preflight, down). Files only: the core
records events here without loading the archive's readers."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gtrain import redact

__all__ = ["EVENT_KINDS", "cluster_dir", "job_dir", "kept_log", "read_events", "read_kept_log", "record_event",
           "runs_root", "write_kept_log"]

EVENT_KINDS = ("up", "launch", "recovery", "preflight", "down")


def runs_root(home: Path) -> Path:
    return Path(home) / "runs"


def cluster_dir(home: Path, cluster_id: str) -> Path:
    return runs_root(home) / cluster_id


def job_dir(home: Path, cluster_id: str, job_id: str) -> Path:
    return cluster_dir(home, cluster_id) / "jobs" / job_id


def kept_log(home: Path, cluster_id: str, job_id: str, node: int) -> Path:
    """Node K's kept lines of a job: ``logs/node-K.log``, one ``TAG<TAB>TEXT`` line each (TAG: global rank, or -)."""
    return job_dir(home, cluster_id, job_id) / "logs" / f"node-{node}.log"


def write_kept_log(path: Path, lines: Iterable[tuple[int | None, str]]) -> int:
    """Write (rank, text) lines to ``path`` (through a temporary file, secrets scrubbed); returns how many."""
    n = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for rank, text in lines:
                f.write(f"{'-' if rank is None else rank}\t{redact.scrub(text)}\n")
                n += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return n


def read_kept_log(path: Path) -> Iterator[tuple[int | None, str]]:
    """The (rank, text) lines :func:`write_kept_log` wrote (none when there is no such file)."""
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as f:  # a \r stays in its line
            for raw in f:
                tag, _, text = raw.rstrip("\n").partition("\t")
                yield (int(tag) if tag.isdigit() else None), text
    except FileNotFoundError:
        return


def record_event(home: Path, cluster_id: str, kind: str, *, t: float | None = None, **fields: Any) -> dict[str, Any]:
    """Append one event to the cluster's timeline: ``{"t": epoch, "kind": KIND, ...fields}``. ``kind`` is one of
    :data:`EVENT_KINDS` (others are kept too, and shown as they are); usual fields: ``job``, ``node``, ``msg``,
    ``ok`` (preflight), ``market``."""
    rec = {"t": time.time() if t is None else t, "kind": kind, **fields}
    d = cluster_dir(home, cluster_id)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "events.jsonl", "a", encoding="utf-8") as f:
        f.write(redact.scrub(json.dumps(redact.scrub_obj(rec), separators=(",", ":"), default=str)) + "\n")
    return rec


def read_events(home: Path, cluster_id: str) -> list[dict[str, Any]]:
    path = cluster_dir(home, cluster_id) / "events.jsonl"
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("t"), int | float) and "kind" in rec:
                    out.append(rec)
    except FileNotFoundError:
        pass
    return sorted(out, key=lambda e: e["t"])
