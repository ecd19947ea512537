"""Typer parameters shared by the command modules, with plain metavars (CLUSTER, SPEC, TEXT, N)."""

from __future__ import annotations

from typing import Any

import typer

JSON: Any = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else.")
YES_PAID: Any = typer.Option(False, "--yes", "-y", help="Don't ask before creating paid resources.")
CLUSTER: Any = typer.Argument(..., metavar="CLUSTER", help="Cluster name.", show_default=False)
SPEC: Any = typer.Argument(..., metavar="SPEC", help="Path to the YAML spec.", show_default=False)
NAME: Any = typer.Option(None, "--name", metavar="NAME", help="Cluster name (overrides name: in the spec).")
JOB: Any = typer.Option(None, "--job", metavar="ID", help="Job id (default: the newest job).")
BREAK_LOCK: Any = typer.Option(False, "--break-lock", help="Shared state (GTRAIN_STATE): take the cluster's "
                               "lease even from a live holder (only when that machine is gone).")


def break_lock(on: bool) -> None:
    """`--break-lock`: the next cluster lease this process takes ignores its holder's expiry."""
    if on:
        import gtrain.locks as locks

        locks.BREAK_LOCK = True


def non_negative(flag: str, value: int | None, least: int = 0) -> None:
    """A count or index flag below ``least``: exit 2 naming the flag."""
    from gtrain.errors import ConfigError

    if value is not None and value < least:
        what = "a positive number" if least == 1 else "0 or more"
        raise ConfigError(f"{flag} {value}: must be {what}", field=flag, hint=f"give {flag} {max(least, 0)} or more")


def confirm(msg: str, yes: bool, default: bool = False) -> None:
    """Ask ``msg`` on the terminal (default: no) unless ``yes``; no terminal and no --yes: exit 2."""
    import sys

    from gtrain.errors import ConfigError

    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfigError(f"{msg} needs confirmation and there is no terminal to ask", field="--yes",
                          hint="pass --yes to confirm non-interactively")
    if not typer.confirm(msg, default=default, err=True):
        raise typer.Exit(1)


def confirm_price(spec: Any, yes: bool, report: Any) -> None:
    """For a provider that rents by the hour (``confirms_cost``): show the price and ask before making nodes."""
    import gtrain.api as api
    from gtrain.cli import output as out
    from gtrain.providers import provider_class

    if not provider_class(spec.provider).confirms_cost:
        return
    plan = api.up(spec, dry_run=True, report=report).plan
    confirm(f"Create {plan.num_nodes} {plan.instance_type} node(s) at {out.fmt_usd(plan.cluster_price_per_hour)}/h?",
            yes)


#: folders of the kernel's own: nothing gtrain writes belongs there
SYSTEM_DIRS = ("/proc", "/sys", "/dev")


def check_dest(flag: str, value: str | None) -> None:
    """A destination folder flag (``--to DIR``) that cannot work: exit 2 naming the flag, before any work."""
    import os

    from gtrain.errors import ConfigError

    if value is None:
        return
    hint = "name a folder you can write (it is created if missing)"
    if not value.strip() or "\x00" in value:
        raise ConfigError(f"{flag} {value!r}: {'holds a NUL byte' if value.strip() else 'is empty'}", field=flag,
                          hint=hint)
    path = os.path.abspath(os.path.expanduser(value))
    for d in SYSTEM_DIRS:
        if path == d or path.startswith(d + "/"):
            raise ConfigError(f"{flag} {value!r}: is under {d}, a system folder", field=flag, hint=hint)
    up = path
    while not os.path.lexists(up):
        up = os.path.dirname(up)
    if up != path and not os.path.isdir(up):
        raise ConfigError(f"{flag} {value!r}: {up!r} is a file, not a folder", field=flag, hint=hint)
