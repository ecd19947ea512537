"""gtrain launch / logs / pull / run."""

from __future__ import annotations

import typer

from gtrain.cli import output as out

JSON = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else.")


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
    app.command("logs")(logs)
    app.command("pull")(pull)
    app.command("run")(run)


def _exit(code: int | None) -> None:
    raise typer.Exit(1 if code is None else (code if 0 <= code <= 255 else 1))


def launch(
    spec: str = typer.Argument(None, help="Path to the YAML spec (its job section is launched)."),
    cluster: str = typer.Option(None, "--cluster", "-c", help="Launch on this existing cluster."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Follow the logs; exit with the job's own exit code."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the rendered launch script; start nothing."),
    force: bool = typer.Option(False, "--force", help="Cancel a job still running on the cluster first."),
    json_: bool = JSON,
) -> None:
    """Sync the workdir, run setup, start torchrun on every node (detached); print the job id."""
    out.set_json(json_)
    import gtrain.api as api

    rep = out.CLIReporter()
    res = api.launch(spec, cluster=cluster, force=force, dry_run=dry_run, report=rep)
    if dry_run:
        if json_:
            out.emit_json({"cluster": res.cluster, "scripts": {str(k): v for k, v in res.scripts.items()}})
        else:
            for node, scripts in res.scripts.items():
                for name, text in scripts.items():
                    out.console().print(f"# ---- node {node}: {name} ----", markup=False)
                    print(text, end="")
        return
    if not wait:
        if json_:
            out.emit_json(res.to_dict())
        else:
            print(res.job_id)
            out.err(f"follow it: gtrain logs {res.cluster} -f")
        return
    final = api.wait(res.cluster, job_id=res.job_id, on_line=None if json_ else out.LinePrinter(), report=rep)
    if json_:
        out.emit_json({**res.to_dict(), "status": final.status, "exit_code": final.exit_code})
    else:
        out.err(f"job {final.id} {final.status} (exit {final.exit_code})")
    _exit(final.exit_code)


def logs(
    cluster: str = typer.Argument(..., help="Cluster name."),
    job: str = typer.Option(None, "--job", help="Job id (default: the newest job)."),
    follow: bool = typer.Option(False, "--follow", "-f",
                                help="Keep following; end when the job ends, with its exit code."),
    node: int = typer.Option(None, "--node", help="Only this node."),
    rank: int = typer.Option(None, "--rank", help="Only this global rank."),
    tail: int = typer.Option(None, "--tail", help="Start with the last N lines of each log."),
) -> None:
    """Every node's and rank's output, each line prefixed [node K rank R]."""
    import gtrain.api as api

    final = api.logs(cluster, job_id=job, follow=follow, tail=tail, node=node, rank=rank,
                     on_line=out.LinePrinter(), report=out.CLIReporter())
    if follow:
        out.err(f"job {final.id} {final.status} (exit {final.exit_code})")
        _exit(final.exit_code)


def pull(
    cluster: str = typer.Argument(..., help="Cluster name."),
    job: str = typer.Option(None, "--job", help="Job id (default: the newest job)."),
    to: str = typer.Option(None, "--to", help="Destination folder (default: ./<cluster>-<checkpoint_dir>)."),
    node: int = typer.Option(None, "--node", help="Only this node (default: every node's files, merged)."),
    json_: bool = JSON,
) -> None:
    """Bring checkpoint_dir back, every file verified by sha256; re-runs move only what changed."""
    out.set_json(json_)
    import gtrain.api as api

    res = api.pull(cluster, job_id=job, to=to, node=node, report=out.CLIReporter())
    if json_:
        out.emit_json(res.to_dict())
        return
    out.console().print(
        f"pulled {len(res.transferred)} file(s) ({res.bytes:,} bytes), {len(res.skipped)} unchanged, "
        f"{len(res.resumed)} resumed, all sha256-verified -> {res.dest}")


def run(
    spec: str = typer.Argument(..., help="Path to the YAML spec."),
    name: str = typer.Option(None, "--name", help="Cluster name (overrides name: in the spec)."),
    keep: bool = typer.Option(False, "--keep", help="Leave the cluster up afterwards."),
    to: str = typer.Option(None, "--to", help="Where to pull checkpoints (default: ./<cluster>-<checkpoint_dir>)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Don't ask before creating paid resources."),
    json_: bool = JSON,
) -> None:
    """up + launch --wait + pull + down, in one command; exits with the job's own exit code."""
    out.set_json(json_)
    import gtrain.api as api
    from gtrain.cli.cluster_cmds import _confirm
    from gtrain.spec import load_spec

    parsed = load_spec(spec, name=name)
    rep = out.CLIReporter()
    if parsed.provider not in ("local", "ssh"):
        plan = api.up(parsed, dry_run=True, report=rep).plan
        _confirm(f"Create {plan.num_nodes} {plan.instance_type} node(s) at "
                 f"{out.fmt_usd(plan.cluster_price_per_hour)}/h?", yes)
    res = api.run(parsed, keep=keep, to=to, on_line=None if json_ else out.LinePrinter(), report=rep)
    if json_:
        out.emit_json(res.to_dict())
    else:
        if res.pulled:
            out.console().print(f"checkpoints: {len(res.pulled.transferred)} file(s) pulled and verified -> "
                                f"{res.pulled.dest}")
        out.err(f"job {res.job_id} {res.status} (exit {res.exit_code})")
        if res.down:
            out.cost_table(res.down.cost)
        elif keep:
            out.console().print(f"cluster {res.cluster} kept up (--keep): `gtrain down {res.cluster}` when done")
    _exit(res.exit_code)
