"""SIGTERM and SIGHUP are Ctrl+C: CI cancellation, ``timeout``, systemd and a closed terminal send them, and each
must end a command the way Ctrl+C does -- ``run`` tears down, ``up`` rolls back, nothing left billing.

:func:`install` (called by the CLI) makes SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (a
``KeyboardInterrupt``, so every ``finally`` and ``except KeyboardInterrupt`` in gtrain treats them alike) in the
main thread. Inside :func:`deferred` -- teardown -- a signal does not raise: it is remembered and raised when
the block ends, so a second signal stops waiting but never leaves a cluster half-deleted.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_state = threading.local()
_pending: list[int] = []
_on_deferred: list[Callable[[int], None]] = []
_last: list[int] = []


class Interrupted(KeyboardInterrupt):
    """A signal asked gtrain to stop. ``exit_code`` is the shell's: 128 + the signal number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code_of(exc: BaseException) -> int:
    """128 + the signal that stopped us (the exception may have been re-raised as a plain KeyboardInterrupt by
    a library on the way out, so the last signal received decides); 130 for a bare KeyboardInterrupt."""
    if isinstance(exc, Interrupted):
        return exc.exit_code
    return 128 + _last[0] if _last else 130


def _depth() -> int:
    return int(getattr(_state, "depth", 0))


def _handler(signum: int, _frame: FrameType | None) -> None:
    _last[:] = [signum]
    if _depth() > 0:
        _pending.append(signum)
        for cb in list(_on_deferred):
            with contextlib.suppress(Exception):
                cb(signum)
        return
    raise Interrupted(signum)


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP to :class:`Interrupted` (main thread only; a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in HANDLED:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, _handler)


@contextlib.contextmanager
def deferred(on_signal: Callable[[int], None] | None = None) -> Iterator[None]:
    """Run the block to its end whatever signal arrives; raise the first one that did, after it."""
    _state.depth = _depth() + 1
    if on_signal is not None:
        _on_deferred.append(on_signal)
    try:
        yield
    finally:
        _state.depth = _depth() - 1
        if on_signal is not None:
            _on_deferred.remove(on_signal)
        if _depth() == 0 and _pending:
            signum = _pending[0]
            _pending.clear()
            raise Interrupted(signum)
