"""A tiny FSDP2 (``fully_shard``) trainer that checkpoints with torch.distributed.checkpoint (DCP), CPU + gloo.

Every EVERY steps all ranks save ``$GTRAIN_CHECKPOINT_DIR/step-N/`` with ``dcp.save`` (each rank its
``__R_0.distcp`` on its own node's disk, global rank 0 also ``.metadata``): the model's and the optimizer's
sharded state. It resumes from ``GTRAIN_RESUME_FROM`` with ``dcp.load``, which reads ``.metadata`` and the
shards it needs, wherever they were written. Data are a function of (seed, step, rank) only, so a resumed run
computes what an uninterrupted one does, bit for bit. At the end rank 0 writes the full weights to
``final.pt`` in checkpoint_dir.

Usage: fsdp_dcp_train.py STEPS EVERY [STALL_AT]: on attempt 1 every rank stops after saving step STALL_AT and
global rank 0 writes ``$SIGNALS/stalled`` (the test then kills a node).
"""

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

WIDTH = int(os.environ.get("FSDP_WIDTH", "64"))


def model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 4))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    return net


def main() -> None:
    steps, every = int(sys.argv[1]), int(sys.argv[2])
    stall_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    attempt = os.environ.get("GTRAIN_ATTEMPT", "1")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    root = Path(os.environ["GTRAIN_CHECKPOINT_DIR"])
    resume = os.environ.get("GTRAIN_RESUME_FROM", "")
    start = 0
    if resume:
        msd, osd = get_state_dict(net, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=resume)
        set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(Path(resume).name.split("-")[1])
    print(f"attempt {attempt} rank {rank} start {start}", flush=True)
    if resume:  # what this rank's node holds of the step (hidden files too: DCP's .metadata)
        print(f"rank {rank} node holds {' '.join(sorted(os.listdir(resume)))}", flush=True)
    for step in range(start + 1, steps + 1):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = ((net(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            msd, osd = get_state_dict(net, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / f"step-{step}"))
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        if step == stall_at and attempt == "1":
            if rank == 0:
                Path(os.environ["SIGNALS"], "stalled").write_text(str(step))
            time.sleep(600)  # a node is killed meanwhile; the recovery stops the others
    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        tmp = root / "final.pt.tmp"
        torch.save({"step": steps, "model": full}, tmp)
        os.replace(tmp, root / "final.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
