"""Start-up of a 2-node x 2-process torchrun launch on this machine, static rendezvous (what gtrain renders:
group rank = node rank) against c10d (group ranks in join order), alternating, with a one-line bash rank
script: from starting both agents to every rank having run, and where global rank 0 ran.

    python bench/bench_rendezvous.py [TRIALS]
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_SH = 'echo "$NODE" > "$OUT/rank-$RANK"\n'


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(backend: str, tmp: Path, trial: int) -> tuple[float, str]:
    out = tmp / f"{backend}-{trial}"
    out.mkdir()
    port = _port()
    t0 = time.monotonic()
    procs = []
    for node in (1, 0):
        flags = [f"--rdzv_backend={backend}", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=b{trial}"]
        flags += [f"--node_rank={node}"] if backend == "static" else []
        if backend == "c10d":  # both agents on one address: say which hosts the store
            flags += [f"--rdzv_conf=is_host={'true' if node == 0 else 'false'}"]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2", *flags,
             "--max_restarts=0", "--no-python", "bash", str(tmp / "rank.sh")],
            env={"PATH": "/usr/bin:/bin", "OUT": str(out), "NODE": str(node)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for p in procs:
        p.wait(timeout=120)
    return time.monotonic() - t0, (out / "rank-0").read_text().strip()


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "rank.sh").write_text(RANK_SH)
        got: dict[str, list[tuple[float, str]]] = {"static": [], "c10d": []}
        for t in range(trials):
            for backend in ("static", "c10d"):
                got[backend].append(one(backend, tmp, t))
        for backend, runs in got.items():
            secs = [s for s, _ in runs]
            print(f"{backend:6} median {statistics.median(secs):.2f}s (min {min(secs):.2f}, max {max(secs):.2f}) "
                  f"over {trials}; global rank 0 on node(s) {[n for _, n in runs]}")


if __name__ == "__main__":
    main()
