"""GPU telemetry of a running job: the samples its nodes keep (``JOB/telemetry/node-K.jsonl``, written by
``templates/_telemetry.sh.j2``), read for `status --gpus` and `top`, and how long every GPU has been idle
(:func:`idle_for`, the ``policies.min_gpu_util`` rule that :func:`gtrain.runs.preflight.enforce_min_gpu_util`
applies while a job is followed)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.remote.fanout import parallel

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec.health import MinGpuUtil
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

#: samples asked of each node: 1 h of 10 s samples for 8 GPUs would be 2880; the policy window needs less
SAMPLES = 2000


@dataclass
class NodeTelemetry:
    node: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    #: with ``read(..., energy=True)``: every kept sample of the node integrated (gtrain.health.nodeprobe.integrate)
    energy: dict[str, Any] | None = None

    def latest(self) -> list[dict[str, Any]]:
        """The newest sample of each GPU, in GPU order."""
        last: dict[int, dict[str, Any]] = {}
        for s in self.samples:
            if isinstance(s, dict) and isinstance(s.get("gpu"), int):
                last[s["gpu"]] = s
        return [last[g] for g in sorted(last)]

    def steps_per_s(self) -> float | None:
        """From the job's metrics file, when it reports ``step`` with a time (``t``/``time``/``timestamp``)."""
        raw = [(m.get("t", m.get("time", m.get("timestamp"))), m.get("step")) for m in self.metrics[-2:]]
        pts = [(float(t), float(s)) for t, s in raw if isinstance(t, int | float) and isinstance(s, int | float)]
        if len(pts) == 2 and pts[1][0] > pts[0][0]:
            return (pts[1][1] - pts[0][1]) / (pts[1][0] - pts[0][0])
        return None


def read(cluster: Cluster, job: JobRecord, ctx: Context, samples: int = SAMPLES, *,
         energy: bool = False) -> list[NodeTelemetry]:
    """Every node's telemetry of ``job`` (a node that cannot be asked: ``error`` set); with ``energy``, each
    node's energy so far, integrated on the node over every sample it kept."""
    from gtrain.health.checks import call_node
    from gtrain.health.energy import tdp_of
    from gtrain.jobs.nodescript import job_dir

    runners = ctx.runners(cluster)
    metrics = str(job.info.get("metrics_file") or "")
    accel = str((cluster.spec.get("resources") or {}).get("accelerators") or "")
    extra = [str(tdp_of(accel.split(":")[0]) or 0)] if energy else []

    def one(i: int) -> NodeTelemetry:
        r = runners[i]
        jd = job_dir(r, job.id)
        try:
            doc = call_node(r, "telemetry", jd, str(samples), metrics or f"{jd}/metrics.jsonl", *extra, timeout=30)
        except (GtrainError, ValueError) as e:  # unreachable, or gone (a kubernetes pod after its job): a row
            return NodeTelemetry(i, error=getattr(e, "message", str(e)))
        return NodeTelemetry(i, list(doc.get("samples") or []), list(doc.get("metrics") or []),
                             energy=doc.get("energy"))

    return parallel(one, list(range(len(runners))))


def rows(tele: list[NodeTelemetry], now: float | None = None) -> list[list[Any]]:
    """Table rows: node, GPU, util %, memory used/total MiB, temperature C, power W, steps/s, sample age."""
    now = now or time.time()
    out: list[list[Any]] = []
    for t in tele:
        if t.error or not t.latest():
            out.append([t.node, "-", "-", "-", "-", "-", _fmt(t.steps_per_s()), t.error or "no samples"])
            continue
        for s in t.latest():
            out.append([t.node, s["gpu"], _fmt(s.get("util"), "%"), f"{_fmt(s.get('mem_used'))}/"
                        f"{_fmt(s.get('mem_total'))} MiB", _fmt(s.get("temp"), " C"), _fmt(s.get("power"), " W"),
                        _fmt(t.steps_per_s()), f"{max(0.0, now - float(s.get('t') or now)):.0f}s ago"])
    return out


def _fmt(v: Any, unit: str = "") -> str:
    if not isinstance(v, int | float):
        return "-"
    return f"{v:.3g}{unit}" if isinstance(v, float) and not float(v).is_integer() else f"{int(v)}{unit}"


def idle_for(tele: list[NodeTelemetry], policy: MinGpuUtil, now: float | None = None) -> float | None:
    """Seconds every GPU of the cluster has been under ``policy.percent`` (None: not idle, or the samples do
    not cover the policy's window yet)."""
    now = now or time.time()
    samples = [s for t in tele for s in t.samples if isinstance(s, dict) and isinstance(s.get("t"), int | float)]
    if not samples or any(t.error for t in tele):
        return None
    busy = [float(s["t"]) for s in samples if isinstance(s.get("util"), int | float) and s["util"] >= policy.percent]
    since = max(busy) if busy else min(float(s["t"]) for s in samples)
    idle = now - since
    return idle if idle >= policy.minutes * 60 else None
