"""A DDP job that proves where it runs: every rank prints the marker only the test image holds."""

import argparse
import os
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--sleep", type=float, default=0.0)
ap.add_argument("--exit-code", type=int, default=0, help="the last rank exits with this code")
args = ap.parse_args()

with open("/gtrain-image-marker") as f:
    marker = f.read().strip()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}/{world} marker={marker} allreduce={t.item()}", flush=True)
if rank == world - 1 and args.exit_code:
    os._exit(args.exit_code)
if args.sleep:
    time.sleep(args.sleep)
if rank == 0:
    ck = os.environ["GTRAIN_CHECKPOINT_DIR"]
    os.makedirs(ck, exist_ok=True)
    with open(os.path.join(ck, "marker.txt"), "w") as f:
        f.write(f"{marker} {os.environ.get('TOKEN', '')}")
dist.barrier()
dist.destroy_process_group()
