"""`gtrain launch` on an idle Slurm cluster (tests/fixtures/slurm.py: munged + slurmctld + 2 slurmd) to the
first line a rank prints, against `sbatch` of a hand-written equivalent script (srun + torchrun on both nodes,
rendezvous on the first node) to the same line. Target: gtrain <= 1.5x the hand-written script. Medians of
--runs; writes bench/results/slurm.json. Run as root (the test cluster's slurmd runs jobs as root)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if TYPE_CHECKING:
    from tests.fixtures.slurm import SlurmCluster

TRAIN = ('import torch.distributed as d\nd.init_process_group("gloo")\n'
         'print("first line rank", d.get_rank(), flush=True)\n')
HAND = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --output={out}
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
addr=$(scontrol show node "$head" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
export OMP_NUM_THREADS=1
srun --kill-on-bad-exit=1 {py} -m torch.distributed.run --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \\
  --rdzv_endpoint=$addr:$((20000 + SLURM_JOB_ID % 20000)) --rdzv_id=$SLURM_JOB_ID {train}
"""


def wait_line(root: Path, pattern: str, needle: str, t0: float, timeout: float = 300) -> float:
    """Seconds from t0 until a file ``root/pattern`` (a glob) holds ``needle``. torchrun's c10d rendezvous
    numbers the nodes in arrival order: global rank 0 may be on either node, so every rank's log is read."""
    while time.monotonic() - t0 < timeout:
        for p in root.glob(pattern):
            if needle in p.read_text(errors="replace"):
                return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError(f"no {needle!r} in {root}/{pattern} within {timeout}s")


def wait_ended(c: SlurmCluster, sid: str, timeout: float = 300) -> None:
    """Until Slurm says job ``sid`` ended (the nodes are exclusive: the next job would queue behind it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = c.run("squeue", "-h", "--states=all", "-j", sid, "-o", "%T", check=False).stdout.strip()
        if st and st not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return
        time.sleep(0.05)
    raise RuntimeError(f"slurm job {sid} did not end within {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from tests.fixtures.slurm import SlurmCluster, available

    why = available()
    if why:
        print(f"bench_slurm: {why}")
        return 1
    import gtrain
    from gtrain.spec import parse_spec

    tmp = Path(tempfile.mkdtemp(prefix="gtrain-bench-slurm-"))
    os.environ["GTRAIN_HOME"] = str(tmp / "home")
    work = tmp / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    hand, ours = [], []
    with SlurmCluster().start() as c:
        spec = parse_spec({"name": "bench-slurm", "provider": "slurm", "num_nodes": 2,
                           "slurm": {"partition": c.partition, "shared_dir": str(c.shared), "conf": c.conf},
                           "job": {"workdir": str(work), "run": "train.py", "nproc_per_node": 2,
                                   "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}}})
        gtrain.up(spec)
        for i in range(args.runs):
            out = tmp / f"hand-{i}.out"
            script = tmp / f"hand-{i}.sh"
            script.write_text(HAND.format(out=out, py=sys.executable, train=work / "train.py"))
            t0 = time.monotonic()
            sid = subprocess.run(["sbatch", "--parsable", str(script)], env=c.env, check=True, capture_output=True,
                                 text=True).stdout.strip()
            hand.append(wait_line(tmp, out.name, "first line rank", t0))
            wait_ended(c, sid)
            t0 = time.monotonic()
            job = gtrain.launch(spec).job_id
            jobs = c.shared / "gtrain" / "bench-slurm" / "jobs" / job
            ours.append(wait_line(jobs, "node-*/logs/rank-*.log", "first line rank", t0))
            gtrain.wait("bench-slurm", job_id=job)
            print(f"run {i + 1}: sbatch by hand {hand[-1]:.2f}s, gtrain launch {ours[-1]:.2f}s", flush=True)
        gtrain.down("bench-slurm")
    h, o = statistics.median(hand), statistics.median(ours)
    res = {"hand_s": hand, "gtrain_s": ours, "hand_median_s": round(h, 3), "gtrain_median_s": round(o, 3),
           "ratio": round(o / h, 3), "target": 1.5, "ok": o / h <= 1.5}
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "slurm.json").write_text(json.dumps(res, indent=2))
    print(f"sbatch by hand: {h:.2f}s  gtrain launch: {o:.2f}s  ratio {o / h:.2f}x (target <= 1.5x)")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
