"""One gtrain at a time per cluster: an advisory lock file held by the live process.

``up``, ``launch`` and ``down`` of a cluster hold ``$GTRAIN_HOME/locks/<name>.lock`` (``flock``) while they
change it, so two ``gtrain launch`` cannot both start a job and two ``gtrain up`` cannot both provision. The
kernel drops the lock when its process dies, so a killed gtrain never leaves a stale lock; the pid and command
written in the file only make the message exact. With a shared state (``GTRAIN_STATE``) the lock also takes
the cluster's lease object there (``gtrain.sharedstate.lease``), so two machines exclude each other too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gtrain.errors import JobConflict


class ClusterBusy(JobConflict):
    """Another live gtrain process is changing the cluster (exit 2)."""


def lock_path(home: Path, cluster: str) -> Path:
    return home / "locks" / f"{cluster}.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def cluster_lock(home: Path, cluster: str, what: str) -> Iterator[None]:
    """Hold the cluster's lock for the block; :class:`ClusterBusy` at once when a live process holds it.
    Re-entrant within one process (``run`` = up + launch + down, ``launch --force`` cancelling)."""
    path = lock_path(home, cluster)
    held = _HELD.get(str(path))
    if held is not None:
        _HELD[str(path)] = (held[0], held[1] + 1)
        try:
            yield
        finally:
            fd, n = _HELD[str(path)]
            _HELD[str(path)] = (fd, n - 1)
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(path, cluster) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "what": what, "since": time.time()}).encode())
        lease = _take_lease(home, cluster, what)
        _HELD[str(path)] = (fd, 1)
        try:
            yield
        finally:
            _HELD.pop(str(path), None)
            if lease is not None:
                lease.release()
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


#: `--break-lock`: the next lease taken in this process is taken whatever its expiry says
BREAK_LOCK = False


def _take_lease(home: Path, cluster: str, what: str) -> Any:
    from gtrain.sharedstate import remote

    store = remote(home)
    if store is None:
        return None
    from gtrain.sharedstate.lease import Lease, LeaseBusy

    global BREAK_LOCK
    lease = Lease(store, cluster, what)
    try:
        lease.take(break_lock=BREAK_LOCK)
    except LeaseBusy as e:
        raise ClusterBusy(e.message, hint=e.hint) from None
    BREAK_LOCK = False
    return lease


def _busy(path: Path, cluster: str) -> ClusterBusy:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    pid, what = info.get("pid"), info.get("what", "a command")
    who = f"pid {pid}, `gtrain {what}`" if isinstance(pid, int) and _alive(pid) else "another process"
    return ClusterBusy(f"another gtrain is working on cluster {cluster!r} ({who})",
                       hint="wait for it to finish, then run this again")


#: locks this process holds: path -> (fd, depth)
_HELD: dict[str, tuple[int, int]] = {}
