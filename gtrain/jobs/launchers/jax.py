"""jax: one process per node (or one per GPU), started by gtrain's spawner; gtrain's wrapper (``jaxrun.py``)
calls ``jax.distributed.initialize(coordinator_address, num_processes, process_id)`` before the script runs
(``runpy``), unless ``jax: {initialize: false}``; ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
``JAX_PROCESS_ID`` are set for scripts that call it themselves."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.jobs.launchers.base import SHIPPED, SpawnedLauncher

if TYPE_CHECKING:
    from gtrain.jobs.templating import NodeContext
    from gtrain.spec import ClusterSpec


class Jax(SpawnedLauncher):
    name = "jax"
    flavor = "jax"

    def default_nproc(self, gpus_per_node: int) -> int:
        return 1  # one process sees every local device

    def check(self, spec: ClusterSpec, workdir: Path, nproc: int) -> tuple[dict[str, Any], list[str]]:
        gpus = spec.resources.gpus_per_node
        if nproc != 1 and nproc != gpus:
            where = f"a node with {gpus} GPU(s)" if gpus else "CPU (no resources.accelerators)"
            raise ConfigError(
                f"job.nproc_per_node: {nproc} process(es) per node cannot run JAX on {where}",
                hint="JAX runs one process per node (it sees every local device)"
                     + (f" or one per GPU ({gpus})" if gpus else "") + ": remove job.nproc_per_node or set it to 1",
                field="job.nproc_per_node")
        return {}, []

    def node_files(self, ctx: NodeContext) -> dict[str, str]:
        return {**super().node_files(ctx), "jaxrun.py": (SHIPPED / "jaxrun.py").read_text()}

    def rank_argv(self, ctx: NodeContext) -> list[str]:
        if self.options(ctx.launcher_options).initialize:
            return [f"{ctx.job_dir}/jaxrun.py", *ctx.argv]
        return list(ctx.argv)


LAUNCHER = Jax()
