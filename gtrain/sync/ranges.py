"""Parallel ranged downloads written in place, for any store whose backend can fetch a byte range.

Every range of ``part_size`` goes through the pool as one GET whose body is written at its offset as it
streams in (``pwrite``; no range is held in memory whole). The sha256 of the whole (and the md5 where it is
asked for) is computed in order by the calling thread while the ranges arrive: it reads back, from the page
cache, what the ranges have written contiguously past the point it has hashed, so hashing overlaps the
transfer and no second pass over the file follows it. Stdlib only (it runs on nodes too)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import wait
from pathlib import Path
from typing import TYPE_CHECKING

from gtrain.errors import SyncError
from gtrain.sync.model import Digests

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

# ``fetch(first, last)``: the bytes ``first..last`` (inclusive) of the object, as one buffer or as an iterable of
# buffers in order (a stream); a stream that breaks is the fetcher's to resume or to raise
Fetch = Callable[[int, int], "bytes | memoryview | Iterable[bytes | memoryview]"]
_HASH_BLOCK = 4 << 20


def download_ranges(pool: ThreadPoolExecutor, dest: Path, size: int, part_size: int, fetch: Fetch,
                    progress: Callable[[int], None], *, want_md5: bool, where: str) -> Digests:
    """Download ``size`` bytes into ``dest`` as ranges of ``part_size`` fetched through ``pool``. Returns the
    content's digests (md5 "" unless ``want_md5``)."""
    offs = list(range(0, size, part_size))
    written = [0] * len(offs)  # bytes each range has written contiguously from its start
    cond = threading.Condition()
    wlock = threading.Lock()
    stop = threading.Event()  # set when the download ends either way: a range still streaming stops at its next chunk
    fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)  # read back to hash
    try:
        os.ftruncate(fd, size)

        def one(i: int) -> None:
            off = offs[i]
            end = min(off + part_size, size)
            body = fetch(off, end - 1)
            pos = off
            for chunk in ((body,) if isinstance(body, bytes | bytearray | memoryview) else body):
                if stop.is_set():
                    return
                mv = memoryview(chunk).cast("B")
                if pos + len(mv) > end:
                    raise SyncError(f"{where}: range {off}-{end - 1} came back longer than asked",
                                    hint="the transfer broke or the object changed; re-run")
                while mv:
                    with wlock:  # one writer at a time: concurrent writes to one file spin on its inode's lock
                        n = os.pwrite(fd, mv, pos)
                    pos += n
                    progress(n)
                    mv = mv[n:]
                with cond:
                    written[i] = pos - off
                    cond.notify()
            if pos != end:
                raise SyncError(f"{where}: range {off}-{end - 1} came back with {pos - off} bytes",
                                hint="the transfer broke or the object changed; re-run")

        def woken(_: Future[None]) -> None:
            with cond:
                cond.notify()

        futures = [pool.submit(one, i) for i in range(len(offs))]
        for f in futures:
            f.add_done_callback(woken)
        try:
            digests = _hash_in_order(fd, size, part_size, offs, written, cond, futures, want_md5)
        finally:
            stop.set()
            for f in futures:
                f.cancel()
            wait(futures)  # none may write to the fd (a number the OS hands out again) once it is closed
    finally:
        os.close(fd)
    if digests is None:  # a range failed: its error is the one to tell
        for f in futures:
            if not f.cancelled() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        raise SyncError(f"{where}: the download stopped short", hint="re-run")  # pragma: no cover
    return digests


def _hash_in_order(fd: int, size: int, part_size: int, offs: list[int], written: list[int],
                   cond: threading.Condition, futures: list[Future[None]], want_md5: bool) -> Digests | None:
    """Hash ``fd`` from 0 to ``size`` as the ranges fill it in; None as soon as one range failed."""
    sha = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False) if want_md5 else None
    buf = bytearray(_HASH_BLOCK)
    view = memoryview(buf)
    hashed, i = 0, 0
    while hashed < size:
        with cond:
            while True:
                frontier = offs[i] + written[i]
                if frontier > hashed:
                    break
                if any(f.done() and not f.cancelled() and f.exception() is not None for f in futures):
                    return None
                cond.wait(1.0)
        while hashed < frontier:
            n = os.preadv(fd, [view[:min(frontier - hashed, _HASH_BLOCK)]], hashed)
            if n <= 0:
                raise OSError(f"reading back the downloaded file ended at byte {hashed}")
            sha.update(view[:n])
            if md5 is not None:
                md5.update(view[:n])
            hashed += n
        if hashed >= min(offs[i] + part_size, size):
            i += 1
    return Digests(sha.hexdigest(), md5.hexdigest() if md5 is not None else "")

