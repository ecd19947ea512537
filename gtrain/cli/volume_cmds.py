"""gtrain volume: the volumes that outlive clusters (docs/volumes.md), found by tag; ``up`` makes and attaches them,
``down`` leaves them, this deletes them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import typer

from gtrain.cli import output as out
from gtrain.cli.params import JSON, confirm

ACTIONS = ("ls", "create", "delete")


def register(app: typer.Typer) -> None:
    app.command("volume")(volume)


def volume(
    action: str = typer.Argument(..., metavar="ACTION", help="ls, create or delete.", show_default=False),
    name: str = typer.Argument(None, metavar="NAME", help="The volume (create, delete).", show_default=False),
    spec_file: str = typer.Option(None, "-f", "--file", metavar="SPEC", help="create: the spec whose volumes: "
                                  "names NAME (provider, region, zone, size, type)."),
    provider: str = typer.Option(None, "--provider", metavar="NAME", help="ls, delete: one provider (default: "
                                 "every provider that keeps volumes of its own)."),
    region: list[str] = typer.Option(None, "--region", metavar="REGION", help="ls, delete: region to look in "
                                     "(repeatable; default: every region in the catalog and in state)."),
    profile: str = typer.Option(None, "--profile", metavar="NAME", help="aws: boto3 profile."),
    yes: bool = typer.Option(False, "--yes", "-y", help="delete: don't ask for confirmation."),
    json_: bool = JSON,
) -> None:
    """Volumes that outlive clusters: gtrain volume ls | create -f SPEC NAME | delete NAME (docs/volumes.md)."""
    out.set_json(json_)
    from gtrain.errors import ConfigError, CredentialsError

    if action not in ACTIONS:
        raise ConfigError(f"ACTION {action!r}: one of {', '.join(ACTIONS)}", field="ACTION",
                          hint="gtrain volume ls | create -f SPEC NAME | delete NAME")
    if action != "ls" and not name:
        raise ConfigError(f"gtrain volume {action}: NAME is missing", field="NAME",
                          hint=f"gtrain volume {action} {'-f SPEC ' if action == 'create' else ''}NAME")
    if action == "create" and not spec_file:
        raise ConfigError("gtrain volume create: -f SPEC is missing (the spec's volumes: entry says what to make)",
                          field="-f", hint=f"gtrain volume create -f spec.yaml {name}")
    for r in region or []:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", r):
            raise ConfigError(f"--region {r!r}: not a region name (lower-case letters, digits and '-')",
                              field="--region", hint="e.g. --region us-east-1")
    if action == "delete" and not yes and json_:
        raise ConfigError("--json needs --yes to delete a volume (its data goes with it)", field="--yes",
                          hint=f"gtrain volume delete {name} --yes --json")
    from gtrain.context import Context
    from gtrain.runs import volumes as ops

    options = {"profile": profile} if profile else {}
    regions = list(region) if region else None
    ctx = Context(report=out.CLIReporter())
    try:
        if action == "create":
            from gtrain.spec import load_spec

            info = ops.create(ctx, load_spec(spec_file), str(name))
            if json_:
                out.emit_json({"volume": info.to_dict()})
            else:
                out.say(f"volume {info.name}: {info.id} in {info.zone or info.region}, {info.size_gb} GB {info.type}, "
                        f"{info.state}; "
                        f"{out.fmt_usd(info.usd_per_month)}/month until `gtrain volume delete {info.name}`")
            return
        providers = [provider] if provider else ops.keepers()

        def each(call: Callable[[str], Any]) -> Iterator[Any]:
            """``call`` of every provider; without --provider, one this machine has no access to (no credentials,
            no subscription or project) is skipped with a warning instead of failing the others."""
            for p in providers:
                try:
                    yield call(p)
                except (CredentialsError, ConfigError) as e:
                    if provider or not (isinstance(e, CredentialsError) or (e.field or "").startswith(f"{p}.")):
                        raise
                    ctx.report.warn(f"{p}: volumes not looked at: {e.message}")

        if action == "ls":
            infos = [i for got in each(lambda p: ops.ls(ctx, p, regions, **options)) for i in got]
            if json_:
                out.emit_json({"volumes": [i.to_dict() for i in infos],
                               "usd_per_month": round(sum(i.usd_per_month for i in infos), 4)})
            elif not infos:
                out.say("no volumes (a spec's volumes: makes them at `gtrain up`; docs/volumes.md)")
            else:
                out.table("volumes", ["name", "provider", "zone", "type", "GB", "state", "attached to", "$/month",
                                      "id"],
                          [[i.name, i.provider, i.zone or i.region or "-", i.type, i.size_gb or "-", i.state or "-",
                            i.attached_to or "-", out.fmt_usd(i.usd_per_month), i.id or "-"] for i in infos])
                out.say(f"standing charge: {out.fmt_usd(sum(i.usd_per_month for i in infos))}/month")
            return
        confirm(f"Delete volume {name} and all the data on it?", yes)
        gone = next((g for g in each(lambda p: ops.delete(ctx, p, str(name), regions, **options)) if g is not None),
                    None)
    finally:
        ctx.store.close()
    if gone is None:
        raise ConfigError(f"NAME: no volume {name} in {', '.join(regions) if regions else 'any region'}",
                          field="NAME", hint="`gtrain volume ls` lists them")
    if json_:
        out.emit_json({"deleted": gone.to_dict()})
    else:
        out.say(f"deleted volume {gone.name} ({gone.id}, {gone.zone or gone.region})")
