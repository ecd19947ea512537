"""gtrain launch / logs / pull / run."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.overrides import ENV, GPUS, NUM_NODES, SPOT, Overrides
from gtrain.cli.params import (
    BREAK_LOCK,
    CLUSTER,
    JOB,
    JSON,
    NAME,
    SPEC,
    YES_PAID,
    break_lock,
    check_dest,
    confirm_price,
    non_negative,
)

REPLACE_BAD = typer.Option(False, "--replace-bad", help="Preflight (policies.preflight, else quick): replace a "
                           "failed cloud node by a new one and check again, once.")
NO_FOLD = typer.Option(False, "--no-fold", help="Show every rank's every line; by default identical lines of "
                       "many ranks arriving together are one line, the ranks named ([ranks 0-63] ...; errors never "
                       "folded).")
FRESH = typer.Option(False, "--fresh", help="Start the run over: checkpoints of earlier launches in "
                     "job.checkpoint_store are kept but not restored (default: resume from the newest).")


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
    app.command("logs")(logs)
    app.command("pull")(pull)
    app.command("run")(run)
    app.command("cancel")(cancel)


def _exit(code: int | None) -> None:
    raise typer.Exit(1 if code is None else (code if 0 <= code <= 255 else 1))


def launch(
    spec: str = typer.Argument(None, metavar="[SPEC]", help="Path to the YAML spec (its job section is launched)."),
    cluster: str = typer.Option(None, "--cluster", "-c", metavar="CLUSTER", help="Launch on this existing cluster."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Follow the logs; exit with the job's own exit code."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the rendered launch script; start nothing."),
    force: bool = typer.Option(False, "--force", help="Cancel a job still running on the cluster first."),
    queue: bool = typer.Option(False, "--queue", help="Wait in the cluster's queue (kept on its nodes) for the job "
                               "before it to end, instead of failing (job.queue); see docs/queue.md."),
    priority: int = typer.Option(None, "--priority", min=-1000, max=1000, help="A queued job's place: higher "
                                 "starts first, then the earliest queued (default: job.priority, 0)."),
    replace_bad: bool = REPLACE_BAD,
    fresh: bool = FRESH,
    no_fold: bool = NO_FOLD,
    json_: bool = JSON,
    name: str = NAME,
    env: list[str] = ENV,
    num_nodes: int = NUM_NODES,
    gpus: str = GPUS,
    spot: bool = SPOT,
    break_lock_: bool = BREAK_LOCK,
) -> None:
    """Sync the workdir, run setup, start job.launcher (default torchrun) on every node, detached; print the job id."""
    out.set_json(json_)
    break_lock(break_lock_)
    import gtrain.api as api

    ov = Overrides(env or [], num_nodes, gpus, spot, name)
    parsed = None
    if ov.flags():
        from gtrain.errors import ConfigError

        if spec is None:
            raise ConfigError(f"{ov.note()}: these set fields of a SPEC and none is given", field="SPEC",
                              hint="gtrain launch SPEC [--cluster NAME] with the flags")
        parsed = ov.load(spec)
        out.err(f"note: {ov.note()}")
    rep = out.CLIReporter()
    from gtrain.errors import ClusterNotFound

    try:
        res = api.launch(parsed or spec, cluster=cluster, force=force, dry_run=dry_run, replace_bad=replace_bad,
                         fresh=fresh, queue=queue, priority=priority, report=rep)
    except ClusterNotFound:
        if not (dry_run and spec is not None and cluster is None):
            raise
        return _preview(parsed or spec, json_)  # no cluster yet: what up + launch would do, and its price
    if dry_run:
        if json_:
            out.emit_json({"cluster": res.cluster, "scripts": {str(k): v for k, v in res.scripts.items()}})
        else:
            _print_scripts(res.scripts)
        return
    if not wait:
        if json_:
            out.emit_json(res.to_dict())
        else:
            print(res.job_id)
            out.err(f"follow it: gtrain logs {res.cluster} -f")
        return
    printer = None if json_ else out.LinePrinter(fold=not no_fold)
    try:
        final = api.wait(res.cluster, job_id=res.job_id, on_line=printer, report=rep)
    finally:
        if printer is not None:
            printer.close()
    if json_:
        out.emit_json({**res.to_dict(), "status": final.status, "exit_code": final.exit_code})
    else:
        out.err(f"job {final.id} {final.status} (exit {final.exit_code})")
    _exit(final.exit_code)


def _failed_first(first: dict | None, printer: out.LinePrinter) -> None:  # type: ignore[type-arg]
    """The end of a failed run: the rank that failed first, its exit code and its last lines."""
    if not first:
        return
    node, rank, code = first.get("node"), first.get("rank"), first.get("exit_code")
    who = f"node {node}" if rank is None else f"rank {rank} (node {node})"
    lines = printer.screen.last_lines(int(node or 0), rank)
    out.err(f"{who} failed first, exit {code}" + (f"; its last {len(lines)} line(s):" if lines else ""))
    for text in lines:
        out.err(f"  {text}")


def _print_scripts(scripts: dict[int, dict[str, str]]) -> None:
    """Each node's exact command first, then its files: secrets masked, a control character shown as ``^X``
    (an escape sequence in a job's ``run`` line reaches the screen as text, never the terminal)."""
    from gtrain.redact import scrub
    from gtrain.termsafe import visible

    for node, files in scripts.items():
        if "command" in files:
            out.say(f"# ---- node {node}: command ----")
            print(visible(scrub(files["command"])), end="")
    for node, files in scripts.items():
        for name, text in files.items():
            if name != "command":
                out.say(f"# ---- node {node}: {visible(name)} ----")
                print(visible(scrub(text)), end="" if text.endswith("\n") else "\n")


def _preview(spec: object, json_: bool) -> None:
    import gtrain.api as api
    from gtrain.cli.cluster_cmds import print_plan

    res = api.preview(spec, report=out.CLIReporter())
    if json_:
        out.emit_json(res.to_dict())
        return
    print_plan(res.plan)
    out.say(f"note: no cluster {res.cluster} yet: nothing was created; the scripts below name what only its nodes "
            "know as <node K address>, <root> (gtrain's folder on the node), <job-id>")
    _print_scripts(res.scripts)


def logs(
    cluster: str = CLUSTER,
    job: str = JOB,
    follow: bool = typer.Option(False, "--follow", "-f",
                                help="Keep following; end when the job ends, with its exit code."),
    node: int = typer.Option(None, "--node", metavar="K", help="Only this node."),
    rank: int = typer.Option(None, "--rank", metavar="R", help="Only this global rank."),
    tail: int = typer.Option(None, "--tail", metavar="N", help="Start with the last N lines of each log."),
    json_: bool = typer.Option(False, "--json", help="JSON lines on stdout: one object per log line "
                               "(node, rank, text); with --follow a last one with the job's status and exit code."),
    no_fold: bool = NO_FOLD,
) -> None:
    """Every node's and rank's output, each line prefixed [node K rank R]."""
    out.set_json(json_)
    import gtrain.api as api

    non_negative("--node", node)
    non_negative("--rank", rank)
    non_negative("--tail", tail)

    # folded: while following every node (a window needs lines arriving together); --node/--rank show all
    fold = follow and node is None and rank is None and not no_fold
    printer = None if json_ else out.LinePrinter(follow=follow, fold=fold)
    try:
        final = api.logs(cluster, job_id=job, follow=follow, tail=tail, node=node, rank=rank,
                         on_line=printer or _json_line, report=out.CLIReporter())
    finally:
        if printer is not None:
            printer.close()
    if follow:
        if json_:
            _json_line({"job": final.id, "status": final.status, "exit_code": final.exit_code})
        else:
            out.err(f"job {final.id} {final.status} (exit {final.exit_code})")
        _exit(final.exit_code)


def _json_line(line: object) -> None:
    """One JSON object on one line of stdout: a log line ({node, rank, text}) or a dict as it is."""
    import json
    import sys

    doc = line if isinstance(line, dict) else {"node": line.node, "rank": line.rank,  # type: ignore[attr-defined]
                                               "text": line.text}  # type: ignore[attr-defined]
    sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def pull(
    cluster: str = CLUSTER,
    job: str = JOB,
    to: str = typer.Option(None, "--to", metavar="DIR",
                           help="Destination folder (default: ./<cluster>-<checkpoint_dir>)."),
    node: int = typer.Option(None, "--node", metavar="K", help="Only this node (default: every node's files, merged)."),
    json_: bool = JSON,
) -> None:
    """Bring checkpoint_dir back, every file verified by sha256; re-runs move only what changed."""
    out.set_json(json_)
    import gtrain.api as api

    non_negative("--node", node)
    check_dest("--to", to)
    res = api.pull(cluster, job_id=job, to=to, node=node, report=out.CLIReporter())
    if json_:
        out.emit_json(res.to_dict())
        return
    out.say(
        f"pulled {len(res.transferred)} file(s) ({res.bytes:,} bytes), {len(res.skipped)} unchanged, "
        f"{len(res.resumed)} resumed, all sha256-verified -> {res.dest}")


def run(
    spec: str = SPEC,
    name: str = NAME,
    keep: bool = typer.Option(False, "--keep", help="Leave the cluster up afterwards."),
    no_report: bool = typer.Option(False, "--no-report", help="Don't write the run's HTML report "
                                   "(default: <cluster>-report.html next to the pulled checkpoints)."),
    to: str = typer.Option(None, "--to", metavar="DIR",
                           help="Where to pull checkpoints (default: ./<cluster>-<checkpoint_dir>)."),
    yes: bool = YES_PAID,
    replace_bad: bool = REPLACE_BAD,
    fresh: bool = FRESH,
    no_fold: bool = NO_FOLD,
    json_: bool = JSON,
    env: list[str] = ENV,
    num_nodes: int = NUM_NODES,
    gpus: str = GPUS,
    spot: bool = SPOT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, its price and every node's rendered "
                                 "scripts; create nothing."),
) -> None:
    """up + launch --wait + pull + down, in one command; exits with the job's own exit code."""
    out.set_json(json_)
    import gtrain.api as api

    check_dest("--to", to)  # as `pull --to` checks it, and before anything is made
    ov = Overrides(env or [], num_nodes, gpus, spot, name)
    parsed = ov.load(spec)
    if ov.note():
        out.err(f"note: {ov.note()}")
    if dry_run:
        try:
            return _preview(parsed, json_)
        except Exception as e:
            if ov.blame(e) is e:
                raise
            raise ov.blame(e) from None
    rep = out.CLIReporter()
    try:
        confirm_price(parsed, yes, rep)
    except Exception as e:
        if ov.blame(e) is e:
            raise
        raise ov.blame(e) from None
    printer = None if json_ else out.LinePrinter(fold=not no_fold)
    try:
        res = api.run(parsed, keep=keep, to=to, on_line=printer, report=rep,
                      html_report=not no_report, replace_bad=replace_bad, fresh=fresh)
    except KeyboardInterrupt as e:  # torn down already (api.run): say what it cost, then exit 128+N
        if printer is not None:
            printer.close()
        done = getattr(e, "run_result", None)
        if done is not None and done.down is not None:
            if json_:
                out.emit_json(done.to_dict())
            else:
                out.cost_table(done.down.cost)
        raise
    if json_:
        out.emit_json(res.to_dict())
    else:
        if res.pulled and res.pulled.dest:
            out.say(f"checkpoints: {len(res.pulled.transferred)} file(s) pulled and verified -> "
                                f"{res.pulled.dest}")
        from gtrain.runs.recovery import summary_line

        for r in res.recoveries:
            out.err(summary_line(r))
        if res.recovery_stopped:
            out.err(f"not recovered: {res.recovery_stopped}")
        if printer is not None:
            printer.close()
            _failed_first(res.failed_first, printer)
        out.err(f"job {res.job_id} {res.status} (exit {res.exit_code})"
                + (f" after {len(res.recoveries)} recovery(ies)" if res.recoveries else ""))
        if res.down:
            out.cost_table(res.down.cost)
        elif keep:
            out.say(f"cluster {res.cluster} kept up (--keep): `gtrain down {res.cluster}` when done")
        if res.report:
            out.say(f"report: {res.report}")
    _exit(res.exit_code)


def cancel(
    cluster: str = CLUSTER,
    job: str = typer.Option(None, "--job", metavar="ID", help="Job id (default: the running job)."),
    json_: bool = JSON,
) -> None:
    """Stop the cluster's running job (or --job ID); the nodes and their files stay."""
    out.set_json(json_)
    import gtrain.api as api

    res = api.cancel(cluster, job_id=job, report=out.CLIReporter())
    doc = res.to_dict()
    if json_:
        out.emit_json(doc)
        return
    code = doc.get("exit_code")
    out.say(f"job {doc['job_id']} {doc['status']}" + ("" if code is None else f" (exit {code})"))
