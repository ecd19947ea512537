"""A Ray job's status and its driver's log (see :mod:`gtrain.providers.ray.driver`) -> gtrain's job states.

Ray's job status (``PENDING``, ``RUNNING``, ``STOPPED``, ``SUCCEEDED``, ``FAILED``; Ray's Jobs REST API
reference) says where the driver is; the driver's ``[gtrain] ...`` lines say where each node's part is:
pending with the placement group's scheduling state, placed, each node's and rank's end, a node lost."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gtrain.jobs.backend import CANCEL_EXIT, JobState, NodeJobStatus, RankStatus

LOG_LINE = re.compile(r"^\[gtrain-log (\d+) (-|\d+)\] ?(.*)$")
_RANK_EXIT = re.compile(r"^\[gtrain\] rank-exit (\d+) (\d+) (-?\d+) ([0-9.]+)$")
_NODE_EXIT = re.compile(r"^\[gtrain\] node-exit (\d+) (\w+) (-?\d+|None)$")
_NODE_LOST = re.compile(r"^\[gtrain\] node-lost (\d+): (.*)$")
_PENDING = re.compile(r"^\[gtrain\] pending: (.*)$")
_TIMEOUT = re.compile(r"^\[gtrain\] pending-timeout: (.*)$")
#: the driver's lines a reader of the job's log is shown (on node 0): waiting, placed, a node lost, cancelled
DRIVER_SAYS = re.compile(r"^\[gtrain\] (pending|pending-timeout|placed|node-lost|started|stopping|cancelled)\b")
_PLACED = re.compile(r"^\[gtrain\] placed node (\d+) on (\S+)")


@dataclass
class DriverLog:
    """What the driver's ``[gtrain]`` lines say."""

    pending: str = ""
    timeout: str = ""
    placed: dict[int, str] = field(default_factory=dict)
    ended: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    ranks: dict[int, list[RankStatus]] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)


def parse(logs: str) -> DriverLog:
    out = DriverLog()
    for line in logs.splitlines():
        if not line.startswith("[gtrain] "):
            continue
        if m := _RANK_EXIT.match(line):
            rc = int(m.group(3))
            out.ranks.setdefault(int(m.group(1)), []).append(
                RankStatus(int(m.group(2)), JobState.SUCCEEDED if rc == 0 else JobState.FAILED, rc, float(m.group(4))))
        elif m := _NODE_EXIT.match(line):
            out.ended[int(m.group(1))] = (m.group(2), None if m.group(3) == "None" else int(m.group(3)))
        elif m := _NODE_LOST.match(line):
            out.lost[int(m.group(1))] = m.group(2)
        elif m := _PLACED.match(line):
            out.placed[int(m.group(1))] = m.group(2)
        elif m := _TIMEOUT.match(line):
            out.timeout = m.group(1)
        elif m := _PENDING.match(line):
            out.pending = m.group(1)
    return out


def node_statuses(job: dict[str, Any] | None, log: DriverLog, n: int) -> tuple[list[NodeJobStatus], str]:
    """(node K's part of the job, for K in 0..n-1; the job's reason in words)."""
    if job is None:  # gone from the cluster (its head restarted): nothing of it runs
        return [NodeJobStatus(k, JobState.CANCELLED, CANCEL_EXIT, "the Ray job is gone") for k in range(n)], \
            "the Ray job is gone from the cluster"
    status = str(job.get("status") or "PENDING")
    said = [ln.strip() for ln in str(job.get("message") or "").splitlines() if ln.strip()]
    message = (said[0][:300] + (f" ... {said[-1][:300]}" if len(said) > 1 else "")) if said else ""
    if log.timeout:
        return [NodeJobStatus(k, JobState.FAILED, 124, "placement group not placed") for k in range(n)], \
            f"not placed: {log.timeout}"
    out: list[NodeJobStatus] = []
    for k in range(n):
        raw = {"ray_status": status, "ray_node_ip": log.placed.get(k)}
        ranks = log.ranks.get(k, [])
        if k in log.lost:
            # raw "lost": the node's part died with its Ray node: policies.recovery relaunches (node_failure)
            out.append(NodeJobStatus(k, JobState.PREEMPTED, None, f"node lost: {log.lost[k]}", ranks=ranks,
                                     raw={**raw, "lost": True}))
        elif k in log.ended:
            word, rc = log.ended[k]
            st = JobState.parse(word)
            out.append(NodeJobStatus(k, st, rc if rc is not None else (0 if st is JobState.SUCCEEDED else 1),
                                     word, ranks=ranks, raw=raw))
        elif status == "PENDING":
            out.append(NodeJobStatus(k, JobState.PENDING, None, f"Ray job PENDING: {message or 'starting'}", raw=raw))
        elif status == "RUNNING":
            if not log.placed:
                out.append(NodeJobStatus(k, JobState.PENDING, None, log.pending or "placing the bundles", raw=raw))
            else:
                out.append(NodeJobStatus(k, JobState.RUNNING, None, "RUNNING", raw=raw))
        elif status == "STOPPED":
            out.append(NodeJobStatus(k, JobState.CANCELLED, CANCEL_EXIT, "STOPPED", raw=raw))
        elif status == "SUCCEEDED":
            out.append(NodeJobStatus(k, JobState.SUCCEEDED, 0, "SUCCEEDED", ranks=ranks, raw=raw))
        else:  # FAILED before this node's end was said: the driver died, or the runtime_env failed to build
            code = job.get("driver_exit_code")
            out.append(NodeJobStatus(k, JobState.FAILED, int(code) if isinstance(code, int) and code else 1,
                                     f"Ray job FAILED: {message}", ranks=ranks, raw=raw))
    if log.lost:
        reason = f"node(s) {sorted(log.lost)} lost: {next(iter(log.lost.values()))}"
    elif status in ("FAILED",) and not log.ended:
        reason = f"Ray job FAILED ({job.get('error_type') or 'error'}): {message}"
    elif any(s.state is JobState.PENDING for s in out):
        reason = next(s.detail for s in out if s.state is JobState.PENDING)
    else:
        reason = ""
    return out, reason
