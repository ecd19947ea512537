"""gtrain gc: find (and with --yes delete) cloud resources tagged by gtrain that no live cluster owns."""

from __future__ import annotations

import typer

from gtrain.cli import output as out


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)


def gc(
    provider: str = typer.Option("aws", "--provider", help="Cloud to sweep (aws, gcp)."),
    region: list[str] = typer.Option(None, "--region", help="Region to sweep (repeatable; default: every region "
                                                            "in the catalog and in state; gcp: every zone)."),
    profile: str = typer.Option(None, "--profile", help="boto3 profile (default: the environment's)."),
    project: str = typer.Option(None, "--project", help="gcp: project to sweep (default: the environment's)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete what is found (default: only list it)."),
    json_: bool = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else."),
) -> None:
    """List resources tagged by gtrain that no live cluster in state owns; delete them with --yes."""
    out.set_json(json_)
    from gtrain.errors import ConfigError

    if provider not in ("aws", "gcp"):
        raise ConfigError(f"--provider {provider}: gc knows aws and gcp", field="--provider")
    from gtrain.providers.common import live_cluster_ids
    from gtrain.state import StateStore

    store = StateStore()
    try:
        if provider == "gcp":
            from gtrain.providers.gcp.gc import gc as gcp_sweep

            res = gcp_sweep(project, live_cluster_ids(store, "gcp"), yes, store=store, report=out.CLIReporter(),
                            regions=list(region) if region else None)
            regions = res.regions
        else:
            from gtrain.providers.aws.gc import default_regions
            from gtrain.providers.aws.gc import gc as sweep

            regions = list(region) if region else default_regions(store)
            res = sweep(regions, live_cluster_ids(store, "aws"), yes, store=store, report=out.CLIReporter(),
                        profile=profile)
    finally:
        store.close()
    if json_:
        out.emit_json(res.to_dict())
        return
    c = out.console()
    if not res.orphans:
        c.print(f"nothing tagged by gtrain is orphaned in {', '.join(regions)}.")
        return
    out.table("orphaned resources", ["zone" if provider == "gcp" else "region", "cluster", "kind", "id"],
              [[o.region, o.cluster_id, o.kind, o.id] for o in res.orphans])
    if not res.deleted:
        c.print(f"{len(res.orphans)} resource(s) of {len(res.clusters)} cluster(s). Delete them: gtrain gc --yes")
    elif res.left:
        c.print("deleted; still there: " + ", ".join(res.left))
    else:
        c.print(f"deleted {len(res.orphans)} resource(s); nothing tagged by those clusters remains.")
