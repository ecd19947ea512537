"""What a run does with the health checks: ``policies.preflight`` before a launch (replacing bad nodes once
with ``--replace-bad``), and ``policies.min_gpu_util`` while a job runs (warn, or stop the job). The checks and
the telemetry are :mod:`gtrain.health`'s; the notification :mod:`gtrain.runs.notify`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gtrain.health.checks import run_health
from gtrain.health.model import HealthFailed, HealthReport, Verdict
from gtrain.health.telemetry import SAMPLES, idle_for, read

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec import ClusterSpec
    from gtrain.spec.health import MinGpuUtil
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord


def preflight(cluster: Cluster, spec: ClusterSpec, ctx: Context, *, replace_bad: bool = False) -> HealthReport | None:
    """``policies.preflight`` before a launch: None when off (``replace_bad`` runs it ``quick`` then); raises
    :class:`HealthFailed` (exit 1, the failed nodes named) when a check fails. With ``replace_bad`` the failed
    nodes are replaced once through the provider (``Provider.replace_nodes``) and every check runs again: a
    second failure stops the launch."""
    mode = spec.policies.preflight
    if mode == "off" and not replace_bad:
        return None
    mode = "quick" if mode == "off" else mode
    report = _preflight_once(cluster, spec, ctx, mode)
    if report.failed() and replace_bad and report.failed_nodes():
        bad = report.failed_nodes()
        ctx.report.warn(f"preflight: replacing node(s) {', '.join(map(str, bad))} (--replace-bad): {report.summary()}")
        ctx.provider(cluster.provider).replace_nodes(cluster, bad)
        ctx.event(cluster, "preflight", node=bad, msg=f"replaced node(s) {', '.join(map(str, bad))}")
        report = _preflight_once(cluster, spec, ctx, mode)
    if report.failed():
        from gtrain.runs.notify import notify_cluster

        notify_cluster(cluster, ctx, "health_failed", spec.notify, detail=f"preflight ({mode}): {report.summary()}")
        again = " after replacing them once" if replace_bad and report.failed_nodes() else ""
        raise HealthFailed(report, hint=f"see `gtrain health {cluster.name}`; fix or replace the named node(s)"
                                        f"{again}, or set policies.preflight: off")
    ctx.report.info(f"preflight ({mode}) passed in {report.seconds:.1f}s")
    return report


def _preflight_once(cluster: Cluster, spec: ClusterSpec, ctx: Context, mode: str) -> HealthReport:
    report = run_health(cluster, ctx, mode, spec)
    for c in report.checks:
        if c.verdict is Verdict.WARN:
            ctx.report.warn(f"preflight: {'cluster' if c.node is None else f'node {c.node}'} {c.name}: {c.reason}")
    ctx.event(cluster, "preflight", ok=not report.failed(), msg=report.summary())
    return report


def enforce_min_gpu_util(cluster: Cluster, job: JobRecord, ctx: Context, policy: MinGpuUtil | None = None,
                         now: float | None = None) -> str | None:
    """Apply ``policies.min_gpu_util`` to a running job: the warning given (and the job stopped with
    ``action: stop``), or None when the GPUs are busy enough (or there is no policy / no telemetry)."""
    if policy is None:
        policy = ctx.spec_of(cluster).policies.min_gpu_util
    if policy is None:
        return None
    idle = idle_for(read(cluster, job, ctx, max(SAMPLES, int(policy.minutes * 6 * 16) + 16)), policy, now)
    if idle is None:
        return None
    msg = (f"job {job.id}: every GPU under {policy.percent:g}% utilisation for {idle / 60:.0f} min "
           f"(policies.min_gpu_util: {policy.minutes:g} min)")
    if policy.action == "stop":
        ctx.report.warn(msg + "; stopping the job")
        ctx.backend(cluster).cancel(job, grace_s=10)
        from gtrain.runs.notify import notify_job

        notify_job(cluster, ctx.store.get_job(job.id), ctx, "idle_stopped", detail=msg)
    else:
        ctx.report.warn(msg + f"; `gtrain cancel {cluster.name}` stops it")
    return msg
