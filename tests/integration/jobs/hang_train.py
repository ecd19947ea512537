"""A 2-rank gloo job that wedges on its first attempt: rank 1 stops inside its loop at step STALL (in
``wedged_here``, before its all-reduce) while rank 0 has logged that step and waits in the all-reduce for it.
The second attempt runs all STEPS. Every step is logged with gtrain.metrics (the watcher's progress)."""

import os
import sys
import time

print("starting", flush=True)  # progress before the torch import (a slow import is not a hang)


def wedged_here() -> None:
    while True:
        time.sleep(1)


def main() -> None:
    import torch
    import torch.distributed as dist

    import gtrain.metrics

    steps, stall = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), os.environ.get("GTRAIN_ATTEMPT")
    print(f"attempt {attempt} rank {rank} started", flush=True)
    x = torch.ones(1)
    for step in range(1, steps + 1):
        if attempt == "1" and rank == 1 and step == stall:
            wedged_here()
        gtrain.metrics.log(step=step)
        print(f"step {step}", flush=True)
        dist.all_reduce(x)
        time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
