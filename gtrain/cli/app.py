"""The CLI's entry point. This is the one place that turns exceptions into messages and exit codes:
0 ok, 2 bad input, 1 other failure, the job's own exit code for `launch --wait`, `logs -f` and `run`.
A traceback is shown only with GTRAIN_DEBUG=1.

Start-up is kept cheap: `gtrain`, `--help`, `--version`, `status` and `sync` skip typer altogether
(``gtrain/cli/fast.py``); everything else gets a Typer group that imports a command's module only when that
command runs (``gtrain/cli/commands.py`` holds the names and help lines)."""

from __future__ import annotations

import contextlib
import os
import sys

from gtrain.cli.commands import COMMANDS, MODULES, PROG, ROOT_HELP
from gtrain.cli.output import emit_json, err, json_mode
from gtrain.errors import GtrainError

TYPE_CHECKING = False  # typing itself costs ~5 ms of start-up

if TYPE_CHECKING:
    from typing import Any

#: a missing module (its top-level name) -> the extra that installs it
EXTRAS: dict[str, str] = {
    "paramiko": "ssh", "cryptography": "ssh", "bcrypt": "ssh", "nacl": "ssh",
    "boto3": "aws", "botocore": "aws", "s3transfer": "aws",
    "google": "gcp", "grpc": "gcp", "proto": "gcp",
    "torch": "train", "numpy": "train", "lightkube": "kubernetes",
}

_TYPE_NAMES = {"str": "TEXT", "text": "TEXT", "int": "INTEGER", "integer": "INTEGER", "float": "FLOAT"}


def interrupted(code: int) -> str:
    """What an interrupted command says, whichever path ran it (Typer's or the fast one)."""
    return "Interrupted." if code == 130 else f"Interrupted (signal {code - 128})."


def build_app() -> Any:
    """The Typer app (imports typer; the command modules load on first use)."""
    import importlib

    import typer
    from typer.core import TyperArgument, TyperCommand, TyperGroup
    from typer.main import get_command_from_info

    from gtrain.cli.fast import _short

    class PlainUsage(TyperCommand):
        """Usage lines with the arguments' plain metavars (``CLUSTER``, not Typer's ``{CLUSTER}``)."""

        def collect_usage_pieces(self, ctx: Any) -> list[str]:
            rv = [self.options_metavar] if self.options_metavar else []
            for p in self.get_params(ctx):
                rv += [p.make_metavar(ctx)] if isinstance(p, TyperArgument) and p.metavar else p.get_usage_pieces(ctx)
            return rv

    def plain_metavars(cmd: Any) -> None:
        """A parameter without a metavar of its own shows click's type name (TEXT, INTEGER), or for an
        argument its name in capitals, instead of Typer's ``<str>`` / ``{name}``."""
        for p in cmd.params:
            if p.metavar is None and isinstance(p, TyperArgument):
                p.metavar = (p.name or "").upper()
            elif p.metavar is None and not getattr(p, "is_flag", False) and getattr(p, "type", None) is not None:
                p.metavar = _TYPE_NAMES.get(p.type.name, p.type.name.upper())

    class LazyGroup(TyperGroup):
        def list_commands(self, ctx: Any) -> list[str]:
            return [name for name, _, _ in COMMANDS]

        def get_command(self, ctx: Any, cmd_name: str) -> Any:
            if cmd_name not in self.commands and cmd_name in MODULES:
                sub = typer.Typer()
                importlib.import_module(f"gtrain.cli.{MODULES[cmd_name]}").register(sub)
                for info in sub.registered_commands:
                    if info.cls in (None, TyperCommand):
                        info.cls = PlainUsage
                    cmd = get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode=None)
                    plain_metavars(cmd)
                    self.commands.setdefault(cmd.name or "", cmd)
            return self.commands.get(cmd_name)

        def invoke(self, ctx: Any) -> Any:
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt as e:  # Typer would make every signal exit 130: keep 128 + its number
                from gtrain.signals import exit_code_of

                code = exit_code_of(e)
                with contextlib.suppress(OSError, ValueError):
                    err(interrupted(code))
                raise SystemExit(code) from None
            except BrokenPipeError:  # stdout closed under us (`gtrain down | head -1`): the work is done
                with contextlib.suppress(OSError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(0) from None

        def format_commands(self, ctx: Any, formatter: Any) -> None:
            limit = formatter.width - 6 - max(len(name) for name, _, _ in COMMANDS)
            with formatter.section("Commands"):
                formatter.write_dl([(name, _short(text, limit)) for name, _, text in COMMANDS])

    app = typer.Typer(name=PROG, help=ROOT_HELP, cls=LazyGroup, no_args_is_help=True, add_completion=True,
                      pretty_exceptions_enable=False, rich_markup_mode=None,
                      context_settings={"help_option_names": ["-h", "--help"]})

    def _version(value: bool) -> None:
        if value:
            from gtrain import __version__

            print(f"{PROG} {__version__}")
            raise typer.Exit()

    @app.callback()
    def _root(
        version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
    ) -> None:
        """gtrain: up, launch, logs, pull, down — multi-node training (torchrun, accelerate, deepspeed, ...)."""

    return app


def missing_extra(e: BaseException) -> tuple[str, str] | None:
    """(module, extra) when ``e`` (or what caused it) is an optional dependency that is not installed.

    The chain of causes may loop (an exception can be its own context): each link is visited once. A missing
    module that belongs to no extra but was imported by one's package (google-auth needing ``packaging``) is
    that extra's missing piece.
    """
    seen: BaseException | None = e
    visited: set[int] = set()
    missing: str | None = None
    owners: list[str] = []
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            top = seen.name.split(".")[0]
            if top in EXTRAS:
                return seen.name, EXTRAS[top]
            if top != "gtrain" and missing is None:
                missing = seen.name
        tb = seen.__traceback__
        while tb is not None:
            mod = str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0]
            if mod in EXTRAS and EXTRAS[mod] not in owners:
                owners.append(EXTRAS[mod])
            tb = tb.tb_next
        seen = seen.__cause__ or seen.__context__
    if missing is not None and owners:
        return missing, owners[0]
    return None


