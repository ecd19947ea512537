"""A tiny deterministic trainer that saves checkpoints the way well-known trainers do (``PATTERN``):

- ``nanogpt``: global rank 0 rewrites one fixed ``ckpt.pt`` in place after every step;
- ``hf``: Hugging Face Trainer's ``checkpoint-N/`` step folders, every rank writing its own
  ``rng_state_R.pth`` and rank 0 the weights ``model.bin``;
- ``zero``: DeepSpeed ZeRO's ``global_stepN/`` folders of per-rank optimizer shards
  (``zero_pp_rank_R_mp_rank_00_optim_states.pt``) and rank 0's ``mp_rank_00_model_states.pt``, then rank 0
  rewrites the ``latest`` tag file beside them (and copies ``zero_to_fp32.py`` there, as DeepSpeed does).

Each resumes as its trainer does, from checkpoint_dir itself: ``nanogpt`` from ``ckpt.pt``, ``hf`` from the
highest-numbered ``checkpoint-N/`` (transformers' ``get_last_checkpoint``), ``zero`` from the folder ``latest``
names (``load_checkpoint(dir)``); each checks that it is the one ``GTRAIN_RESUME_FROM`` names.

The "weights" are a list of floats, the same on every rank (data parallel); a rank's own state is a function
of the step and the rank, checked on resume (the per-rank file must come back to the rank that wrote it).
Every step ends in a gloo barrier, as a DDP step's all-reduce would: a rank that stalls stalls them all.
Usage: trainer_patterns.py PATTERN STEPS SECONDS_PER_STEP [STALL_AT [slow]]: on attempt 1 the last rank stops
after saving step STALL_AT (``slow``: before saving its part of it, as a node slower to write would be) and
writes ``$SIGNALS/stalled`` (the test then kills its node); rank 0 writes ``final.bin``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

EVERY = 2  # folder patterns: a checkpoint every EVERY steps


def step_weights(w: list[float], step: int) -> list[float]:
    return [round(x * 0.5 + (step + i) * 0.25, 6) for i, x in enumerate(w)]


def reference(steps: int) -> list[float]:
    w = [1.0, 2.0, 3.0, 4.0]
    for s in range(1, steps + 1):
        w = step_weights(w, s)
    return w


def rank_state(step: int, rank: int) -> str:
    return f"rank {rank} state at {step}"


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # in place, as torch.save(obj, path) does
        f.write(data)


def save(pattern: str, root: Path, step: int, w: list[float], rank: int) -> None:
    blob = json.dumps({"step": step, "w": w}).encode()
    if pattern == "nanogpt":
        if rank == 0:
            _write(root / "ckpt.pt", blob)
    elif step % EVERY == 0:
        if pattern == "hf":
            d = root / f"checkpoint-{step}"
            _write(d / f"rng_state_{rank}.pth", rank_state(step, rank).encode())
            if rank == 0:
                _write(d / "model.bin", blob)
        else:
            d = root / f"global_step{step}"
            _write(d / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", rank_state(step, rank).encode())
            if rank == 0:
                _write(d / "mp_rank_00_model_states.pt", blob)
                _write(root / "zero_to_fp32.py", b"# DeepSpeed copies its recovery script here at every save\n")
                _write(root / "latest", d.name.encode())


def found(pattern: str, root: Path) -> str:
    """The checkpoint the trainer itself would resume from, "" if none."""
    if pattern == "nanogpt":
        p = root / "ckpt.pt"
    elif pattern == "hf":
        steps = [int(d.name.split("-")[1]) for d in root.glob("checkpoint-*") if d.name.split("-")[1].isdigit()]
        p = root / f"checkpoint-{max(steps)}" if steps else root / "-"
    else:
        p = root / (root / "latest").read_text().strip() if (root / "latest").is_file() else root / "-"
    return str(p) if p.exists() else ""


def load(pattern: str, resume: str, rank: int) -> tuple[int, list[float]]:
    p = Path(resume)
    if pattern == "nanogpt":
        doc = json.loads(p.read_bytes())
    else:
        model = "model.bin" if pattern == "hf" else "mp_rank_00_model_states.pt"
        mine = f"rng_state_{rank}.pth" if pattern == "hf" else f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        doc = json.loads((p / model).read_bytes())
        assert (p / mine).read_text() == rank_state(doc["step"], rank), f"rank {rank}: wrong own state in {p}"
    return int(doc["step"]), list(doc["w"])


def main() -> None:
    import torch.distributed as dist

    pattern, steps, pace = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    stall_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    slow = sys.argv[5:6] == ["slow"]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    root = Path(os.environ["GTRAIN_CHECKPOINT_DIR"])
    resume = found(pattern, root)
    assert resume == os.environ.get("GTRAIN_RESUME_FROM", ""), (resume, os.environ.get("GTRAIN_RESUME_FROM"))
    start, w = load(pattern, resume, rank) if resume else (0, [1.0, 2.0, 3.0, 4.0])
    print(f"attempt {os.environ.get('GTRAIN_ATTEMPT')} rank {rank} start {start}", flush=True)
    for step in range(start + 1, steps + 1):
        time.sleep(pace)
        w = step_weights(w, step)
        dist.barrier()
        stall = step == stall_at and rank == dist.get_world_size() - 1 and os.environ.get("GTRAIN_ATTEMPT") == "1"
        if not (stall and slow):
            save(pattern, root, step, w, rank)
        print(f"rank {rank} step {step}", flush=True)
        if stall:
            Path(os.environ["SIGNALS"], "stalled").write_text(str(step))
            while True:
                time.sleep(1)
    dist.barrier()
    if rank == 0:
        _write(root / "final.bin", json.dumps({"step": steps, "w": w}).encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
