"""gtrain up / down / stop / start / status."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.overrides import ENV, GPUS, NUM_NODES, SPOT, Overrides
from gtrain.cli.params import BREAK_LOCK, CLUSTER, JSON, NAME, SPEC, YES_PAID, break_lock, confirm, confirm_price


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("stop")(stop)
    app.command("start")(start)
    app.command("status")(status)


def print_plan(plan: dict) -> None:  # type: ignore[type-arg]
    gpus = f"{plan['gpus_per_node']}x {plan['gpu_name']}" if plan.get("gpu_name") else "-"
    out.table("plan", ["provider", "nodes", "instance type", "GPUs/node", "market", "region", "zone", "$/h (cluster)",
                       "estimate"],
              [[plan["provider"], plan["num_nodes"], plan["instance_type"] or "-", gpus, plan["market"],
                plan["region"] or "-", plan["zone"] or "-", out.fmt_usd(plan["cluster_price_per_hour"]),
                "-" if plan["estimate_usd"] is None else f"{out.fmt_usd(plan['estimate_usd'])} for "
                f"{plan['max_hours']} h (policies.max_hours)"]])
    for n in plan.get("notes") or []:
        out.say(f"note: {n}")


def ssh_include_hint(cluster: str) -> str | None:
    """The ``Include`` line for ~/.ssh/config, for a cluster whose nodes are reached over SSH (else None)."""
    import gtrain.api as api
    from gtrain.errors import GtrainError

    try:
        argv, _ = api.shell_argv(cluster, node=0)
    except GtrainError:
        return None
    if argv[0] != "ssh" or "-F" not in argv:
        return None
    return (f"`ssh {cluster}-0`, rsync and VS Code Remote: add `Include {argv[argv.index('-F') + 1]}` to "
            "~/.ssh/config, before any `Host *` block")


def up(
    spec: str = SPEC,
    name: str = NAME,
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan and the price; create nothing."),
    keep_failed: bool = typer.Option(False, "--keep-failed", help="If up fails, keep what it made (to look at "
                                     "it; `gtrain down` deletes it). Default: delete it."),
    recreate: bool = typer.Option(False, "--recreate", help="If the cluster is up with another shape, replace "
                                  "it (down, then up). Default: refuse."),
    yes: bool = YES_PAID,
    json_: bool = JSON,
    env: list[str] = ENV,
    num_nodes: int = NUM_NODES,
    gpus: str = GPUS,
    spot: bool = SPOT,
    break_lock_: bool = BREAK_LOCK,
) -> None:
    """Provision the cluster's nodes."""
    out.set_json(json_)
    break_lock(break_lock_)
    import gtrain.api as api

    ov = Overrides(env or [], num_nodes, gpus, spot, name)
    parsed = ov.load(spec)
    rep = out.CLIReporter()
    try:
        if not dry_run:
            confirm_price(parsed, yes, rep)
        res = api.up(parsed, dry_run=dry_run, keep_failed=keep_failed, recreate=recreate, report=rep)
    except Exception as e:
        if ov.blame(e) is e:
            raise
        raise ov.blame(e) from None
    if json_:
        out.emit_json(res.to_dict())
        return
    out.placement_table(res.placement)
    print_plan(res.plan.to_dict())
    if ov.note():
        out.say(f"note: {ov.note()}")
    if res.cluster is not None:
        verb = "is up" if res.created else "was already up"
        out.say(f"cluster {res.cluster.name} {verb}: {res.cluster.num_nodes} node(s). "
                f"Next: gtrain launch --cluster {res.cluster.name}")
        hint = ssh_include_hint(res.cluster.name)
        if hint:
            out.say(hint)


def down(
    cluster: str = CLUSTER,
    yes: bool = typer.Option(False, "--yes", "-y", help="Don't ask for confirmation."),
    no_report: bool = typer.Option(False, "--no-report", help="Don't write the run's HTML report (default: next "
                                   "to its pulled checkpoints, else in the run archive)."),
    json_: bool = JSON,
    break_lock_: bool = BREAK_LOCK,
) -> None:
    """Stop jobs, delete every resource of the cluster, print what it cost."""
    out.set_json(json_)
    break_lock(break_lock_)
    import sys

    import gtrain.api as api
    from gtrain.errors import ConfigError

    if not yes and json_:
        raise ConfigError("--json needs --yes to delete: down deletes the nodes and everything on them",
                          field="--yes", hint=f"gtrain down {cluster} --yes --json")
    if not yes and sys.stdin.isatty():
        # On a terminal, ask (default no): down deletes the nodes and what is on them. Without a TTY (CI)
        # it just runs.
        confirm(f"Tear down {cluster} and delete everything on its nodes?", False)
    res = api.down(cluster, yes=yes, report=out.CLIReporter(), html_report=not no_report)
    if json_:
        out.emit_json(res.to_dict())
        return
    if res.already_down:
        out.say(f"cluster {cluster} is already down; nothing to do.")
    else:
        out.say(f"cluster {cluster} is down; every resource it made is deleted.")
    out.cost_table(res.cost)
    if res.report:
        out.say(f"report: {res.report}")


def stop(cluster: str = CLUSTER, json_: bool = JSON) -> None:
    """Stop a VM cluster's nodes (aws, gcp), keeping their disks: compute billing ends, the disks bill on."""
    out.set_json(json_)
    import gtrain.api as api

    res = api.stop(cluster, report=out.CLIReporter())
    if json_:
        out.emit_json(res.to_dict())
        return
    was = "was already stopped" if res.already else "is stopped"
    out.say(f"cluster {cluster} {was}: {len(res.nodes)} node(s), disks and files kept; compute billing has ended.")
    for n in res.nodes:
        out.say(f"node {n.rank}: {n.disk_label} {n.disk_gb:g} GB still billed at ${n.disk_usd_per_gb_month:g}/GB-month "
                f"(${n.usd_per_hour:.4f}/h)")
    out.say(f"disks: {out.fmt_usd(res.disk_usd_per_hour)}/h (~{out.fmt_usd(res.disk_usd_per_hour * 730)}/month) "
            f"until `gtrain start {cluster}` or `gtrain down {cluster}`")


def start(cluster: str = CLUSTER, json_: bool = JSON) -> None:
    """Start a stopped VM cluster's nodes again (aws, gcp); jobs can be launched once it returns."""
    out.set_json(json_)
    import gtrain.api as api

    res = api.start(cluster, report=out.CLIReporter())
    if json_:
        out.emit_json(res.to_dict())
        return
    if res.started:
        out.say(f"cluster {cluster} is up again: node(s) {res.started} started (addresses may have changed; "
                f"the ssh config is rewritten). Next: gtrain launch --cluster {cluster}")
    else:
        out.say(f"cluster {cluster} is up; no node of it was stopped.")


def status(
    cluster: str = typer.Argument(None, metavar="[CLUSTER]",
                                  help="Show one cluster in detail (asks its nodes about its jobs)."),
    gpus: bool = typer.Option(False, "--gpus", help="Each node's GPUs now: utilisation, memory, temperature, "
                              "power, steps/s (needs CLUSTER)."),
    json_: bool = JSON,
) -> None:
    """Clusters and their jobs."""
    if gpus:
        from gtrain.cli.health_cmds import show_gpus
        from gtrain.errors import ConfigError

        if cluster is None:
            raise ConfigError("status --gpus: no CLUSTER given", field="CLUSTER", hint="gtrain status CLUSTER --gpus")
        return show_gpus(cluster, json_)
    from gtrain.cli.views import show_status

    show_status(cluster, json_)
