"""gtrain's per-node process spawner, copied to a node as ``JOB/spawn.py`` (stdlib only: a node has python3,
not gtrain). Used by the jax, tensorflow and python launchers.

    python3 spawn.py --flavor python|jax|tensorflow --node-rank K --num-nodes N --nproc P \\
        --master ADDR:PORT --node-ips A,B,... -- bash JOB/rank.sh SCRIPT ARGS...

Starts P processes, local rank 0..P-1, each with ``RANK = K*P + local_rank``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (+ ``JAX_*`` for jax, ``TF_CONFIG`` for
tensorflow). Waits for all; when one exits non-zero the others get SIGTERM (then SIGKILL after a grace), and
the spawner exits with that first non-zero code. SIGTERM/SIGINT/SIGHUP to the spawner go to every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0


def rank_env(flavor: str, node_rank: int, num_nodes: int, nproc: int, master: str, node_ips: list[str],
             local_rank: int) -> dict[str, str]:
    addr, port = master.rsplit(":", 1)
    rank, world = node_rank * nproc + local_rank, num_nodes * nproc
    env = {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node_rank), "NODE_RANK": str(node_rank),
           "MASTER_ADDR": addr, "MASTER_PORT": port}
    if flavor == "jax":
        env.update({"JAX_COORDINATOR_ADDRESS": master, "JAX_NUM_PROCESSES": str(world),
                    "JAX_PROCESS_ID": str(rank)})
    elif flavor == "tensorflow":
        # one worker per rank, in rank order; worker r listens on MASTER_PORT + r on its node's address
        workers = [f"{node_ips[r // nproc]}:{int(port) + r}" for r in range(world)]
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    return env


def _code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's 128 + N


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="spawn.py")
    ap.add_argument("--flavor", choices=("python", "jax", "tensorflow"), required=True)
    ap.add_argument("--node-rank", type=int, required=True)
    ap.add_argument("--num-nodes", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--node-ips", required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    ips = a.node_ips.split(",")
    procs = [subprocess.Popen(cmd, env={**os.environ, **rank_env(a.flavor, a.node_rank, a.num_nodes, a.nproc,
                                                                 a.master, ips, lr)})
             for lr in range(a.nproc)]
    first: list[int] = []
    stop_at: list[float] = []

    def stop(sig: int = signal.SIGTERM) -> None:
        if not stop_at:
            stop_at.append(time.time() + GRACE_S)
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def on_signal(signum: int, _frame: object) -> None:
        if not first:
            first.append(128 + signum)
        stop()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    while any(p.poll() is None for p in procs):
        for lr, p in enumerate(procs):
            rc = p.poll()
            if rc is not None and rc != 0 and not first:
                first.append(_code(rc))
                print(f"[gtrain] local rank {lr} exited {_code(rc)}: stopping this node's other ranks",
                      file=sys.stderr, flush=True)
                stop()
        if stop_at and time.time() > stop_at[0]:
            stop(signal.SIGKILL)
        time.sleep(0.05)
    if not first:
        bad = [_code(p.returncode) for p in procs if p.returncode != 0]
        first.extend(bad[:1])
    return first[0] if first else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
