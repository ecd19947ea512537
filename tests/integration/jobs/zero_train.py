"""A tiny DeepSpeed ZeRO trainer (stage ``ZERO_STAGE``, default 2), CPU + gloo, started by DeepSpeed's own
launcher (``launcher: deepspeed``) or torchrun.

Every EVERY steps all ranks call ``engine.save_checkpoint(checkpoint_dir)``: each rank writes its
``global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt`` on its own node's disk; global rank 0 also writes
``mp_rank_00_model_states.pt``, ``latest`` and copies ``zero_to_fp32.py`` beside the step folders. It resumes
from ``GTRAIN_RESUME_FROM`` as DeepSpeed users do: ``engine.load_checkpoint(checkpoint_dir)`` (the step
``latest`` names). When the world size changed since that step was saved, the node's local rank 0 first turns it
into a universal checkpoint (``python -m deepspeed.checkpoint.ds_to_universal``, written outside checkpoint_dir)
and every rank loads that (``"checkpoint": {"load_universal": true}``). Data are a function of (seed, step,
rank) only. At the end rank 0 writes the full weights to ``FINAL`` (default ``final.pt`` in checkpoint_dir).

Usage: zero_train.py STEPS EVERY [STALL_AT]: on attempt 1 every rank stops after saving step STALL_AT and
global rank 0 writes ``$SIGNALS/stalled`` (the test then kills a node). ``FULL_DIR``: rank 0 writes the full
weights there at every save (``full-step-N.pt``) and, after a resume, what it loaded (``loaded-step-N.pt``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    steps, every = int(sys.argv[1]), int(sys.argv[2])
    stall_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    attempt = os.environ.get("GTRAIN_ATTEMPT", "1")
    root = Path(os.environ["GTRAIN_CHECKPOINT_DIR"])
    resume = os.environ.get("GTRAIN_RESUME_FROM", "")
    full_dir = os.environ.get("FULL_DIR", "")
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config: dict[str, object] = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10_000,
                                 "zero_optimization": {"stage": int(os.environ.get("ZERO_STAGE", "2"))}}
    load_dir, tag = str(root), None
    if resume:
        saved = torch.load(Path(resume) / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        if saved["dp_world_size"] != world:  # another world size: ZeRO needs its universal checkpoint
            out = Path(os.environ["GTRAIN_WORKDIR"]) / "universal" / f"{Path(resume).name}_universal"
            if int(os.environ.get("LOCAL_RANK", "0")) == 0 and not out.exists():  # once per node
                subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                                "--input_folder", resume, "--output_folder", str(out), "--inject_missing_state",
                                "--num_extract_workers", "1", "--num_merge_workers", "1"], check=True)
            dist.barrier()
            config["checkpoint"] = {"load_universal": True}
            load_dir, tag = str(out.parent), out.name
        print(f"rank {rank} resumes from {Path(resume).name} saved by {saved['dp_world_size']} rank(s), "
              f"world {world}" + (" via its universal checkpoint" if tag else ""), flush=True)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=opt, config=config)
    start = 0
    if resume:
        path, _client = engine.load_checkpoint(load_dir, tag=tag)
        assert path is not None, f"DeepSpeed loaded nothing from {load_dir} (tag {tag})"
        start = engine.global_steps
        if full_dir and rank == 0:
            torch.save(engine.module.state_dict(), Path(full_dir, f"loaded-step-{start}.pt"))
    print(f"attempt {attempt} rank {rank} start {start}", flush=True)
    if resume:  # what this rank's node holds of the step
        print(f"rank {rank} node holds {' '.join(sorted(os.listdir(resume)))}", flush=True)
    for step in range(start + 1, steps + 1):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = ((engine(x) - y) ** 2).mean()
        engine.backward(loss)
        engine.step()
        if step % every == 0:
            engine.save_checkpoint(str(root), tag=f"global_step{step}")
            if full_dir and rank == 0:
                torch.save(engine.module.state_dict(), Path(full_dir, f"full-step-{step}.pt"))
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        if step == stall_at and attempt == "1":
            if rank == 0:
                Path(os.environ["SIGNALS"], "stalled").write_text(str(step))
            time.sleep(600)  # a node is killed meanwhile; the recovery stops the others
    if rank == 0:
        final = Path(os.environ.get("FINAL") or root / "final.pt")
        tmp = final.with_name(final.name + ".tmp")
        torch.save({"step": steps, "model": engine.module.state_dict()}, tmp)
        os.replace(tmp, final)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
