"""paramiko logs through :mod:`logging` (``Error reading SSH protocol banner`` and a traceback each time ``up``
knocks on a node whose sshd is still booting). Those records go to gtrain's debug log, the ``gtrain.ssh``
logger: silent unless ``GTRAIN_DEBUG=1``, when they are written to stderr. A program that uses gtrain as a
library and configures logging itself still gets them through the ``gtrain`` logger's propagation."""

from __future__ import annotations

import logging
import os

LOG = logging.getLogger("gtrain.ssh")
_done = False


class _Forward(logging.Handler):
    """Hands paramiko's records to gtrain's logger (under ``gtrain.ssh.paramiko...``)."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(f"gtrain.ssh.{record.name}").handle(record)


def route_paramiko_logs() -> None:
    """Once per process, before paramiko first logs: its loggers stop propagating to the root (where logging's
    last-resort handler prints to stderr) and forward into gtrain's."""
    global _done
    if _done:
        return
    _done = True
    root = logging.getLogger("gtrain")
    if not root.handlers:
        if os.environ.get("GTRAIN_DEBUG") == "1":
            h: logging.Handler = logging.StreamHandler()
            h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
            root.setLevel(logging.DEBUG)
        else:
            h = logging.NullHandler()
        root.addHandler(h)
    pk = logging.getLogger("paramiko")
    pk.propagate = False
    pk.addHandler(_Forward())
