"""gtrain gc: find (and with --yes delete) cloud resources tagged by gtrain that no live cluster owns. Which
providers it can sweep, and what ``--region`` names there, is each provider class's ``gc_scope``."""

from __future__ import annotations

import typer

from gtrain.cli import output as out


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)


def gc(
    provider: str = typer.Option("aws", "--provider", help="Cloud to sweep (aws, gcp, or any provider with gc)."),
    region: list[str] = typer.Option(None, "--region", help="Region to sweep (repeatable; default: every region "
                                                            "in the catalog and in state; gcp: every zone)."),
    profile: str = typer.Option(None, "--profile", help="aws: boto3 profile (default: the environment's)."),
    project: str = typer.Option(None, "--project", help="gcp: project to sweep (default: the environment's)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete what is found (default: only list it)."),
    json_: bool = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else."),
) -> None:
    """List resources tagged by gtrain that no live cluster in state owns; delete them with --yes."""
    out.set_json(json_)
    from gtrain.errors import ConfigError
    from gtrain.providers import get_provider, provider_names

    sweepable = [n for n in provider_names() if _gc_scope(n)]
    if provider not in sweepable:
        raise ConfigError(f"--provider {provider}: gc knows {' and '.join(sweepable)}", field="--provider")
    scope = _gc_scope(provider) or "region"
    import re

    for r in region or []:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", r):
            raise ConfigError(f"--region {r!r}: not a {scope} name (lower-case letters, digits and '-')",
                              field="--region", hint="e.g. --region us-east-1 (gcp: a zone, us-central1-a)")
    from gtrain.sharedstate import open_store

    store = open_store()
    try:
        live = {c.id for c in store.list_clusters() if c.provider == provider}
        options = {k: v for k, v in (("profile", profile), ("project", project)) if v is not None}
        res = get_provider(provider, store, out.CLIReporter()).gc(list(region) if region else None, live, yes,
                                                                  **options)
    finally:
        store.close()
    if json_:
        out.emit_json(res.to_dict())
        return
    c = out.console()
    if not res.orphans:
        c.print(f"nothing tagged by gtrain is orphaned in {', '.join(res.regions)}.")
        return
    out.table("orphaned resources", [scope, "cluster", "kind", "id"],
              [[o.region, o.cluster_id, o.kind, o.id] for o in res.orphans])
    if not res.deleted:
        c.print(f"{len(res.orphans)} resource(s) of {len(res.clusters)} cluster(s). Delete them: gtrain gc --yes")
    elif res.left:
        c.print("deleted; still there: " + ", ".join(res.left))
    else:
        c.print(f"deleted {len(res.orphans)} resource(s); nothing tagged by those clusters remains.")


def _gc_scope(name: str) -> str | None:
    """The provider's ``gc_scope``; None for one that cannot be swept or whose module does not import."""
    from gtrain.errors import ConfigError
    from gtrain.providers import provider_class

    try:
        return provider_class(name).gc_scope
    except ConfigError:
        return None
