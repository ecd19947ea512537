"""One racer of tests/integration/test_shared_state.py::test_two_machines_race_up_and_launch: for each trial,
wait for its start time, then either create cluster ``race-N`` under its lock (as `gtrain up` does) or, as
`gtrain launch` does, under the lock of cluster ``shared`` refuse when trial N's job is already running there
and else start it; print one JSON line per trial: ``{"trial": N, "kind": ..., "won": bool, "exit": code,
"took": seconds}``. The loser is refused by the lease (the other holds it) or, when it came after the winner
let go, by what the winner left (the name taken, the job running): exit 2 either way.

Usage: python state_racer.py START_EPOCH TRIALS GAP_S HOLD_S (GTRAIN_HOME / GTRAIN_STATE set by the caller).
"""

from __future__ import annotations

import json
import os
import sys
import time

from gtrain.errors import GtrainError, JobConflict
from gtrain.locks import cluster_lock
from gtrain.sharedstate import open_store
from gtrain.state import gtrain_home


def main() -> None:
    start, trials, gap, hold = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    store = open_store()
    home = gtrain_home()
    for n in range(trials):
        kind = "up" if n % 2 == 0 else "launch"
        name = f"race-{n}" if kind == "up" else "shared"
        time.sleep(max(0.0, start + n * gap - time.time()))
        t0 = time.monotonic()
        try:
            with cluster_lock(home, name, kind):
                if kind == "up":
                    store.create_cluster(name=name, provider="local", num_nodes=1, spec={"name": name})
                else:
                    store.pull(force=True)  # type: ignore[attr-defined]
                    cluster = store.get_cluster(name)
                    if any(j.info.get("trial") == n and j.status == "running" for j in store.jobs(cluster.id)):
                        raise JobConflict(f"trial {n}'s job is already running on {name!r}")
                    store.create_job(cluster.id, f"shared-{n}-{os.getpid()}", {"trial": n})
                    store.update_job(f"shared-{n}-{os.getpid()}", status="running")
                time.sleep(hold)
            won, code = True, 0
        except GtrainError as e:
            won, code = False, e.exit_code
            took = time.monotonic() - t0
        else:
            took = time.monotonic() - t0 - hold
        print(json.dumps({"trial": n, "kind": kind, "won": won, "exit": code, "took": round(took, 3)}), flush=True)
    store.close()


if __name__ == "__main__":
    main()
