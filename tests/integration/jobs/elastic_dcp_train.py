"""An FSDP2 + DCP trainer for elastic runs (CPU, gloo), written as torchrun's elastic docs ask: every start of
the workers (the first, and each one after the world changed) resumes from ``GTRAIN_RESUME_FROM`` with
``dcp.load`` -- whatever world size saved it -- and saves ``step-N/`` every EVERY steps.

Usage: elastic_dcp_train.py STEPS EVERY SLEEP_S. Each step prints ``rank R step S world W agent PID t T``: its
world size, the pid of the torchrun agent above it (the test checks node 0's never changes) and the time. Rank 0
writes the full weights to ``final.pt`` in checkpoint_dir at the end."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard


def agent_pid() -> int:
    """The torchrun agent this worker runs under (the nearest ancestor running torch.distributed.run)."""
    pid = os.getppid()
    while pid > 1:
        try:
            if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return -1


def main() -> None:
    steps, every, sleep_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    root = Path(os.environ["GTRAIN_CHECKPOINT_DIR"])
    resume, start = os.environ.get("GTRAIN_RESUME_FROM", ""), 0
    if resume:
        msd, osd = get_state_dict(net, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=resume)
        set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(Path(resume).name.split("-")[1])
    me = agent_pid()
    print(f"rank {rank} start {start} world {world} agent {me} t {time.time():.3f}", flush=True)
    for step in range(start + 1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = ((net(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            msd, osd = get_state_dict(net, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / f"step-{step}"))
        print(f"rank {rank} step {step} world {world} agent {me} t {time.time():.3f}", flush=True)
        time.sleep(sleep_s)
    weights = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"step": steps, "world": world, "model": weights}, root / "final.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
