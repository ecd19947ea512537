"""deepspeed: the ``deepspeed`` launcher in its no-SSH mode (``--no_ssh --node_rank --master_addr
--master_port --num_nodes --num_gpus`` with a hostfile of the cluster's nodes written by gtrain), so each node
is started by gtrain as with torchrun and DeepSpeed never needs pdsh. Where the installed DeepSpeed lacks
``--no_ssh`` (checked on the node at run time) the node falls back to torchrun; the script's
``deepspeed.initialize`` reads torchrun's env."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.jobs.launchers.base import Launcher, config_file

if TYPE_CHECKING:
    from gtrain.jobs.templating import NodeContext
    from gtrain.spec import ClusterSpec


class DeepSpeed(Launcher):
    name = "deepspeed"
    starter = "deepspeed's launcher (or torchrun, its fallback)"

    def check(self, spec: ClusterSpec, workdir: Path, nproc: int) -> tuple[dict[str, Any], list[str]]:
        job = spec.job
        opts = self.options(job.deepspeed.model_dump() if job and job.deepspeed else {})
        config_file("job.deepspeed.config", opts.config, workdir)
        return {}, []

    def script_argv(self, ctx: NodeContext) -> list[str]:
        opts = self.options(ctx.launcher_options)
        if opts.config and opts.config_arg and opts.config_arg not in ctx.argv:
            return [*ctx.argv, opts.config_arg, f"{ctx.workdir}/{opts.config}"]
        return list(ctx.argv)

    def node_files(self, ctx: NodeContext) -> dict[str, str]:
        hosts = "".join(f"node-{k} slots={ctx.nproc_per_node}\n" for k in range(ctx.num_nodes))
        return {**super().node_files(ctx), "hostfile": hosts}

    def node_command(self, ctx: NodeContext) -> str:
        from dataclasses import replace

        from gtrain.jobs.launchers.torchrun import LAUNCHER as TORCHRUN

        argv = self.script_argv(ctx)
        fallback = TORCHRUN.node_command(replace(ctx, argv=argv))
        return self._render(ctx, script_argv=argv, fallback=fallback)


LAUNCHER = DeepSpeed()
