"""gtrain up / down / status."""

from __future__ import annotations

import typer

from gtrain.cli import output as out

JSON = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else.")


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)


def _confirm(msg: str, yes: bool) -> None:
    import sys

    from gtrain.errors import ConfigError

    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfigError(f"{msg} needs confirmation and there is no terminal to ask", field="--yes",
                          hint="pass --yes to confirm non-interactively")
    if not typer.confirm(msg, default=True, err=True):
        raise typer.Exit(1)


def print_plan(plan: dict) -> None:  # type: ignore[type-arg]
    gpus = f"{plan['gpus_per_node']}x {plan['gpu_name']}" if plan.get("gpu_name") else "-"
    out.table("plan", ["provider", "nodes", "instance type", "GPUs/node", "market", "region", "zone", "$/h (cluster)",
                       "estimate"],
              [[plan["provider"], plan["num_nodes"], plan["instance_type"] or "-", gpus, plan["market"],
                plan["region"] or "-", plan["zone"] or "-", out.fmt_usd(plan["cluster_price_per_hour"]),
                "-" if plan["estimate_usd"] is None else f"{out.fmt_usd(plan['estimate_usd'])} for "
                f"{plan['max_hours']} h (policies.max_hours)"]])
    for n in plan.get("notes") or []:
        out.console().print(f"note: {n}")


def up(
    spec: str = typer.Argument(..., help="Path to the YAML spec."),
    name: str = typer.Option(None, "--name", help="Cluster name (overrides name: in the spec)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan and the price; create nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Don't ask before creating paid resources."),
    json_: bool = JSON,
) -> None:
    """Provision the cluster's nodes."""
    out.set_json(json_)
    import gtrain.api as api
    from gtrain.spec import load_spec

    parsed = load_spec(spec, name=name)
    rep = out.CLIReporter()
    if not dry_run and parsed.provider not in ("local", "ssh"):
        plan = api.up(parsed, dry_run=True, report=rep).plan
        _confirm(f"Create {plan.num_nodes} {plan.instance_type} node(s) at "
                 f"{out.fmt_usd(plan.cluster_price_per_hour)}/h?", yes)
    res = api.up(parsed, dry_run=dry_run, report=rep)
    if json_:
        out.emit_json(res.to_dict())
        return
    print_plan(res.plan.to_dict())
    if res.cluster is not None:
        verb = "is up" if res.created else "was already up"
        out.console().print(f"cluster {res.cluster.name} {verb}: {res.cluster.num_nodes} node(s). "
                            f"Next: gtrain launch --cluster {res.cluster.name}")


def down(
    cluster: str = typer.Argument(..., help="Cluster name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Don't ask for confirmation."),
    json_: bool = JSON,
) -> None:
    """Stop jobs, delete every resource of the cluster, print what it cost."""
    out.set_json(json_)
    import sys

    import gtrain.api as api

    if not yes and sys.stdin.isatty() and not json_:
        # On a terminal, ask: down deletes the nodes and what is on them. Without a TTY (CI) it just runs.
        _confirm(f"Tear down {cluster} and delete everything on its nodes?", False)
    res = api.down(cluster, report=out.CLIReporter())
    if json_:
        out.emit_json(res.to_dict())
        return
    c = out.console()
    if res.already_down:
        c.print(f"cluster {cluster} is already down; nothing to do.")
    else:
        c.print(f"cluster {cluster} is down; every resource it made is deleted.")
    out.cost_table(res.cost)


def status(
    cluster: str = typer.Argument(None, help="Show one cluster in detail (asks its nodes about its jobs)."),
    json_: bool = JSON,
) -> None:
    """Clusters and their jobs."""
    out.set_json(json_)
    import gtrain.api as api

    rows = api.status(cluster, report=out.CLIReporter())
    if json_:
        out.emit_json({"clusters": rows} if cluster is None else rows[0])
        return
    if not rows:
        out.console().print("no clusters. `gtrain up SPEC` makes one.")
        return
    out.table(None, ["cluster", "provider", "status", "nodes", "type", "$/h", "up (h)", "last job", "job status"],
              [[r["name"], r["provider"], r["status"], r["num_nodes"], r["instance_type"] or "-",
                out.fmt_usd(r["price_per_hour"]), f"{r['uptime_hours']:.2f}",
                r["jobs"][-1]["id"] if r["jobs"] else "-",
                (r["jobs"][-1]["status"] + ("" if r["jobs"][-1]["exit_code"] is None
                                            else f" (exit {r['jobs'][-1]['exit_code']})")) if r["jobs"] else "-"]
               for r in rows])
    if cluster is not None:
        r = rows[0]
        out.table("nodes", ["node", "address", "status", "zone", "detail"],
                  [[n["rank"], n["address"] or "-", n["status"], n["zone"] or "-", n["detail"] or ""]
                   for n in r["nodes"]])
        out.table("jobs", ["job", "status", "exit", "started", "ended", "run"],
                  [[j["id"], j["status"], "-" if j["exit_code"] is None else j["exit_code"],
                    out.fmt_time(j["created_at"]),
                    out.fmt_time(j["ended_at"]), j["run"] or "-"] for j in r["jobs"]])
