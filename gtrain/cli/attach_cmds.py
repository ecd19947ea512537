"""gtrain attach."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.params import JSON


def register(app: typer.Typer) -> None:
    app.command("attach")(attach)


def attach(
    name: str = typer.Argument(..., metavar="NAME", show_default=False,
                               help="The cluster's name (its gtrain:cluster-name tag / label, its Slurm folder)."),
    spec: str = typer.Argument(None, metavar="[SPEC]", help="The spec it was made from (how its nodes, login node or "
                               "namespace are reached); default: the one node 0 keeps."),
    provider: str = typer.Option(..., "--provider", metavar="P", help="The provider it runs on (one that can "
                                  "find a cluster by its tags: docs/commands.md#gtrain-attach).",
                                  show_default=False),
    region: list[str] = typer.Option(None, "--region", metavar="R", help="Where to look: the provider's region, "
                                     "zone, namespace, data center, country or project (docs/commands.md#gtrain-"
                                     "attach); repeatable. Default: the spec's."),
    num_nodes: int = typer.Option(None, "--num-nodes", metavar="N", help="Without a spec: how many nodes it has."),
    json_: bool = JSON,
) -> None:
    """Adopt a running cluster by its tags/labels (no state needed): then status, logs, pull, down work here."""
    out.set_json(json_)
    from gtrain.context import Context
    from gtrain.runs.attach import attach as core
    from gtrain.spec import load_spec

    ctx = Context(report=out.CLIReporter())
    try:
        parsed = load_spec(spec) if spec else None
        c = core(ctx, name, provider, list(region or []), parsed, num_nodes)
        jobs = ctx.store.jobs(c.id)
    finally:
        ctx.store.close()
    if json_:
        out.emit_json({"cluster": c.name, "id": c.id, "provider": c.provider, "num_nodes": c.num_nodes,
                       "jobs": [j.id for j in jobs]})
        return
    out.say(f"attached {c.name} ({c.id}): {c.num_nodes} {c.provider} node(s), {len(jobs)} job(s). "
            f"Next: gtrain status {c.name}")
