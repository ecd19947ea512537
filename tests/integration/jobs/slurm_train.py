"""The Slurm tests' job: a real 2-node x 2-process gloo all_reduce, a checkpoint per step (rank 0) that a
requeued run resumes from, and knobs to fail, sleep or run past the time limit."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--step-s", type=float, default=0.0)
ap.add_argument("--exit-code", type=int, default=0)
args = ap.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt = os.path.join(os.environ["GTRAIN_CHECKPOINT_DIR"], "state.json")
start = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        start = json.load(f)["step"]
print(f"slurm rank {rank}/{world} node {os.environ['GTRAIN_NODE_RANK']} resumes at step {start}", flush=True)
warned = False
for step in range(start, args.steps):
    if not warned and os.path.exists(os.environ.get("GTRAIN_PREEMPT_FILE", "/nonexistent")):
        warned = True
        print(f"slurm rank {rank} saw GTRAIN_PREEMPT_FILE: checkpointing before the time limit", flush=True)
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    if rank == 0:
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step + 1, "sum": t.item(), "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}, f)
        os.replace(tmp, ckpt)
    print(f"slurm rank {rank} step {step + 1} sum {t.item()}", flush=True)
    if args.step_s:
        time.sleep(args.step_s)
dist.barrier()
# the process group goes before the failing exit: a rank that exits with gloo's threads still up may be
# aborted by C++'s std::terminate at interpreter shutdown (exit 134, not its own code; seen in CI)
dist.destroy_process_group()
if rank == world - 1 and args.exit_code:
    raise SystemExit(args.exit_code)
