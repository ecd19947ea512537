"""The per-cluster lock of the shared state: a lease object ``leases/<name>.json`` with an expiry.

Taken with a create-only write (or, once the holder's expiry has passed, a write on the version read), renewed
by a daemon thread every third of :func:`ttl` on its own version, given back by writing it expired. Two
machines that race for it: one write wins, the other gets :class:`LeaseBusy` (``ClusterBusy``, exit 2) at once.
A holder killed with SIGKILL renews nothing, so its lease runs out after the expiry. ``--break-lock`` takes
it whatever the expiry says (with a warning naming the holder): for a holder known to be gone.

The expiry is read on the taker's clock: clocks more than the lease time apart can take a live lease (NTP
keeps machines within well under a second; the default lease is 60 s, ``GTRAIN_LEASE_S``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from typing import Any

from gtrain.sync.condput import CondStore, Conflict

#: names this process holds a lease on -> the lease
_HELD: dict[str, Lease] = {}


def ttl() -> float:
    raw = os.environ.get("GTRAIN_LEASE_S", "60")
    try:
        v = float(raw)
    except ValueError:
        v = 0.0
    if not 1 <= v <= 3600:
        from gtrain.errors import ConfigError

        raise ConfigError(f"GTRAIN_LEASE_S {raw!r} is not a number of seconds from 1 to 3600",
                          hint="unset it (60 s) or give e.g. GTRAIN_LEASE_S=120", field="GTRAIN_LEASE_S")
    return v


def holds(name: str) -> bool:
    return name in _HELD


class Lease:
    def __init__(self, remote: CondStore, name: str, what: str) -> None:
        from gtrain.state.identity import identity

        self.remote, self.name, self.what = remote, name, what
        self.key = f"leases/{name}.json"
        self.ttl = ttl()
        self.token = uuid.uuid4().hex
        self.who = identity()
        self.version = ""
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self, expires: float) -> bytes:
        return json.dumps({"holder": self.who, "pid": os.getpid(), "what": self.what, "token": self.token,
                           "expires": expires}).encode()

    def take(self, *, break_lock: bool = False) -> None:

        body = self._body(time.time() + self.ttl)
        got = self.remote.get(self.key)
        try:
            if got is None:
                self.version = self.remote.put(self.key, body, absent=True)
            else:
                info: dict[str, Any] = json.loads(got.data or b"{}")
                live = float(info.get("expires", 0)) > time.time()
                if live and not break_lock:
                    raise _busy(self.name, info)
                if live:
                    sys.stderr.write(f"warning: --break-lock: taking cluster {self.name!r}'s lease from "
                                     f"{info.get('holder', '?')} (`gtrain {info.get('what', '?')}`, pid "
                                     f"{info.get('pid', '?')}); if that gtrain still runs, both now change the "
                                     "cluster\n")
                self.version = self.remote.put(self.key, body, match=got.version)
        except Conflict:
            now = self.remote.get(self.key)
            raise _busy(self.name, json.loads(now.data) if now else {}) from None
        _HELD[self.name] = self
        self._thread = threading.Thread(target=self._renew, name=f"gtrain-lease-{self.name}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.version = self.remote.put(self.key, self._body(time.time() + self.ttl), match=self.version)
            except Conflict:
                self.lost = True  # broken by --break-lock elsewhere: stop renewing what is not ours
                sys.stderr.write(f"warning: the lease on cluster {self.name!r} was taken by another gtrain "
                                 "(--break-lock)\n")
                return
            except Exception:  # noqa: BLE001, S112 - a blip: the next renewal tries again, well before expiry
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        _HELD.pop(self.name, None)
        if self.lost:
            return
        try:
            self.remote.put(self.key, self._body(0.0), match=self.version)
        except Exception:  # noqa: BLE001, S110 - it runs out on its own
            pass


class LeaseBusy(Exception):
    """Another gtrain holds the lease (``gtrain.locks`` tells it as ``ClusterBusy``, exit 2)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def _busy(name: str, info: dict[str, Any]) -> LeaseBusy:
    until = time.strftime("%H:%M:%S", time.localtime(float(info.get("expires", 0) or 0)))
    who = f"{info.get('holder', '?')}, `gtrain {info.get('what', 'a command')}`"
    return LeaseBusy(f"another gtrain is working on cluster {name!r} ({who}; lease until {until})",
                       hint="wait for it to finish; if that machine is gone, its lease runs out by itself "
                            "(or pass --break-lock)")
