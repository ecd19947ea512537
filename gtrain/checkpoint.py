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
    """The checkpoint restored before this launch (``GTRAIN_RESUME_FROM``), or "" on a fresh start."""
    return os.environ.get("GTRAIN_RESUME_FROM", "")


def on_preempt(handler: Callable[[], Any]) -> None:
    """Call ``handler`` when the node gets an interruption notice (gtrain sends the rank SIGUSR1)."""
    signal.signal(signal.SIGUSR1, lambda _sig, _frame: handler())
