"""Whether a lost node of an elastic job can be replaced alone, its survivors left training (pure: read from the
job's info, no I/O). ``info["elastic"]`` is written at launch (gtrain.runs.ship.prepare): ``{min, max, mode}``,
mode ``torchrun`` (num_nodes: {min, max}: torchrun's c10d rendezvous on node 0) or ``torchft`` (each node a
replica group, the Lighthouse on node 0 -- or the user's own: ``node0: false``, node 0 is then like the others)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HOSTS = {"torchrun": "node 0 hosts the rendezvous", "torchft": "node 0 runs the torchft Lighthouse"}


def replaceable(info: Mapping[str, Any], lost: Sequence[int], num_nodes: int) -> str | None:
    """None when the ``lost`` nodes can be replaced with the survivors left running; else why not (the job then
    takes the whole-job recovery: every node stopped and relaunched)."""
    el = info.get("elastic")
    if not isinstance(el, Mapping):
        return "the job is not elastic"
    if not lost:
        return "no node was lost"
    if 0 in lost and el.get("node0", True):
        return f"{HOSTS.get(str(el.get('mode')), 'node 0 hosts the job')} and was lost"
    left = num_nodes - len(set(lost))
    least = int(el.get("min") or 1)
    if left < least:
        return f"{left} node(s) left, fewer than num_nodes.min {least}"
    return None
