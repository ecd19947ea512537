"""Parallel ranged downloads written in place, for any store whose backend can fetch a byte range: the
sha256 of the whole is computed in order as the ranges arrive (a range waits in memory for those before
it), so no second pass over the file. Stdlib only (it runs on nodes too)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gtrain.errors import SyncError
from gtrain.sync.model import Digests

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


def download_ranges(pool: ThreadPoolExecutor, dest: Path, size: int, part_size: int,
                    fetch: Callable[[int, int], bytes], progress: Callable[[int], None], *,
                    want_md5: bool, where: str) -> Digests:
    """``fetch(first, last)`` returns bytes ``first..last`` (inclusive) of the object; every range of
    ``part_size`` goes through ``pool``. Returns the content's digests (md5 "" unless ``want_md5``)."""
    sha = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False) if want_md5 else None
    waiting: dict[int, bytes] = {}
    state = {"next": 0}
    lock = threading.Lock()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)

        def one(off: int) -> None:
            end = min(off + part_size, size) - 1
            body = fetch(off, end)
            if len(body) != end - off + 1:
                raise SyncError(f"{where}: range {off}-{end} came back with {len(body)} bytes",
                                hint="the transfer broke or the object changed; re-run")
            os.pwrite(fd, body, off)
            progress(len(body))
            with lock:
                waiting[off] = body
                while state["next"] in waiting:
                    chunk = waiting.pop(state["next"])
                    sha.update(chunk)
                    if md5 is not None:
                        md5.update(chunk)
                    state["next"] += len(chunk)

        futures = [pool.submit(one, off) for off in range(0, size, part_size)]
        try:
            for f in futures:
                f.result()
        finally:
            for f in futures:
                f.cancel()
    finally:
        os.close(fd)
    if state["next"] != size:
        raise SyncError(f"{where}: hashed {state['next']} of {size} bytes", hint="re-run")
    return Digests(sha.hexdigest(), md5.hexdigest() if md5 is not None else "")
