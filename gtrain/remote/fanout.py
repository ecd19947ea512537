"""Run one function per node in parallel, results in node order: a sliding window sized to this machine.

A node's work is mostly waiting on the network; what costs this machine is the SSH handshake's crypto (CPU),
one socket and a few pipes per node in flight (file descriptors), and a thread each. The window is how many
nodes are worked on at once: as one finishes the next starts (a ``ThreadPoolExecutor`` of that many workers
takes the next item as soon as a worker is free). Its size (:func:`window_size`):

* ``GTRAIN_FANOUT_WINDOW`` when set (a positive integer; docs/scale.md);
* else ``16 x os.cpu_count()`` (the threads wait on I/O), between 8 and 256;
* and never more than the open-file limit allows: each node in flight holds up to ``FDS_PER_NODE``
  descriptors (its socket, an rsync's pipes) and pooled connections stay open after their node's turn, so the
  soft ``RLIMIT_NOFILE`` is raised towards the hard one first (:func:`raise_fd_limit`).

Above a threshold of nodes, the commands whose per-node work is one shell command go through relays instead
(:mod:`gtrain.remote.tree`); this module is the flat path and the one the relays' fallbacks use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gtrain.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

ENV_WINDOW = "GTRAIN_FANOUT_WINDOW"
#: threads per CPU: the work is waiting on sockets, the CPU part is each handshake's crypto
PER_CPU = 16
MIN_WINDOW, MAX_WINDOW = 8, 256
#: descriptors one node in flight may hold (socket, rsync's ssh and its pipes)
FDS_PER_NODE = 8
#: descriptors kept for everything else (the state database, logs, the terminal)
FD_RESERVE = 64
#: how far the soft open-file limit is raised (never above the hard limit)
FD_TARGET = 65536

#: kept for callers that passed it explicitly; the default is now :func:`window_size`
MAX_WORKERS = MAX_WINDOW


def raise_fd_limit(target: int = FD_TARGET) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` towards ``min(target, hard)``; return the soft limit now in force.
    Pooled SSH connections stay open for the whole command: 1,000 nodes need more than the usual 1,024."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return int(soft) if soft != resource.RLIM_INFINITY else FD_TARGET


def window_size(*, cpus: int | None = None, fd_limit: int | None = None, env: str | None = None) -> int:
    """How many nodes are worked on at once (see the module's docstring). ``GTRAIN_FANOUT_WINDOW`` (or
    ``env``) wins when set; a value that is not a positive integer is a ConfigError naming it."""
    raw = os.environ.get(ENV_WINDOW) if env is None else env
    if raw is not None and raw.strip():
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"{ENV_WINDOW}={raw!r} is not a positive integer",
                              hint=f"set {ENV_WINDOW} to how many nodes to work on at once (e.g. 64), or unset it")
        return n
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    n = max(MIN_WINDOW, min(MAX_WINDOW, PER_CPU * max(1, cpus)))
    fds = fd_limit if fd_limit is not None else raise_fd_limit()
    by_fds = max(1, (fds - FD_RESERVE) // FDS_PER_NODE)
    return max(1, min(n, by_fds))


def parallel(fn: Callable[[T], R], items: Sequence[T], *, max_workers: int | None = None) -> list[R]:
    """Call ``fn`` on every item, at most ``max_workers`` (default :func:`window_size`) at once; return the
    results in order. The first exception (in item order) is raised after every call has finished, so no
    node is left half-done behind our back."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    window = max_workers if max_workers is not None else window_size()
    with ThreadPoolExecutor(max_workers=max(1, min(window, len(items))), thread_name_prefix="gtrain-node") as ex:
        futures = [ex.submit(fn, i) for i in items]
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]
