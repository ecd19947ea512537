"""gtrain cost / catalog: what runs cost, and what could run at what price."""

from __future__ import annotations

import typer

from gtrain.cli import output as out


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)
    app.command("catalog")(catalog)


def cost(
    json_: bool = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else."),
) -> None:
    """What every cluster ever run cost (running ones: so far)."""
    out.set_json(json_)
    import gtrain.api as api

    reports = api.cost()
    if json_:
        out.emit_json({"clusters": [r.to_dict() for r in reports],
                       "total_usd": round(sum(r.total_usd for r in reports), 6)})
        return
    if not reports:
        out.console().print("no clusters have run yet.")
        return
    rows = []
    for r in reports:
        start = min((ln.started_at for ln in r.lines), default=None)
        stops = [ln.stopped_at for ln in r.lines]
        stop = None if (not stops or None in stops) else max(s for s in stops if s is not None)
        rows.append([r.cluster, r.provider, r.status, out.fmt_time(start), out.fmt_time(stop),
                     f"{r.node_hours:.4f}", out.fmt_usd(r.total_usd) + ("*" if r.estimate else "")])
    out.table("cost history", ["cluster", "provider", "status", "start", "stop", "node-hours", "$"], rows)
    total = sum(r.total_usd for r in reports)
    out.console().print(f"total: {out.fmt_usd(total)}" + ("  (* estimate)" if any(r.estimate for r in reports) else ""))


def catalog(
    gpu: str = typer.Option(None, "--gpu", help="Only this GPU model (exact name, e.g. A100, H100, L4)."),
    count: int = typer.Option(None, "--count", help="Only offers with this many GPUs per node."),
    provider: str = typer.Option(None, "--provider", help="aws or gcp (default: both, side by side)."),
    region: str = typer.Option(None, "--region", help="Only this region."),
    spot: bool = typer.Option(False, "--spot", help="Sort by the spot price."),
    limit: int = typer.Option(30, "--limit", help="Show at most this many rows (0: all)."),
    json_: bool = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else."),
    refresh: bool = typer.Option(False, "--refresh", help="Re-price the catalog from the AWS price list and the "
                                 "GCP Cloud Billing Catalog into $GTRAIN_HOME/catalog/ (gcp: GTRAIN_GCP_API_KEY)."),
) -> None:
    """GPU instance offers from the catalog (shipped, or your refreshed copy), cheapest first."""
    out.set_json(json_)
    from dataclasses import asdict

    from gtrain import catalog as cat
    from gtrain.errors import ConfigError

    if provider is not None and provider not in ("aws", "gcp"):
        raise ConfigError(f"--provider {provider!r}: the catalog has aws and gcp", field="--provider")
    if refresh:
        from gtrain.catalog.refresh import refresh as refresh_catalog

        done = refresh_catalog([provider] if provider else None)
        if json_:
            out.emit_json({"refreshed": [r.to_dict() for r in done]})
            return
        for r in done:
            out.console().print(r.summary())
        return

    rows = cat.offers(provider=provider, gpu=gpu, gpu_count=count, region=region, spot=spot)
    if limit:
        rows = rows[:limit]
    if json_:
        out.emit_json({"offers": [asdict(o) for o in rows], "snapshot": cat.snapshot_date(provider)})
        return
    if not rows:
        names = ", ".join(cat.gpu_names(provider))
        out.console().print(f"no offers match. GPU names in the catalog: {names}")
        return
    out.table(None, ["provider", "instance type", "GPUs", "GPU mem", "vCPUs", "mem GiB", "region", "$/h",
                     "spot $/h*"],
              [[o.provider, o.instance_type,
                o.accelerators, f"{o.gpu_memory_gib:g}", o.vcpus, f"{o.memory_gib:g}", o.region,
                out.fmt_usd(o.price_ondemand), out.fmt_usd(o.price_spot)] for o in rows])
    out.console().print(f"prices: catalog snapshot {cat.snapshot_date(provider)}; * spot prices are estimates")
