"""A job previewed before its cluster exists (``launch --dry-run`` / ``run --dry-run`` on a spec alone): the
provider's plan and price, and every node's scripts as the job backend renders them (a scheduler's too: the
Slurm batch script, the Kubernetes manifests, the Ray job submission), with placeholders for
what only real nodes know (``<node K address>``, ``<root>``: gtrain's folder on the node, ``<job-id>``, port
29500). Touches nothing and calls no cloud: the plan comes from the catalog, the nodes are made up."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from gtrain.errors import ConfigError
from gtrain.remote.base import CommandResult, Runner

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec import ClusterSpec


class PreviewRunner(Runner):
    """A node that does not exist yet: an address and a root to render with, and nothing to run on."""

    def __init__(self, rank: int, root: str) -> None:
        self.label, self.address, self.root, self.python = f"node {rank}", f"<node {rank} address>", root, "python3"

    def _nothing(self, *_: Any, **__: Any) -> Any:
        raise ConfigError(f"{self.label} does not exist yet (a dry run)", field="--dry-run")

    def run(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        return self._nothing()  # type: ignore[no-any-return]

    def stream(self, cmd: str, on_line: Callable[[str], None], *, stdin: bytes | None = None,
               timeout: float | None = None) -> int:
        return self._nothing()  # type: ignore[no-any-return]

    def start_detached(self, cmd: str, *, stdin: bytes | None = None) -> None:
        self._nothing()

    def put_files(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        return self._nothing()  # type: ignore[no-any-return]

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        self._nothing()

    def fetch(self, remote_path: str, dest: BinaryIO, offset: int = 0,
              on_bytes: Callable[[int], None] | None = None) -> int:
        return self._nothing()  # type: ignore[no-any-return]


@dataclass
class Preview:
    cluster: str
    plan: dict[str, Any]
    scripts: dict[int, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "status": "dry-run", "plan": self.plan,
                "scripts": {str(k): v for k, v in self.scripts.items()}}


def preview(spec: ClusterSpec, ctx: Context) -> Preview:
    from gtrain.jobs.nodescript import NodeScriptBackend
    from gtrain.runs.launch import DRY_RUN_ID, check_job
    from gtrain.state import Cluster

    _job, workdir = check_job(spec, dry_run=True)
    if spec.resources.any_of:  # the candidate `up` would try first (gtrain.runs.placement)
        from gtrain.runs import placement

        spec = placement.choose(spec, placement.prepare(spec, ctx)[1]).spec
    provider = ctx.provider(spec.provider)
    plan = provider.plan(spec)  # ConfigError before anything is shown
    cluster = Cluster(id="<cluster-id>", name=spec.name, provider=spec.provider, status="planned",
                      num_nodes=spec.num_nodes, spec=spec.to_yaml_dict(), region=plan.region,
                      instance_type=plan.instance_type, market=plan.market, price_per_hour=plan.price_per_hour,
                      created_at=time.time(), terminated_at=None, extra={"base_dir": spec.base_dir})
    backend = provider.job_backend(cluster)
    if isinstance(backend, NodeScriptBackend):
        backend._runners = [PreviewRunner(k, "<root>") for k in range(spec.num_nodes)]
    # a scheduler's backend (slurm, kubernetes, ray) renders its batch script, manifests or job submission from
    # the spec alone: what only its live cluster knows stays a placeholder (<root>, <cluster-id>, <job-id>)
    from gtrain.jobs.backend import JobRequest

    job_plan = backend.dryrun(JobRequest(cluster, spec, DRY_RUN_ID, workdir))
    return Preview(spec.name, plan.to_dict(), job_plan.files)
