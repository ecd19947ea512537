"""gtrain ssh / exec: a shell on a node, a command on every node."""

from __future__ import annotations

import typer

from gtrain.cli import output as out


def register(app: typer.Typer) -> None:
    app.command("ssh")(ssh)
    app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(exec_)
    app.command("ssh-forget")(ssh_forget)


def ssh_forget(
    host: str = typer.Argument(..., help="Host name or address whose pinned key gtrain should forget."),
    port: int = typer.Option(22, "--port", help="SSH port."),
) -> None:
    """Forget a host's pinned SSH key (after the host was rebuilt); the next `gtrain up` pins the new one."""
    from gtrain.remote.ssh import forget_host

    n = forget_host(host, port)
    out.console().print(f"forgot {n} pinned key(s) for {host}:{port}" if n else f"no pinned key for {host}:{port}")


def ssh(
    cluster: str = typer.Argument(..., help="Cluster name."),
    node: int = typer.Option(0, "--node", help="Node index."),
) -> None:
    """Open an interactive shell on a node (ssh with gtrain's pinned host keys)."""
    import os

    import gtrain.api as api

    argv, cwd = api.shell_argv(cluster, node=node)
    if cwd:
        os.chdir(cwd)
    os.execvp(argv[0], argv)


def exec_(
    ctx: typer.Context,
    cluster: str = typer.Argument(..., help="Cluster name."),
    node: int = typer.Option(None, "--node", help="Only this node."),
    json_: bool = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else."),
) -> None:
    """Run a command on every node (or one): gtrain exec CLUSTER -- CMD ...; exit code = the worst node's."""
    import shlex

    import gtrain.api as api
    from gtrain.errors import ConfigError

    out.set_json(json_)
    args = list(ctx.args)
    if not args:
        raise ConfigError("no command given", hint="gtrain exec CLUSTER -- nvidia-smi", field="CMD")
    command = args[0] if len(args) == 1 else " ".join(shlex.quote(a) for a in args)
    lines: list[dict[str, object]] = []
    on_line = (lambda ln: lines.append({"node": ln.node, "text": ln.text})) if json_ else out.LinePrinter()
    codes = api.exec_command(cluster, command, node=node, on_line=on_line, report=out.CLIReporter())
    worst = max(codes.values(), key=lambda c: (c != 0, c)) if codes else 0
    if json_:
        out.emit_json({"cluster": cluster, "exit_codes": {str(k): v for k, v in codes.items()}, "lines": lines})
    raise typer.Exit(worst if 0 <= worst <= 255 else 1)
