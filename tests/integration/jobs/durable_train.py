"""A tiny deterministic distributed job for the durable-run tests: STEPS steps of w = w/2 + allreduce(x_step),
x drawn from a per-(step, rank) seed as small integers (sums exact in float64, whatever the rank order), a
checkpoint every EVERY steps written by rank 0 only (so it must reach every node on a restore)."""

import os
import sys
import time


def step_x(torch, step: int, rank: int):  # noqa: ANN001, ANN201
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randint(-5, 6, (4,), generator=g).double()


def reference(steps: int, world: int) -> list[float]:
    import torch

    w = torch.zeros(4, dtype=torch.float64)
    for step in range(steps):
        w = w * 0.5 + sum(step_x(torch, step, r) for r in range(world))
    return w.tolist()


def main() -> None:
    import torch
    import torch.distributed as dist

    steps, every, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ck = os.environ["GTRAIN_CHECKPOINT_DIR"]
    w, start = torch.zeros(4, dtype=torch.float64), 0
    resume = os.environ.get("GTRAIN_RESUME_FROM", "")
    if resume:
        state = torch.load(resume)
        w, start = state["w"], state["step"]
    print(f"attempt {os.environ.get('GTRAIN_ATTEMPT')} start {start} resume {resume!r}", flush=True)
    for step in range(start, steps):
        x = step_x(torch, step, rank)
        dist.all_reduce(x)
        w = w * 0.5 + x
        print(f"computed step {step + 1}", flush=True)
        if rank == 0 and (step + 1) % every == 0:
            path = f"{ck}/step-{step + 1:04d}.pt"
            torch.save({"w": w, "step": step + 1}, path)
            open(path + ".done", "w").close()  # the GTRAIN_CHECKPOINT_DONE convention
        time.sleep(pause)
    if rank == 0:
        torch.save({"w": w, "step": steps}, f"{ck}/final.pt")
        try:
            from gtrain.checkpoint import done
        except ImportError:  # a node without gtrain: the marker by hand
            open(f"{ck}/final.pt.done", "w").close()
        else:
            done(f"{ck}/final.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
