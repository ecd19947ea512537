"""Where a secret could leak to on this machine: the argv and environment of every process (a test's check that a
webhook URL or SMTP password stays in one process's memory)."""

from __future__ import annotations

import os
from collections.abc import Callable


def procs_holding(needle: bytes, *, laptops_env: Callable[[bytes], bool] = lambda argv: False) -> list[str]:
    """``PID/cmdline`` or ``PID/environ`` of every process (but this one) whose argv or environment holds
    ``needle``. The environment of a process ``laptops_env(its argv)`` says is the user's own is not counted (the
    user's environment holds the secret by design); its argv always is."""
    hits = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read()
            if needle in argv:
                hits.append(f"{d}/cmdline")
            if laptops_env(argv):
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read():
                    hits.append(f"{d}/environ")
        except OSError:
            continue
    return hits
