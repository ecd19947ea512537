"""Shipped to node 0 of a torchft job (``job.fault_tolerance: torchft``) as ``JOB/torchft_lighthouse.py``: runs
torchft's Lighthouse until SIGTERM/SIGINT/SIGHUP (launch.sh stops it when the job ends or is cancelled).

Usage: torchft_lighthouse.py BIND MIN_REPLICAS JOIN_TIMEOUT_MS QUORUM_TICK_MS HEARTBEAT_TIMEOUT_MS. The
Lighthouse is torchft's own (``torchft.coordination.LighthouseServer``, what ``torchft_lighthouse`` runs),
started through its Python API so that the job's interpreter finds it wherever its scripts live. It prints
``lighthouse at URL`` once it listens."""

from __future__ import annotations

import signal
import sys
import threading


def main() -> int:
    bind, min_replicas, join_ms, tick_ms, heartbeat_ms = sys.argv[1:6]
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=bind, min_replicas=int(min_replicas), join_timeout_ms=int(join_ms),
                              quorum_tick_ms=int(tick_ms), heartbeat_timeout_ms=int(heartbeat_ms))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    print(f"lighthouse at {server.address()} (bind {bind})", flush=True)
    while not stop.wait(3600):
        pass
    server.shutdown()
    print("lighthouse stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
