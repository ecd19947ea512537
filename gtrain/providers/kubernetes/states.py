"""A Job's pods -> gtrain's job states: Pending with its reason (Unschedulable's message, ImagePullBackOff,
suspended for Kueue admission), Running, Succeeded, Failed with the rank's exit code (OOMKilled said as such),
and a pod the cluster disrupted (``DisruptionTarget``: evicted, preempted, its node drained) as PREEMPTED."""

from __future__ import annotations

import re
from typing import Any

from gtrain.jobs.backend import JobState, NodeJobStatus, RankStatus
from gtrain.providers.kubernetes.objects import RANK_EXIT

_RANK_EXIT_RE = re.compile(re.escape(RANK_EXIT) + r" (\d+) (-?\d+) ([0-9.]+)")
WAITING_PENDING = ("ContainerCreating", "PodInitializing", "ImagePullBackOff", "ErrImagePull",
                   "CreateContainerConfigError", "InvalidImageName", "CrashLoopBackOff")


def _cond(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def index_of(pod: dict[str, Any]) -> int:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return int(ann.get("batch.kubernetes.io/job-completion-index", -1))


def rank_exits(message: str) -> list[RankStatus]:
    """The ``[gtrain] rank-exit R RC T`` lines a failed pod's termination message carries (its log's tail)."""
    out = []
    for m in _RANK_EXIT_RE.finditer(message or ""):
        rc = int(m.group(2))
        out.append(RankStatus(int(m.group(1)), JobState.SUCCEEDED if rc == 0 else JobState.FAILED, rc,
                              float(m.group(3))))
    return out


def disruption(pod: dict[str, Any]) -> str | None:
    """Why the cluster disrupted the pod (its ``DisruptionTarget`` condition), or None."""
    disrupted = _cond(pod, "DisruptionTarget")
    if disrupted is None or ((pod.get("status") or {}).get("phase") or "Pending") not in ("Failed", "Running",
                                                                                           "Pending"):
        return None
    return f"{disrupted.get('reason') or 'DisruptionTarget'}: {disrupted.get('message') or 'pod disrupted'}"


def pod_status(k: int, pod: dict[str, Any] | None, suspended: bool) -> NodeJobStatus:
    """Node K's part of the job from its pod (None: no pod yet, or it was deleted)."""
    if pod is None:
        why = "suspended: waiting for admission (Kueue)" if suspended else "no pod yet"
        return NodeJobStatus(k, JobState.PENDING, None, why)
    st = pod.get("status") or {}
    phase = st.get("phase") or "Pending"
    cs = (st.get("containerStatuses") or [{}])[0]
    term = (cs.get("state") or {}).get("terminated") or {}
    raw = {"pod": (pod.get("metadata") or {}).get("name"), "phase": phase, "node": (pod.get("spec") or {}).get(
        "nodeName")}
    disrupted = disruption(pod)
    if disrupted is not None:
        return NodeJobStatus(k, JobState.PREEMPTED, None, disrupted, raw=raw)
    if phase == "Pending":
        waiting = (cs.get("state") or {}).get("waiting") or {}
        sched = next((c for c in st.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if sched is not None and sched.get("status") == "False":
            why = f"{sched.get('reason') or 'Unschedulable'}: {sched.get('message') or ''}".rstrip(": ")
        elif waiting.get("reason"):
            why = f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
        else:
            why = "Pending"
        return NodeJobStatus(k, JobState.PENDING, None, why, raw=raw)
    if phase == "Running":
        return NodeJobStatus(k, JobState.RUNNING, None, "Running", raw=raw)
    code = term.get("exitCode")
    ranks = rank_exits(term.get("message") or "")
    if phase == "Succeeded":
        return NodeJobStatus(k, JobState.SUCCEEDED, 0, "Succeeded", ranks=ranks, raw=raw)
    reason = term.get("reason") or st.get("reason") or "Error"
    if reason == "OOMKilled":
        return NodeJobStatus(k, JobState.FAILED, int(code or 137), "OOMKilled: the container ran out of memory",
                             ranks=ranks, raw=raw)
    failed = sorted((r.ended_at or 0.0, r.exit_code) for r in ranks if r.exit_code)
    return NodeJobStatus(k, JobState.FAILED, int(failed[0][1] if failed else code if code is not None else 1),
                         f"{reason} (exit {code})", ranks=ranks, raw=raw)


def job_flags(job: dict[str, Any] | None) -> tuple[bool, str]:
    """(suspended, the Job's own failure reason) of a batch/v1 Job object."""
    if job is None:
        return False, ""
    spec = job.get("spec") or {}
    failed = _cond(job, "Failed")
    return bool(spec.get("suspend")), (f"{failed.get('reason')}: {failed.get('message')}" if failed else "")


def _ts(text: str | None) -> float | None:
    from datetime import datetime

    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def running_seconds(pod: dict[str, Any], now: float) -> float:
    """How long the pod's container ran: ``status.startTime`` to its ``finishedAt`` (still running: ``now``)."""
    st = pod.get("status") or {}
    start = _ts(st.get("startTime"))
    if start is None:
        return 0.0  # never started (Pending): nothing ran
    cs = (st.get("containerStatuses") or [{}])[0]
    end = _ts(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")) or now
    return max(0.0, end - start)
