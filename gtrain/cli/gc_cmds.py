"""gtrain gc: find (and with --yes delete) cloud resources tagged by gtrain that no live cluster owns. Which
providers it can sweep, and what ``--region`` names there, is each provider class's ``gc_scope``. A provider that
keeps volumes (``gtrain.runs.volumes.VolumeKeeper``) has its volumes no live cluster holds listed too, with their
standing charge; they are deleted only with ``--delete`` (docs/volumes.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from gtrain.cli import output as out

if TYPE_CHECKING:
    from gtrain.runs.volumes import VolumeSweep


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)


def gc(
    provider: str = typer.Option("aws", "--provider", help="Cloud to sweep (aws, gcp, or any provider with gc)."),
    region: list[str] = typer.Option(None, "--region", help="Region to sweep (repeatable; default: every region "
                                                            "in the catalog and in state; gcp: every zone)."),
    profile: str = typer.Option(None, "--profile", help="aws: boto3 profile (default: the environment's)."),
    project: str = typer.Option(None, "--project", help="gcp: project to sweep (default: the environment's)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete what is found (default: only list it); "
                                                          "volumes stay (see --delete)."),
    delete: bool = typer.Option(False, "--delete", help="Also delete the volumes no live cluster holds, with "
                                "their data (implies --yes)."),
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
    from gtrain.runs.volumes import VolumeKeeper, VolumeSweep, sweep
    from gtrain.sharedstate import open_store

    yes = yes or delete
    store = open_store()
    try:
        clusters = [c for c in store.list_clusters() if c.provider == provider]
        live = {c.id for c in clusters}
        options = {k: v for k, v in (("profile", profile), ("project", project)) if v is not None}
        p = get_provider(provider, store, out.CLIReporter())
        regions = list(region) if region else None
        res = p.gc(regions, live, yes, **options)
        # after the sweep: a volume the swept nodes held is free now
        vols = sweep(p, clusters, regions, delete, **options) if isinstance(p, VolumeKeeper) else VolumeSweep()
    finally:
        store.close()
    if json_:
        out.emit_json({**res.to_dict(), "volumes": vols.to_dict()})
        return
    c = out.console()
    _say_volumes(provider, vols, delete)
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


def _say_volumes(provider: str, vols: VolumeSweep, delete: bool) -> None:
    if not vols.orphans:
        return
    out.table("volumes no live cluster holds (kept by down: a standing charge)",
              ["name", "where", "type", "GB", "held by", "$/month", "id"],
              [[v.name, v.zone or v.region or "-", v.type, v.size_gb if v.size_gb is not None else "-",
                v.attached_to or "-", out.fmt_usd(v.usd_per_month), v.id or "-"] for v in vols.orphans])
    c = out.console()
    if not delete:
        c.print(f"{len(vols.orphans)} volume(s), {out.fmt_usd(vols.usd_per_month)}/month. Delete them and their "
                f"data: gtrain gc --provider {provider} --delete (or one: gtrain volume delete NAME)")
        return
    if vols.deleted:
        c.print(f"deleted volume(s): {', '.join(v.name for v in vols.deleted)}")
    if vols.left:
        c.print("not deleted: " + "; ".join(vols.left))


def _gc_scope(name: str) -> str | None:
    """The provider's ``gc_scope``; None for one that cannot be swept or whose module does not import."""
    from gtrain.errors import ConfigError
    from gtrain.providers import provider_class

    try:
        return provider_class(name).gc_scope
    except ConfigError:
        return None
