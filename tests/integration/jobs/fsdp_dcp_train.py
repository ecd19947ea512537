"""A tiny FSDP2 (``fully_shard``) trainer that checkpoints with torch.distributed.checkpoint (DCP), CPU + gloo.

Every EVERY steps all ranks save ``$GTRAIN_CHECKPOINT_DIR/step-N/`` with ``dcp.save`` (each rank its
``__R_0.distcp`` on its own node's disk, global rank 0 also ``.metadata``): the model's and the optimizer's
sharded state. It resumes from ``GTRAIN_RESUME_FROM`` with ``dcp.load``, which reads ``.metadata`` and the
shards it needs, wherever they were written. Data are a function of (seed, step, rank) only, so a resumed run
computes what an uninterrupted one does, bit for bit. At the end rank 0 writes the full weights to
``final.pt`` in checkpoint_dir.

Usage: fsdp_dcp_train.py STEPS EVERY [STALL_AT]: on attempt 1 every rank stops after saving step STALL_AT and
global rank 0 writes ``$SIGNALS/stalled`` (the test then kills a node).

Options (environment): ``DCP_ASYNC=1`` saves with ``dcp.async_save`` (on a gloo group of its own; a save waits
for the previous one, the end for the last); ``DCP_STALL_META=N`` (attempt 1) makes the coordinator's writer stall
in ``finish()`` at step N: every rank's ``__R_0.distcp`` is written, ``.metadata`` never is (``$SIGNALS/stalled-meta``
says so); ``SAVE_LAST=N`` saves no step after N; ``FULL_DIR`` gets rank 0's full weights of every step saved
(``full-step-N.pt``); ``FINAL`` is where the final weights go (default ``final.pt`` in checkpoint_dir);
``DCP_RANK_LOCAL=1`` saves with no coordinator (``use_collectives=False``: each rank writes ``__R.metadata``
beside its ``__R_0.distcp``, no ``.metadata``; ``dcp.load`` then has each rank read its own).
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
from torch.distributed.checkpoint import FileSystemWriter
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


class StallingWriter(FileSystemWriter):
    """DCP's file writer whose ``finish()`` (the coordinator's last act: writing ``.metadata``) never ends: the
    step's data files are all written, its metadata is not (a writer killed mid-save)."""

    def finish(self, metadata, results) -> None:  # type: ignore[no-untyped-def]
        Path(os.environ["SIGNALS"], "stalled-meta").write_text(str(self.checkpoint_id))
        time.sleep(600)  # the test kills a node meanwhile
        super().finish(metadata, results)


def full(net: nn.Module) -> dict[str, torch.Tensor]:
    return get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


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
    use_async, save_last = os.environ.get("DCP_ASYNC") == "1", int(os.environ.get("SAVE_LAST", "0") or 0)
    stall_meta = int(os.environ.get("DCP_STALL_META", "0") or 0) if attempt == "1" else 0
    save_pg = dist.new_group(backend="gloo") if use_async else None
    pending = None
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
        if step % every == 0 and not (save_last and step > save_last):
            msd, osd = get_state_dict(net, opt)
            where = str(root / f"step-{step}")
            writer = (StallingWriter if step == stall_meta else FileSystemWriter)(where)
            if pending is not None:
                pending.result()
            if use_async:
                pending = dcp.async_save({"model": msd, "optim": osd}, storage_writer=writer, process_group=save_pg)
            else:
                dcp.save({"model": msd, "optim": osd}, storage_writer=writer,
                         use_collectives=os.environ.get("DCP_RANK_LOCAL") != "1")
            if os.environ.get("FULL_DIR"):
                weights = full(net)
                if rank == 0:
                    torch.save(weights, Path(os.environ["FULL_DIR"], f"full-step-{step}.pt"))
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        if step == stall_at and attempt == "1":
            if rank == 0:
                Path(os.environ["SIGNALS"], "stalled").write_text(str(step))
            time.sleep(600)  # a node is killed meanwhile; the recovery stops the others
    weights = full(net)
    if rank == 0:
        final = Path(os.environ.get("FINAL") or root / "final.pt")
        tmp = final.with_name(final.name + ".tmp")
        torch.save({"step": steps, "model": weights}, tmp)
        os.replace(tmp, final)
    if pending is not None:
        pending.result()
    dist.barrier()
    dist.destroy_process_group()
    # everything is written: leave without the interpreter's teardown, where torch 2.13's threads (gloo, DCP) were
    # seen once under load to abort a finished rank ("terminate called without an active exception", exit 134)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
