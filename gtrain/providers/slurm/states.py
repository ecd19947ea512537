"""Slurm's job-state words and what they mean to gtrain (shared by the backend and ``slurm.hold``), and the
rendering of the provider's own templates (templates/slurm/)."""

from __future__ import annotations

from typing import Any

from gtrain.jobs.backend import JobState

#: Slurm's job states -> gtrain's (squeue %T / sacct State words)
SLURM_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING, "REQUEUE_FED": JobState.PENDING, "RESV_DEL_HOLD": JobState.PENDING,
    "SUSPENDED": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING, "RESIZING": JobState.RUNNING, "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED, "BOOT_FAIL": JobState.FAILED, "DEADLINE": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED, "TIMEOUT": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED, "REVOKED": JobState.CANCELLED,
    "PREEMPTED": JobState.PREEMPTED,
}
#: the job's exit code for the terminal states whose ranks' own codes do not tell the story
STATE_EXIT: dict[str, int] = {"TIMEOUT": 124, "CANCELLED": 130, "REVOKED": 130, "OUT_OF_MEMORY": 137,
                              "NODE_FAIL": 255, "BOOT_FAIL": 255, "DEADLINE": 124}
#: what a terminal Slurm state means, in words (the job's reason)
STATE_REASON: dict[str, str] = {
    "TIMEOUT": "TIMEOUT: the job reached its time limit (slurm.time)",
    "NODE_FAIL": "NODE_FAIL: a node of the allocation failed",
    "OUT_OF_MEMORY": "OUT_OF_MEMORY: a step ran out of memory",
    "PREEMPTED": "PREEMPTED: the scheduler preempted the job",
    "CANCELLED": "CANCELLED: scancel",
    "BOOT_FAIL": "BOOT_FAIL: a node failed to boot",
    "DEADLINE": "DEADLINE: the job missed its deadline",
}


def render(template: str, values: dict[str, Any]) -> str:
    from gtrain.jobs.templating import _env

    return str(_env().get_template(template).render(**values))
