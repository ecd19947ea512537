"""torchft mode: ``job.fault_tolerance: torchft`` (docs/durable.md, "torchft mode").

Each node is one torchft replica group (its own torchrun, its own rendezvous and ``MASTER_PORT``); the groups
find each other through torchft's Lighthouse, which node 0 runs (or one the user runs: ``job.torchft.lighthouse``).
:class:`TorchftOptions` is ``job.torchft``; :func:`check` refuses what torchft mode cannot run, naming the field,
the value and the fix. Pydantic only: nothing here imports torchft.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec

#: what gtrain sets on every rank in torchft mode (``job.env`` / ``job.secrets`` may not set them)
RESERVED = ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE")
URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}/?$")


class TorchftOptions(BaseModel):
    """``job.torchft``: the Lighthouse gtrain runs on node 0 (only with ``job.fault_tolerance: torchft``). The
    defaults are those torchft's README starts it with (``torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100
    --join_timeout_ms 10000``), and the Lighthouse's own heartbeat timeout."""

    model_config = ConfigDict(extra="forbid", strict=True)  # a number is a number (no `true`, no "5000")
    lighthouse: str | None = Field(None, description="`http://HOST:PORT` of a Lighthouse you run (on a machine "
                                   "that is not preemptible); gtrain then starts none on node 0")
    port: int | None = Field(None, ge=1024, le=65535, description="node 0's Lighthouse port; default: the job's "
                             "port (found free on node 0 at launch)")
    min_replicas: int = Field(1, ge=1, le=4096, description="replica groups the Lighthouse needs for a quorum")
    join_timeout_ms: int = Field(10000, ge=0, le=3_600_000, description="how long a quorum waits for groups "
                                 "that heartbeat but have not asked to join yet")
    quorum_tick_ms: int = Field(100, ge=1, le=60_000, description="how often the Lighthouse checks for a quorum")
    heartbeat_timeout_ms: int = Field(5000, ge=100, le=600_000, description="a group silent this long is dead: "
                                      "the others go on without it after this long")

    @field_validator("lighthouse")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not URL_RE.match(v):
            raise ValueError(f"{v!r} is not a Lighthouse address; give http://HOST:PORT")
        return v

    def lighthouse_args(self) -> list[str]:
        """The shipped starter's arguments after the bind address (gtrain/jobs/launchers/torchft_lighthouse.py)."""
        return [str(self.min_replicas), str(self.join_timeout_ms), str(self.quorum_tick_ms),
                str(self.heartbeat_timeout_ms)]


def options(spec: ClusterSpec) -> TorchftOptions:
    """``job.torchft``, or its defaults."""
    raw: Any = getattr(spec.job, "torchft", None) if spec.job is not None else None
    return raw if isinstance(raw, TorchftOptions) else TorchftOptions.model_validate(raw or {})


def problem(spec: ClusterSpec) -> tuple[str, str] | None:
    """What torchft mode cannot run in ``spec``, as ``(field, one line naming the value and the fix)``; None
    when it can (or the job does not use torchft mode)."""
    from gtrain.spec.elastic import NOT_ELASTIC_PROVIDER

    job = spec.job
    if job is None:
        return None
    if job.fault_tolerance != "torchft":
        if getattr(job, "torchft", None) is not None:
            return ("job.torchft", "job.torchft: given, but job.fault_tolerance is not torchft; set "
                    "fault_tolerance: torchft or remove job.torchft")
        return None
    if job.launcher != "torchrun":
        return ("job.launcher", f"job.launcher: {job.launcher!r} cannot run job.fault_tolerance: torchft (each "
                "node is a replica group started by its own torchrun); set launcher: torchrun or remove "
                "fault_tolerance")
    providers = {spec.provider, *(c.provider for c in spec.resources.any_of or [] if c.provider)}
    for p in sorted(providers & set(NOT_ELASTIC_PROVIDER)):
        return ("job.fault_tolerance", f"job.fault_tolerance: torchft cannot run on provider {p}: "
                f"{NOT_ELASTIC_PROVIDER[p]}, and torchft mode replaces one node alone; use a provider of "
                "machines (local, ssh, aws, gcp, azure, lambda) or remove fault_tolerance")
    if job.image and options(spec).lighthouse is None:
        return ("job.fault_tolerance", "job.fault_tolerance: torchft with job.image is not supported yet (node 0 "
                "starts the Lighthouse with the host's python); remove job.image, or run the Lighthouse yourself "
                "and give job.torchft.lighthouse")
    for name in RESERVED:
        if name in job.env or name in job.secrets:
            return ("job.env", f"job.env: {name} is set by gtrain in torchft mode (each node's replica group); "
                    f"remove it" + (" (job.torchft.lighthouse names your own Lighthouse)"
                                    if name == "TORCHFT_LIGHTHOUSE" else ""))
    return None


def check(spec: ClusterSpec) -> None:
    """The spec's check (a ``ValueError``, as :func:`gtrain.spec.elastic.check`)."""
    if found := problem(spec):
        raise ValueError(found[1])