def _exit_with(doc: dict[str, object], message: str, hint: str | None, code: int) -> None:
    if json_mode():
        emit_json(doc)
    err(f"Error: {message}")
    if hint:
        err(f"Hint: {hint}")
    sys.exit(code)


def main() -> None:
    debug = os.environ.get("GTRAIN_DEBUG") == "1"
    argv = sys.argv[1:]
    try:
        if not (argv[:1] == ["status"] or argv[:1] in (["--help"], ["-h"], ["--version"]) or not argv):
            from gtrain import signals

            signals.install()  # SIGTERM / SIGHUP end a command as Ctrl+C does: teardown, rollback, exit 128+N
        from gtrain.cli.fast import handle

        code = handle(argv)
        if code is not None:
            sys.exit(code)
        build_app()(args=argv, prog_name=PROG)
    except GtrainError as e:
        if debug:
            import traceback

            traceback.print_exc()
        _exit_with(e.to_dict(), e.message, e.hint, e.exit_code)
    except KeyboardInterrupt as e:
        from gtrain.signals import exit_code_of

        code = exit_code_of(e)
        with contextlib.suppress(OSError, ValueError):
            err(interrupted(code))
        sys.exit(code)
    except BrokenPipeError:  # stdout closed under us (`gtrain ... | head -1`): what had to happen has happened
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if debug:
            raise
        extra = missing_extra(e)
        if extra is None:
            err(f"Error: {type(e).__name__}: {e}")
            err("Hint: this is a bug in gtrain; run again with GTRAIN_DEBUG=1 for the traceback and report it")
            sys.exit(1)
        mod, name = extra
        from gtrain.errors import install_hint

        msg, hint = f"this needs the `{name}` extra ({mod} is not installed)", install_hint(name)
        _exit_with({"error": "MissingExtra", "message": msg, "hint": hint, "extra": name, "module": mod}, msg, hint, 2)
