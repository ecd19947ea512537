"""A tiny real DDP job for the integration tests (gloo on CPU)."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--sleep", type=float, default=0.0)
ap.add_argument("--exit-code", type=int, default=0, help="the last rank exits with this code")
ap.add_argument("--ckpt-bytes", type=int, default=1 << 20)
ap.add_argument("--arg", default="")
args = ap.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2
print(f"hello from rank {rank}/{world} node {os.environ['GTRAIN_NODE_RANK']} allreduce={t.item()}", flush=True)
if rank == world - 1 and args.exit_code:
    print(f"rank {rank} exiting with {args.exit_code}", flush=True)
    os._exit(args.exit_code)
if args.sleep:
    time.sleep(args.sleep)
if rank == 0:
    ck = os.environ["GTRAIN_CHECKPOINT_DIR"]
    os.makedirs(os.path.join(ck, "sub"), exist_ok=True)
    keys = ["INJECT", "QUOTES", "TOKEN", "GTRAIN_NODE_RANK", "GTRAIN_NUM_NODES", "GTRAIN_NODE_IPS",
            "GTRAIN_MASTER_ADDR", "GTRAIN_MASTER_PORT", "GTRAIN_JOB_ID", "GTRAIN_CHECKPOINT_DIR", "WORLD_SIZE"]
    with open(os.path.join(ck, "env.json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in keys} | {"arg": args.arg}, f)
    with open(os.path.join(ck, "sub", "model.bin"), "wb") as f:
        f.write(os.urandom(args.ckpt_bytes))
    print("checkpoint written", flush=True)
dist.barrier()
dist.destroy_process_group()
