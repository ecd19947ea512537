"""torchft's DDP example (train_ddp.py in meta-pytorch/torchft) on CPU: a ``Manager`` over ``ProcessGroupGloo``,
torchft's ``DistributedDataParallel`` and ``Optimizer`` wrappers, live recovery of a joining replica group from a
healthy one (``state_dict`` / ``load_state_dict``). A tiny model and random batches stand in for CIFAR-10.

Usage: torchft_ddp_train.py STEPS SLEEP_S MAX_STEPS. gtrain sets ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS`` and
``TORCHFT_LIGHTHOUSE``; torchrun sets ``MASTER_ADDR``/``MASTER_PORT`` (this group's own store). Each step prints
``group G step S participants P agent PID t T`` (PID: the torchrun agent above this worker). The loop ends at the
first step from STEPS on at which every replica group took part (so a group that rejoined trains with the others
before the end), or at MAX_STEPS."""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn, optim
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

logging.basicConfig(level=logging.WARNING)


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
    steps, sleep_s, max_steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    group, groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    print(f"group {group} of {groups} lighthouse {os.environ['TORCHFT_LIGHTHOUSE']} "
          f"store {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        optimizer.load_state_dict(state["optim"])  # type: ignore[arg-type]

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"train_ddp_{group}", timeout=timedelta(seconds=10))
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, optim.AdamW(ddp.parameters()))
    criterion = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(group)
    me = agent_pid()
    while True:
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        optimizer.zero_grad()  # starts this step's quorum
        loss = criterion(ddp(x), y)
        loss.backward()  # the gradients' allreduce across the groups in the quorum
        optimizer.step()  # commits (or not, when a group failed during the step)
        step, parts = manager.current_step(), manager.num_participants()
        print(f"group {group} step {step} participants {parts} agent {me} t {time.time():.3f} "
              f"loss {loss.item():.4f}", flush=True)
        if (step >= steps and parts == groups) or step >= max_steps:
            break
        time.sleep(sleep_s)
    print(f"group {group} done at step {manager.current_step()}", flush=True)
    manager.shutdown(wait=False)
    # done: leave without the interpreter's teardown, where the manager's and gloo's threads can abort a finished
    # group under load (exit 134, seen once) -- the same as fsdp_dcp_train.py
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
