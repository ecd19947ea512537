"""gtrain ssh / exec: a shell (or a command) on a node, a command on every node."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.params import CLUSTER, JSON, non_negative

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


def register(app: typer.Typer) -> None:
    app.command("ssh", context_settings=_EXTRA)(ssh)
    app.command("exec", context_settings=_EXTRA)(exec_)
    app.command("ssh-forget")(ssh_forget)


def ssh_forget(
    host: str = typer.Argument(..., metavar="HOST", help="Host name or address whose pinned key gtrain should forget.",
                               show_default=False),
    port: int = typer.Option(22, "--port", metavar="PORT", help="SSH port."),
) -> None:
    """Forget a host's pinned SSH key (after the host was rebuilt); the next `gtrain up` pins the new one."""
    from gtrain.errors import ConfigError

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: a TCP port is 1..65535", field="--port", hint="e.g. --port 22")
    from gtrain.remote.ssh import forget_host

    n = forget_host(host, port)
    out.say(f"forgot {n} pinned key(s) for {host}:{port}" if n else f"no pinned key for {host}:{port}")


def split_extra(extra: list[str], raw_argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``gtrain ssh``'s extra arguments -> (ssh arguments, the command after ``--`` or None). click drops the
    ``--`` itself, so where it was is read from the raw argv (what follows it ends ``extra``)."""
    if "--" not in raw_argv:
        return list(extra), None
    cmd = raw_argv[raw_argv.index("--") + 1:]
    if cmd and extra[len(extra) - len(cmd):] != cmd:
        return list(extra), None
    return list(extra[:len(extra) - len(cmd)]), cmd


def shell_command(argv: list[str], ssh_args: list[str], cmd: list[str] | None) -> list[str]:
    """The argv to exec: ``argv`` from ``api.shell_argv`` with the user's extra ssh arguments (before the host
    name, as ssh wants its options) and the command (after it, as ``ssh host CMD``); for a node that is not
    reached over SSH (a local node: a login shell) the command runs in that shell."""
    from gtrain.errors import ConfigError

    if argv[0] == "ssh":
        if cmd is None:
            return [*argv, *ssh_args]  # ssh reads options after the host too, then the command
        return [*argv[:-1], *ssh_args, argv[-1], *cmd]
    if cmd is None:
        if any(a.startswith("-") for a in ssh_args):
            raise ConfigError(f"{ssh_args[0]}: ssh options need a node reached over SSH; this one is a local "
                              "directory", field="SSH-ARGS", hint="run a command instead: gtrain ssh CLUSTER -- CMD")
        cmd = ssh_args
    elif ssh_args:
        raise ConfigError(f"{ssh_args[0]}: ssh options need a node reached over SSH; this one is a local directory",
                          field="SSH-ARGS", hint="drop them: gtrain ssh CLUSTER -- CMD")
    if not cmd:
        return argv
    return [*argv, "-c", " ".join(cmd)]  # joined with spaces, as ssh joins a remote command


def ssh(
    ctx: typer.Context,
    cluster: str = CLUSTER,
    node: int = typer.Option(0, "--node", metavar="K", help="Node index."),
) -> None:
    """Open a shell on a node, or run CMD there: gtrain ssh CLUSTER [SSH-ARGS]... [-- CMD...].

    SSH-ARGS go to ssh as they are (e.g. -L 6006:localhost:6006 for TensorBoard); ssh uses gtrain's pinned
    host keys. The exit code is the shell's (or CMD's)."""
    import os
    import sys

    import gtrain.api as api

    non_negative("--node", node)
    ssh_args, cmd = split_extra(list(ctx.args), sys.argv)
    argv, cwd = api.shell_argv(cluster, node=node)
    full = shell_command(argv, ssh_args, cmd)
    if cwd:
        os.chdir(cwd)
    sys.stdout.flush()
    os.execvp(full[0], full)


def exec_(
    ctx: typer.Context,
    cluster: str = CLUSTER,
    node: int = typer.Option(None, "--node", metavar="K", help="Only this node."),
    json_: bool = JSON,
) -> None:
    """Run a command on every node (or one): gtrain exec CLUSTER -- CMD ...; exit code = the worst node's."""
    import shlex

    import gtrain.api as api
    from gtrain.errors import ConfigError

    out.set_json(json_)
    non_negative("--node", node)
    args = list(ctx.args)
    if not args:
        raise ConfigError("no command given", hint="gtrain exec CLUSTER -- nvidia-smi", field="CMD")
    command = args[0] if len(args) == 1 else " ".join(shlex.quote(a) for a in args)
    lines: list[dict[str, object]] = []
    on_line = (lambda ln: lines.append({"node": ln.node, "text": ln.text})) if json_ else out.LinePrinter(follow=False)
    codes = api.exec_command(cluster, command, node=node, on_line=on_line, report=out.CLIReporter())
    worst = max(codes.values(), key=lambda c: (c != 0, c)) if codes else 0
    if json_:
        out.emit_json({"cluster": cluster, "exit_codes": {str(k): v for k, v in codes.items()}, "lines": lines})
    raise typer.Exit(worst if 0 <= worst <= 255 else 1)
