"""Job time of a Slurm cluster's jobs, for the cost report: sacct's ElapsedRaw when accounting is on, else
slurmctld's own StartTime/EndTime (``scontrol show job``, while it remembers the job), else the job record's
own times (an estimate)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtrain.providers.slurm.login import SlurmHost
    from gtrain.state import Cluster, CostInterval


def _epoch(stamp: str | None) -> float | None:
    if not stamp or stamp in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def job_gpu_seconds(provider: SlurmHost, cluster: Cluster, interval: CostInterval) -> tuple[float, str]:
    """Seconds of job time on one node inside ``interval``, and where the times came from. Each Slurm job
    counts once: with ``slurm.hold`` that is the held allocation (every launch is a step of it), its whole
    held time, idle or not."""
    extra = cluster.extra.get("slurm") or {}
    if not extra.get("root"):
        return 0.0, "no Slurm jobs"
    now = time.time()
    # Slurm job id -> the times gtrain recorded itself, for when Slurm has forgotten the job
    own: dict[str, tuple[float, float]] = {}
    for j in provider.store.jobs(cluster.id):
        if j.info.get("slurm_job_id") and not j.info.get("slurm_hold"):
            own[str(j.info["slurm_job_id"])] = (j.created_at, j.ended_at or now)
    if extra.get("alloc_id"):
        res = [r for r in provider.store.resources(cluster.id) if r.kind == "slurm-alloc"]
        own[str(extra["alloc_id"])] = (res[-1].created_at, res[-1].deleted_at or now) if res else (now, now)
    if not own:
        return 0.0, "no Slurm jobs"
    slurm = provider.slurm(cluster)
    acct = slurm.sacct(sorted(own))
    lo, hi = interval.started_at, interval.stopped_at or now
    if acct:
        return float(sum(int(r["ElapsedRaw"] or 0) for r in acct.values())), "sacct"
    total, sources = 0.0, set()
    for sid, (own_start, own_end) in own.items():
        info = slurm.show_job(sid)
        start, end = _epoch(info.get("StartTime")), _epoch(info.get("EndTime"))
        if start is not None and info.get("JobState") not in ("PENDING",):
            sources.add("scontrol")
            end = end if end is not None and info.get("JobState") not in ("RUNNING", "COMPLETING") else now
        else:
            sources.add("the job records (estimate)")
            start, end = own_start, own_end
        total += max(0.0, min(end, hi) - max(start, lo))
    return total, " + ".join(sorted(sources))
