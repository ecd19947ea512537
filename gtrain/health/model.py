"""The health verdicts (one per check and node, with a figure and a one-line reason) and the report they make.
The spec's health policies (``policies.preflight``, ``policies.min_gpu_util``) are in :mod:`gtrain.spec.health`."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from gtrain.errors import GtrainError


class Verdict(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIPPED = "skipped"  # nothing to check here (no GPU asked, none found): counts as ok

    @property
    def rank(self) -> int:
        return {"skipped": 0, "ok": 0, "warn": 1, "fail": 2}[self.value]


@dataclass
class Check:
    """One check's verdict on one node (``node`` None: the cluster as a whole, e.g. versions across nodes)."""

    name: str  # gpu.count, gpu.ecc, interconnect.allreduce, sdc.digest, host.disk, ...
    verdict: Verdict
    figure: str  # "8/8 A100", "0 uncorrectable", "38.2 GB/s busbw at 64 MB"
    reason: str  # one line
    node: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d


@dataclass
class HealthReport:
    cluster: str
    mode: str  # quick | full
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, *checks: Check) -> None:
        self.checks.extend(checks)

    @property
    def verdict(self) -> Verdict:
        worst = max((c.verdict for c in self.checks), key=lambda v: v.rank, default=Verdict.OK)
        return Verdict.OK if worst is Verdict.SKIPPED else worst

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.verdict is Verdict.FAIL]

    def failed_nodes(self) -> list[int]:
        return sorted({c.node for c in self.failed() if c.node is not None})

    def summary(self) -> str:
        """One line: the verdict, and the failed checks with their nodes."""
        bad = self.failed()
        if not bad:
            warns = [c for c in self.checks if c.verdict is Verdict.WARN]
            return f"{self.cluster}: healthy ({len(self.checks)} checks" + (f", {len(warns)} warning(s))" if warns
                                                                             else ")")
        parts = [f"{'cluster' if c.node is None else f'node {c.node}'} {c.name}: {c.reason}" for c in bad]
        return f"{self.cluster}: {len(bad)} check(s) failed: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "mode": self.mode, "verdict": self.verdict.value,
                "seconds": round(self.seconds, 2), "failed_nodes": self.failed_nodes(),
                "checks": [c.to_dict() for c in self.checks]}


class HealthFailed(GtrainError):
    """A health check failed (exit 1: the nodes, not the spec, are at fault); the message names the nodes."""

    def __init__(self, report: HealthReport, hint: str | None = None) -> None:
        super().__init__(report.summary(), hint)
        self.report = report
