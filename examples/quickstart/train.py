"""Quickstart: a tiny MLP learns y = sin(x·w) on data it generates, with DDP across every rank.

- gloo on CPU, nccl when CUDA is there; torchrun (via gtrain) sets RANK, WORLD_SIZE, MASTER_ADDR, ...
- every node saves a checkpoint (from its local rank 0) every --ckpt-every steps into $GTRAIN_CHECKPOINT_DIR,
  atomically: nodes don't share a disk, and torchrun's rendezvous may put global rank 0 on any node next time;
- when restarted it resumes from the newest checkpoint, so a preempted or re-launched job goes on;
- rank 0 logs the mean loss with gtrain.metrics, so the report `gtrain run` writes draws the loss curve.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gtrain.metrics  # for `gtrain plot` / the report; on the nodes it comes with the job (standard library only)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--fail-at", type=int, default=-1, help="exit 3 at this step on the last rank (a test hook)")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=float(os.environ.get("LR", "0.01")))
    ckpt_dir = os.environ.get("GTRAIN_CHECKPOINT_DIR", "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)

    start = 0
    ckpts = sorted(f for f in os.listdir(ckpt_dir) if f.startswith("step-") and f.endswith(".pt"))
    if ckpts:
        state = torch.load(os.path.join(ckpt_dir, ckpts[-1]), map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        if rank == 0:
            print(f"resumed from {ckpts[-1]} at step {start}", flush=True)
    # every rank must start from the same step: the newest checkpoint any node has
    agreed = torch.tensor([start], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    if int(agreed.item()) != start:
        raise SystemExit(f"nodes disagree on the newest checkpoint ({start} here, {int(agreed.item())} elsewhere)")
    ddp = DDP(model, device_ids=[local] if cuda else None)

    w_true = (0.3 * torch.randn(16, generator=torch.Generator().manual_seed(42))).to(device)
    g = torch.Generator().manual_seed(1000 + rank)
    print(f"rank {rank}/{world} on {device} (node {os.environ.get('GTRAIN_NODE_RANK')}, "
          f"master {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}, "
          f"job {os.environ.get('GTRAIN_JOB_ID')})", flush=True)
    t0 = time.time()
    loss = torch.zeros(())
    for step in range(start, args.steps):
        x = torch.randn(args.batch, 16, generator=g).to(device)
        y = torch.sin(x @ w_true).unsqueeze(1) + 0.01 * torch.randn(args.batch, 1, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.fail_at and rank == world - 1:
            print(f"failing on purpose at step {step}", flush=True)
            os._exit(3)  # abruptly, like a crash: no process-group teardown
        if step % 5 == 0 or step == args.steps - 1:
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            if rank == 0:
                print(f"step {step:4d}  loss {avg.item() / world:.4f}", flush=True)
                gtrain.metrics.log(step=step, loss=avg.item() / world)
        if local == 0 and ((step + 1) % args.ckpt_every == 0 or step + 1 == args.steps):
            path = os.path.join(ckpt_dir, f"step-{step + 1:06d}.pt")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, path + ".tmp")
            os.replace(path + ".tmp", path)
            if rank == 0:
                print(f"saved {path} (on every node)", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"done: {args.steps - start} steps in {time.time() - t0:.2f}s on {world} ranks", flush=True)
    # free DDP's buckets and gloo's pending work while the interpreter is whole: left to its finalization, a gloo
    # thread's last tensors can abort the process after training is done (pytorch/pytorch#179291)
    del ddp, opt, loss
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
