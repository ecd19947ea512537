"""Run one function per node in parallel (bounded thread pool), results in node order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 32


def parallel(fn: Callable[[T], R], items: Sequence[T], *, max_workers: int = MAX_WORKERS) -> list[R]:
    """Call ``fn`` on every item at once; return results in order. The first exception (in item order)
    is raised after every call has finished, so no node is left half-done behind our back."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items)), thread_name_prefix="gtrain-node") as ex:
        futures = [ex.submit(fn, i) for i in items]
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]
