"""torchrun (the default): ``python -m torch.distributed.run``, static rendezvous on node 0 (group rank =
node rank, so global rank 0 is on node 0)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gtrain.jobs.launchers.base import Launcher

if TYPE_CHECKING:
    from gtrain.jobs.templating import NodeContext


class Torchrun(Launcher):
    name = "torchrun"
    starter = "torchrun"

    def node_command(self, ctx: NodeContext) -> str:
        return self._render(ctx)


LAUNCHER = Torchrun()
