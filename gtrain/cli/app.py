"""The Typer app. This is the one place that turns exceptions into messages and exit codes:
0 ok, 2 bad input, 1 other failure, the job's own exit code for `launch --wait`, `logs -f` and `run`.
A traceback is shown only with GTRAIN_DEBUG=1."""

from __future__ import annotations

import os
import sys

import typer

from gtrain import __version__
from gtrain.cli import cluster_cmds, cost_cmds, data_cmds, gc_cmds, job_cmds, node_cmds
from gtrain.cli.output import emit_json, err, json_mode
from gtrain.errors import GtrainError

app = typer.Typer(
    name="gtrain",
    help="Run PyTorch training on GPU machines gtrain rents, and leave nothing running that nobody watches.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"gtrain {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """gtrain: up, launch, logs, pull, down — multi-node torchrun on rented GPUs."""


cluster_cmds.register(app)
job_cmds.register(app)
cost_cmds.register(app)
gc_cmds.register(app)
node_cmds.register(app)
data_cmds.register(app)


def main() -> None:
    debug = os.environ.get("GTRAIN_DEBUG") == "1"
    try:
        app()
    except GtrainError as e:
        if debug:
            import traceback

            traceback.print_exc()
        if json_mode():
            emit_json(e.to_dict())
        err(f"Error: {e.message}")
        if e.hint:
            err(f"Hint: {e.hint}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err("Interrupted.")
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if debug:
            raise
        err(f"Error: {type(e).__name__}: {e}")
        err("Hint: this is a bug in gtrain; run again with GTRAIN_DEBUG=1 for the traceback and report it")
        sys.exit(1)
