"""The idle watch of one cluster's node counts that cluster's jobs only: on a machine that holds nodes of
several clusters (shared ssh hosts, the test machine), another cluster's job neither keeps it up nor hides it."""

from __future__ import annotations

import os
import subprocess
import sys

from gtrain.remote import nodeside


def test_only_the_watched_clusters_jobs_keep_the_node_busy(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, "GTRAIN_JOB_ID": "j-other", "GTRAIN_CLUSTER": "other"})
    mine = None
    try:
        monkeypatch.setenv("GTRAIN_IDLE_CLUSTER", "mine")
        busy = nodeside._busy()
        assert busy is None or f"job process {other.pid}" not in busy
        mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                env={**os.environ, "GTRAIN_JOB_ID": "j-mine", "GTRAIN_CLUSTER": "mine"})
        import time

        deadline = time.monotonic() + 10
        while nodeside._busy() != f"job process {mine.pid}":
            assert time.monotonic() < deadline, nodeside._busy()
            time.sleep(0.05)
        monkeypatch.delenv("GTRAIN_IDLE_CLUSTER")  # no cluster named: any gtrain job counts, as before
        assert (nodeside._busy() or "").startswith("job process")
    finally:
        for p in (other, mine):
            if p is not None:
                p.kill()
                p.wait()
