"""The training script's side of durable runs (stdlib only; see docs/durable.md)::

    from gtrain import checkpoint

    start = checkpoint.resume_from()          # "" on a fresh start, else the restored checkpoint's path
    ...
    torch.save(state, f"{ckpt_dir}/step-{step}.pt")
    checkpoint.done(f"{ckpt_dir}/step-{step}.pt")   # complete: the node's uploader may take it now
    checkpoint.on_preempt(lambda: save_now())       # SIGUSR1: the node is about to go (spot notice)

``done(path)`` writes the ``<path>.done`` marker (the ``GTRAIN_CHECKPOINT_DONE`` convention). Without a marker,
a checkpoint counts as complete once every file of it is closed and unchanged for a settle time.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

DONE_SUFFIX = ".done"


def done(path: str | os.PathLike[str]) -> str:
    """Mark the checkpoint at ``path`` (a file or a folder, directly under checkpoint_dir) complete."""
    p = os.fspath(path).rstrip("/")
    marker = p + DONE_SUFFIX
    tmp = f"{os.path.dirname(marker) or '.'}/.{os.path.basename(marker)}.tmp"
    with open(tmp, "w") as f:
        f.write("done\n")
    os.replace(tmp, marker)
    return marker


def resume_from() -> str:
    """The checkpoint restored before this launch (``GTRAIN_RESUME_FROM``), or "" on a fresh start.

    A sharded trainer gets the path of the whole step folder, on every node, with every node's files of it (a DCP
    ``step-N/`` with ``.metadata`` and every rank's ``__R_0.distcp``; a DeepSpeed ``global_stepN/`` beside
    ``latest``), whatever the number of nodes and ranks that wrote it. (With ``job.checkpoint_tuning.restore:
    subset``, a DCP step written by this same shape holds its ``.metadata`` and only the files this node's ranks
    read at ``dcp.load``.) What to call with it:

    - FSDP2 / torch.distributed.checkpoint, on every rank (DCP reshards at load: another number of nodes or
      ranks than the one that saved it loads too)::

          if path := checkpoint.resume_from():
              msd, osd = get_state_dict(model, optim)
              state = {"model": msd, "optim": osd}
              dcp.load(state, checkpoint_id=path)
              set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])

      ``dcp.save`` and ``dcp.async_save`` both work: a step counts only once DCP's ``.metadata`` and every
      shard it names are in the store, so a save killed mid-write is never restored (the previous step is).
      Give ``async_save`` a process group of its own (``dist.new_group(backend="gloo")``) and wait for its
      future before the next save and before exiting. ``dcp.save(..., use_collectives=False)`` (a
      ``__R.metadata`` per rank, no ``.metadata``) works too, on the same world size only: each rank reads its own.
    - On one machine, after ``gtrain pull`` (no process group: DCP then reads every shard in this process)::

          state = {"model": plain_model.state_dict()}
          dcp.load(state, checkpoint_id="out/step-20", no_dist=True)
          # or one torch.save file: torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dir, "full.pt")

    - DeepSpeed: ``engine.load_checkpoint(os.path.dirname(path))`` (``latest`` names the step restored), on the
      same world size; for another, convert it first with ``ds_to_universal --inject_missing_state`` and load
      that with ``"checkpoint": {"load_universal": true}`` (docs/durable.md, "Sharded checkpoints", has the code).
    """
    return os.environ.get("GTRAIN_RESUME_FROM", "")


def on_preempt(handler: Callable[[], Any]) -> None:
    """Call ``handler`` when the node gets an interruption notice (gtrain sends the rank SIGUSR1)."""
    signal.signal(signal.SIGUSR1, lambda _sig, _frame: handler())
