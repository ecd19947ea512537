"""gtrain cost / catalog: what runs cost, and what could run at what price."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.params import JSON, non_negative


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)
    app.command("catalog")(catalog)


def cost(
    json_: bool = JSON,
) -> None:
    """What every cluster ever run cost (running ones: so far)."""
    out.set_json(json_)
    import gtrain.api as api

    reports = api.cost()
    if json_:
        from gtrain.costs.report import standing_charges

        out.emit_json({"clusters": [r.to_dict() for r in reports],
                       "total_usd": round(sum(r.total_usd for r in reports), 6), "volumes": standing_charges(reports)})
        return
    if not reports:
        out.say("no clusters have run yet.")
        return
    rows = []
    for r in reports:
        start = min((ln.started_at for ln in r.lines), default=None)
        stops = [ln.stopped_at for ln in r.lines]
        stop = None if (not stops or None in stops) else max(s for s in stops if s is not None)
        moved = [m["from_provider"] for m in (r.placement or {}).get("moves") or []]
        rows.append([r.cluster, "→".join([*moved, r.provider]), r.status, out.fmt_time(start), out.fmt_time(stop),
                     f"{r.node_hours:.4f}", len(r.recoveries) or "-",
                     out.fmt_usd(r.total_usd) + ("*" if r.estimate else ""), r.by or "-"])
    out.table("cost history", ["cluster", "provider", "status", "start", "stop", "node-hours", "recoveries", "$",
                               "started by"], rows)
    total = sum(r.total_usd for r in reports)
    out.say(f"total: {out.fmt_usd(total)}" + ("  (* estimate)" if any(r.estimate for r in reports) else ""))
    from gtrain.costs.report import standing_charges

    for v in standing_charges(reports):  # volumes outlive their clusters (docs/volumes.md)
        out.say(f"volume {v['name']} ({v['size_gb']} GB, last on {v['cluster']}): {out.fmt_usd(v['usd_per_month'])}"
                "/month standing charge while it exists (`gtrain volume ls`)")
    for r in reports:
        for m in (r.placement or {}).get("moves") or []:
            out.say(f"{r.cluster}: moved from {m['from']} to {m['to']} at {out.fmt_time(m['at'])} ({m['why']}); "
                    f"its part on {m['from_provider']}: {out.fmt_usd(m['cost_usd'])}")
    for r in reports:  # an elastic job's world size over time (node-hours: the intervals above)
        for j in r.world_sizes:
            if len(j["world_sizes"]) > 1:
                from gtrain.state.progress import world_line

                out.say(f"{r.cluster}: job {j['job']} world size " + " → ".join(
                    f"{world_line(w)} ({out.fmt_time(w['since'])})" for w in j["world_sizes"]))
    recovered = [r for r in reports if r.recoveries]
    if recovered:
        from gtrain.runs.recovery import summary_line

        for r in recovered:
            s = r.recovery_summary
            out.say(f"{r.cluster}: {s['count']} recovery(ies), lost node(s) {s['lost_nodes']}, "
                    f"{s['seconds']:.1f}s down, ~{out.fmt_usd(s['cost_usd'])} of downtime (in the total above)")
            for rec in r.recoveries:
                out.say(f"  {rec['job']}: {summary_line(rec)}")


def catalog(
    gpu: str = typer.Option(None, "--gpu", metavar="NAME",
                            help="Only this GPU model (exact name, e.g. A100, H100, L4)."),
    count: int = typer.Option(None, "--count", metavar="N", help="Only offers with this many GPUs per node."),
    provider: str = typer.Option(None, "--provider", metavar="NAME",
                                 help="A provider the catalog covers: aws, gcp or azure (default: all, side by side)."),
    region: str = typer.Option(None, "--region", metavar="REGION", help="Only this region."),
    spot: bool = typer.Option(False, "--spot", help="Sort by the spot price."),
    limit: int = typer.Option(30, "--limit", metavar="N", help="Show at most this many rows (0: all)."),
    json_: bool = JSON,
    refresh: bool = typer.Option(False, "--refresh", help="Re-price the catalog from the AWS price list and the "
                                 "GCP Cloud Billing Catalog into $GTRAIN_HOME/catalog/ (gcp: GTRAIN_GCP_API_KEY)."),
    spec: str = typer.Option(None, "--spec", metavar="SPEC", help="Price a spec's resources.any_of candidates "
                             "side by side, and say which `up` tries first and why (offline)."),
    tpu: bool = typer.Option(False, "--tpu", help="Cloud TPU types (gcp): chips, hosts, zones, $/chip-hour."),
) -> None:
    """GPU instance offers from the catalog (shipped, or your refreshed copy), cheapest first."""
    out.set_json(json_)
    from dataclasses import asdict

    if spec is not None:
        return _candidates(spec, json_)
    if tpu:
        return _tpu_types(region, spot, json_)

    from gtrain import catalog as cat
    from gtrain.errors import ConfigError

    if provider is not None and provider not in cat.PROVIDERS:
        raise ConfigError(f"--provider {provider!r}: the catalog has {' and '.join(cat.PROVIDERS)}",
                          field="--provider")
    non_negative("--count", count, least=1)
    non_negative("--limit", limit)
    if refresh:
        from gtrain.catalog.refresh import refresh as refresh_catalog

        done = refresh_catalog([provider] if provider else None)
        if json_:
            out.emit_json({"refreshed": [r.to_dict() for r in done]})
            return
        for r in done:
            out.say(r.summary())
        return

    rows = cat.offers(provider=provider, gpu=gpu, gpu_count=count, region=region, spot=spot)
    if limit:
        rows = rows[:limit]
    if json_:
        out.emit_json({"offers": [asdict(o) for o in rows], "snapshot": cat.snapshot_date(provider)})
        return
    if not rows:
        names = ", ".join(cat.gpu_names(provider))
        out.say(f"no offers match. GPU names in the catalog: {names}")
        return
    columns = ["provider", "instance type", "GPUs", "GPU mem", "vCPUs", "mem GiB", "region", "$/h", "spot $/h*"]
    cells = [[o.provider, o.instance_type, o.accelerators, f"{o.gpu_memory_gib:g}", o.vcpus, f"{o.memory_gib:g}",
              o.region, out.fmt_usd(o.price_ondemand), out.fmt_usd(o.price_spot)] for o in rows]
    limit = out.width_limit()
    if limit and max(len(ln) for ln in out.render_table(columns, cells, limit)) > limit:
        # Azure's long size names (Standard_NC40ads_H100_v5) leave no room for the host's CPUs and memory in 80
        # columns: those go (--json has them) rather than a broken word
        columns = columns[:4] + columns[6:]
        cells = [r[:4] + r[6:] for r in cells]
    out.table(None, columns, cells)
    out.say(f"prices: catalog snapshot {cat.snapshot_date(provider)}; * spot prices are estimates")


def _candidates(spec: str, json_: bool) -> None:
    """`gtrain catalog --spec SPEC`: every resources.any_of candidate priced (what `up --dry-run` shows)."""
    import gtrain.api as api
    from gtrain.errors import ConfigError
    from gtrain.spec import load_spec

    parsed = load_spec(spec)
    if not parsed.resources.any_of:
        raise ConfigError(f"--spec {spec}: the spec has no resources.any_of", field="resources.any_of",
                          hint="`gtrain up SPEC --dry-run` prices a one-provider spec")
    res = api.up(parsed, dry_run=True, report=out.CLIReporter())
    if json_:
        out.emit_json({"placement": res.placement, "plan": res.plan.to_dict()})
        return
    out.placement_table(res.placement)


def _tpu_types(region: str | None, spot: bool, json_: bool) -> None:
    """``gtrain catalog --tpu``: every Cloud TPU type (docs/providers/tpu.md), cheapest per chip first; read
    through the registry's accelerator seam (the provider's own catalog)."""
    from dataclasses import asdict

    from gtrain.registry import accelerator_shapes

    shapes = accelerator_shapes("tpu")
    rows = [t for t in shapes.values() if region is None or t.region_zones(region)]
    rows.sort(key=lambda t: (t.price_spot_chip_h if spot else t.price_chip_h, t.generation, t.chips))
    snapshot = next(iter(shapes.values())).snapshot if shapes else "?"
    if json_:
        out.emit_json({"tpu_types": [{**asdict(t), "hosts": t.nodes, "chips_per_host": t.chips_per_node,
                                      "price_ondemand_chip_h": t.price_chip_h,
                                      "price_per_hour": t.price_per_hour(False),
                                      "price_spot_per_hour": t.price_per_hour(True)} for t in rows],
                       "snapshot": snapshot})
        return
    out.table(None, ["accelerators", "chips", "hosts", "chips/host", "$/chip-h", "spot $/chip-h*", "$/h slice",
                     "zones"],
              [[t.name, t.chips, t.nodes, t.chips_per_node, out.fmt_usd(t.price_chip_h),
                out.fmt_usd(t.price_spot_chip_h), out.fmt_usd(t.price_per_hour(spot)),
                " ".join(t.region_zones(region))] for t in rows])
    out.say(f"* spot: the catalog's estimate. TPU prices snapshot {snapshot}; `resources.accelerators: "
            "tpu-v5p-32` in a gcp spec")
