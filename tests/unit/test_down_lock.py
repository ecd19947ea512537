"""`down` looks its cluster up under the cluster's lock: an `up`/`down` of the same name that finished just
before it took the lock is seen, never a stale row (which used to hit `UNIQUE constraint failed`)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gtrain.api as api
from gtrain import locks


def _gtrain(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr


def test_down_sees_the_cluster_an_up_made_while_it_waited_for_the_lock(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: race\n")
    _gtrain("up", str(spec))
    real = locks.cluster_lock

    @contextlib.contextmanager
    def racing_lock(home: Path, cluster: str, what: str) -> Iterator[None]:
        if what == "down":  # another shell's `down` + `up` of the name land just before ours takes the lock
            _gtrain("down", cluster)
            _gtrain("up", str(spec))
        with real(home, cluster, what):
            yield

    monkeypatch.setattr(locks, "cluster_lock", racing_lock)
    res = api.down("race")
    assert not res.already_down
    assert api.status(refresh=False) == []  # no live cluster left: ours went down, not a stale row
