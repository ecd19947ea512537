"""The fan-out's sliding window (gtrain/remote/fanout.py) and the tree's relay blocks (gtrain/remote/tree.py)."""

from __future__ import annotations

import threading
import time

import pytest

from gtrain.errors import ConfigError
from gtrain.remote import fanout, tree


def test_window_follows_the_cpus_within_bounds() -> None:
    assert fanout.window_size(cpus=1, fd_limit=65536, env="") == 16
    assert fanout.window_size(cpus=2, fd_limit=65536, env="") == 32
    assert fanout.window_size(cpus=64, fd_limit=65536, env="") == fanout.MAX_WINDOW


def test_window_never_outruns_the_open_file_limit() -> None:
    # 256 descriptors: 64 kept back, 8 per node in flight -> 24 nodes at once, whatever the CPUs
    assert fanout.window_size(cpus=64, fd_limit=256, env="") == 24
    assert fanout.window_size(cpus=64, fd_limit=10, env="") == 1


def test_window_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fanout.ENV_WINDOW, "5")
    assert fanout.window_size(cpus=64, fd_limit=65536) == 5
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(fanout.ENV_WINDOW, bad)
        with pytest.raises(ConfigError, match=f"GTRAIN_FANOUT_WINDOW='{bad}'"):
            fanout.window_size()


def test_parallel_keeps_at_most_the_window_in_flight_and_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fanout.ENV_WINDOW, "3")
    lock, now, peak = threading.Lock(), [0], [0]

    def work(i: int) -> int:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.01)
        with lock:
            now[0] -= 1
        return i * i

    assert fanout.parallel(work, list(range(20))) == [i * i for i in range(20)]
    assert peak[0] == 3


def test_raise_fd_limit_does_not_lower_it() -> None:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert fanout.raise_fd_limit(16) >= min(soft, 16)
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft


def test_relay_blocks_cover_every_node_once_about_sqrt_n() -> None:
    import math

    for n in (1, 2, 6, 65, 100, 1000):
        blocks = tree.pick_relays(n)
        assert [i for b in blocks for i in b] == list(range(n))  # contiguous ranks, each once, in order
        assert len(blocks) == math.ceil(math.sqrt(n))
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    assert tree.pick_relays(6) == [[0, 1], [2, 3], [4, 5]]
    assert tree.pick_relays(0) == []


def test_tree_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tree.tree_threshold(env="") == tree.DEFAULT_THRESHOLD == 64
    assert tree.tree_threshold(env="2") == 2
    with pytest.raises(ConfigError, match="GTRAIN_TREE_THRESHOLD"):
        tree.tree_threshold(env="x")
