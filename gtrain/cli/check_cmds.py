"""gtrain check: which providers this machine can use now, and why not -- each provider's own read-only check
(``registry.CHECKS``), all at once, each bounded by ``--timeout``."""

from __future__ import annotations

import time

import typer

from gtrain.cli import output as out
from gtrain.cli.params import JSON


def register(app: typer.Typer) -> None:
    app.command("check")(check)


def check(
    providers: list[str] = typer.Argument(None, metavar="[PROVIDER]...", help="Providers to check (default: all)."),
    timeout: float = typer.Option(10.0, "--timeout", min=0.5, max=120.0,
                                  help="Seconds each provider may take; one that has not answered is ✘."),
    json_: bool = JSON,
) -> None:
    """Which providers this machine can use now and why not: credentials, one read-only call, GPU quota, SSH key."""
    out.set_json(json_)
    from gtrain.errors import ConfigError
    from gtrain.providers import check_providers, provider_names

    known = provider_names()
    names = list(dict.fromkeys(providers or known))
    for n in names:
        if n not in known:
            raise ConfigError(f"no provider {n!r}", hint=f"known: {', '.join(known)}", field="PROVIDER")
    t0 = time.monotonic()
    results = check_providers(names, timeout)
    took = round(time.monotonic() - t0, 2)
    usable = [r.provider for r in results if r.ok]
    if json_:
        out.emit_json({"providers": [r.to_dict() for r in results], "usable": usable, "seconds": took})
    else:
        width = max(len(n) for n in names)
        for r in results:
            out.say(f"{'✔' if r.ok else '✘'} {r.provider.ljust(width)}  {r.reason}")
            pad = " " * (width + 4)
            if not r.ok and r.fix:
                out.say(f"{pad}fix: {r.fix}")
            for label, value in (("credentials", r.credentials), ("call", r.call), ("GPU quota", r.quota),
                                 ("ssh key", r.ssh_key)):
                if value and (r.ok or label != "ssh key"):
                    out.say(f"{pad}{label}: {value}")
        out.say(f"{len(usable)} of {len(results)} usable ({took:g} s)")
    if not usable:
        raise typer.Exit(1)
