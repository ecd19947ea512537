"""torchrun (the default): ``python -m torch.distributed.run``, static rendezvous on node 0 (group rank =
node rank, so global rank 0 is on node 0). With ``job.fault_tolerance: torchft``, one torchrun per node, each
node a torchft replica group of its own (:func:`torchft_fields`; docs/durable.md, "torchft mode")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.jobs.launchers.base import SHIPPED, Launcher

if TYPE_CHECKING:
    from gtrain.jobs.templating import NodeContext
    from gtrain.spec import ClusterSpec


class Torchrun(Launcher):
    name = "torchrun"
    starter = "torchrun"

    def node_files(self, ctx: NodeContext) -> dict[str, str]:
        files = super().node_files(ctx)
        if ctx.min_nodes and ctx.checkpoint_store:  # elastic: each round agrees on the step it resumes from
            files["elastic_round.py"] = (SHIPPED / "elastic_round.py").read_text()
        if ctx.fault_tolerance == "torchft" and ctx.node_rank == 0 and ctx.torchft.get("port"):
            files["torchft_lighthouse.py"] = (SHIPPED / "torchft_lighthouse.py").read_text()  # templates/_torchft.sh
        return files

    def node_command(self, ctx: NodeContext) -> str:
        if ctx.fault_tolerance == "torchft":  # each node its own replica group (docs/durable.md, "torchft mode")
            return self._render(ctx, "torchft")
        return self._render(ctx)


LAUNCHER = Torchrun()


def torchft_fields(spec: ClusterSpec, master_addr: str, master_port: int, num_nodes: int,
                   market: str | None) -> tuple[dict[str, Any], str | None]:
    """torchft mode's render fields (``NodeContext.torchft``) and a warning for node 0 when its Lighthouse would
    run on a spot node. Node 0 runs the Lighthouse at ``job.torchft.port`` (default: the job's port, found free on
    node 0 at launch; each group's own rendezvous takes a free port of its node: ``--standalone``), unless
    ``job.torchft.lighthouse`` names one the user runs."""
    from gtrain.spec.torchft import options

    opts = options(spec)
    if opts.lighthouse:
        return {"lighthouse": opts.lighthouse.rstrip("/"), "port": 0, "bind": "", "args": []}, None
    port = opts.port or master_port
    v6 = ":" in master_addr
    host = f"[{master_addr}]" if v6 else master_addr
    fields = {"lighthouse": f"http://{host}:{port}", "port": port, "bind": f"{'[::]' if v6 else '0.0.0.0'}:{port}",
              "args": opts.lighthouse_args()}
    spot = market == "spot" or (market is None and spec.resources.use_spot)  # the cluster's, else the spec's
    note = ("job.fault_tolerance: torchft runs the Lighthouse on node 0, which is a spot node: its preemption "
            "stops every replica group (a whole-job recovery); put node 0 on demand, or run the Lighthouse on a "
            "machine that stays and give job.torchft.lighthouse") if spot else None
    return fields, note
