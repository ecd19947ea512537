"""gtrain.sync.ranges: parallel ranged downloads streamed into place and hashed in order as they arrive."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gtrain.errors import SyncError
from gtrain.sync.ranges import download_ranges

KiB = 1024


def _data(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def _streaming(data: bytes, chunk: int, seed: int) -> tuple[object, list[tuple[int, int]]]:
    """A fetch that streams each range in ``chunk`` pieces with random pauses, so ranges land out of order."""
    rnd, lock, asked = random.Random(seed), threading.Lock(), []

    def fetch(first: int, last: int) -> Iterator[bytes]:
        with lock:
            asked.append((first, last))
            pauses = [rnd.random() / 200 for _ in range(0, last + 1 - first, chunk)]
        for k, off in enumerate(range(first, last + 1, chunk)):
            time.sleep(pauses[k])
            yield data[off:min(off + chunk, last + 1)]

    return fetch, asked


@pytest.mark.parametrize("want_md5", [False, True])
def test_ranges_that_arrive_out_of_order_are_written_in_place_and_hashed_in_order(tmp_path: Path,
                                                                                  want_md5: bool) -> None:
    data = _data(1000 * KiB + 7)
    fetch, asked = _streaming(data, 13 * KiB, seed=1)
    got: list[int] = []
    with ThreadPoolExecutor(8) as pool:
        d = download_ranges(pool, tmp_path / "f", len(data), 64 * KiB, fetch, got.append,  # type: ignore[arg-type]
                            want_md5=want_md5, where="s3://b/k")
    assert (tmp_path / "f").read_bytes() == data
    assert d.sha256 == hashlib.sha256(data).hexdigest()
    assert d.md5 == (hashlib.md5(data).hexdigest() if want_md5 else "")
    assert sum(got) == len(data)
    assert sorted(asked) == [(o, min(o + 64 * KiB, len(data)) - 1) for o in range(0, len(data), 64 * KiB)]


def test_a_whole_buffer_per_range_works_as_a_stream_does(tmp_path: Path) -> None:
    data = _data(300 * KiB)
    with ThreadPoolExecutor(4) as pool:
        d = download_ranges(pool, tmp_path / "f", len(data), 64 * KiB, lambda a, b: data[a:b + 1], lambda n: None,
                            want_md5=False, where="w")
    assert (tmp_path / "f").read_bytes() == data and d.sha256 == hashlib.sha256(data).hexdigest()


def test_a_range_that_comes_back_short_fails_naming_it(tmp_path: Path) -> None:
    data = _data(256 * KiB)

    def fetch(first: int, last: int) -> bytes:
        return data[first:last] if first == 128 * KiB else data[first:last + 1]  # one byte short

    with ThreadPoolExecutor(4) as pool, pytest.raises(SyncError, match=r"s3://b/k: range 131072-196607 came back "
                                                                          r"with 65535 bytes"):
        download_ranges(pool, tmp_path / "f", len(data), 64 * KiB, fetch, lambda n: None, want_md5=False,
                        where="s3://b/k")


def test_a_range_that_fails_stops_the_others_and_nothing_writes_after_the_return(tmp_path: Path) -> None:
    """The failure is raised as it is; a range still streaming stops at its next chunk, and no range writes once
    the call returned (the descriptor's number would be someone else's by then)."""
    size, chunks_after = 512 * KiB, []
    returned = threading.Event()

    def fetch(first: int, last: int) -> Iterator[bytes]:
        if first == 64 * KiB:
            time.sleep(0.05)
            raise ConnectionResetError("the store hung up")
        for off in range(first, last + 1, 4 * KiB):  # slow: 16 chunks of 60 ms per range
            time.sleep(0.06)
            if returned.is_set():
                chunks_after.append(off)
            yield bytes(4 * KiB)

    with ThreadPoolExecutor(8) as pool:
        t0 = time.monotonic()
        with pytest.raises(ConnectionResetError, match="hung up"):
            download_ranges(pool, tmp_path / "f", size, 64 * KiB, fetch, lambda n: None, want_md5=False, where="x")
        returned.set()
        took = time.monotonic() - t0
        pool.shutdown(wait=True)
    assert chunks_after == []
    assert took < 0.7  # the slow ranges (~1 s each) were stopped, not waited out
    assert os.listdir(tmp_path) == ["f"]


def test_a_range_longer_than_asked_is_refused(tmp_path: Path) -> None:
    data = _data(128 * KiB)
    with ThreadPoolExecutor(2) as pool, pytest.raises(SyncError, match="longer than asked"):
        download_ranges(pool, tmp_path / "f", len(data), 64 * KiB, lambda a, b: data[a:b + 2] + b"x",
                        lambda n: None, want_md5=False, where="x")
