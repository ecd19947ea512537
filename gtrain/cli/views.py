"""What some commands print, apart from their Typer signatures, so that the fast path (``gtrain/cli/fast.py``)
can print it without importing typer."""

from __future__ import annotations

from gtrain.cli import output as out


def _job_cell(jobs: list[dict]) -> str:  # type: ignore[type-arg]
    if not jobs:
        return "-"
    j = jobs[-1]
    return j["status"] + ("" if j["exit_code"] is None else f" (exit {j['exit_code']})")


def progress_line(j: dict) -> str | None:  # type: ignore[type-arg]
    """``job ID: step 1200/5000 (24.0%) · 3.41 steps/s · ETA 18m 34s · world size 2 nodes, 8 ranks`` of a job
    of `status` (its ``progress`` and ``world_sizes``); None when neither is known."""
    from gtrain.state.progress import describe, world_line

    parts = []
    if j.get("progress"):
        parts.append(describe(j["progress"], live=j.get("status") in ("running", "pending", "recovering")))
    ws = j.get("world_sizes") or []
    if ws:
        changed = f" (changed {len(ws) - 1} time{'s' if len(ws) > 2 else ''})" if len(ws) > 1 else ""
        parts.append(f"world size {world_line(ws[-1])}{changed}")
    return f"job {j['id']}: " + " · ".join(parts) if parts else None


def show_status(cluster: str | None, json_: bool) -> None:
    """`gtrain status [CLUSTER] [--json]`."""
    out.set_json(json_)
    import gtrain.api as api

    rows = api.status(cluster, report=out.CLIReporter())
    if json_:
        out.emit_json({"clusters": rows} if cluster is None else rows[0])
        return
    if not rows:
        out.say("no clusters. `gtrain up SPEC` makes one.")
        return
    out.table(None, ["cluster", "provider", "status", "nodes", "type", "$/h", "up (h)", "last job", "job status"],
              [[r["name"], r["provider"], "STOPPED" if r["status"] == "stopped" else r["status"], r["num_nodes"],
                r["instance_type"] or "-",
                out.fmt_usd(r["price_per_hour"]), f"{r['uptime_hours']:.2f}",
                r["jobs"][-1]["id"] if r["jobs"] else "-", _job_cell(r["jobs"])] for r in rows])
    if cluster is not None:
        r = rows[0]
        out.table("nodes", ["node", "address", "status", "zone", "detail"],
                  [[n["rank"], n["address"] or "-", n["status"], n["zone"] or "-", n["detail"] or ""]
                   for n in r["nodes"]])
        out.table("jobs", ["job", "status", "exit", "started", "ended", "run"],
                  [[j["id"], j["status"], "-" if j["exit_code"] is None else j["exit_code"],
                    out.fmt_time(j["created_at"]), out.fmt_time(j["ended_at"]), j["run"] or "-"] for j in r["jobs"]])
        line = progress_line(r["jobs"][-1]) if r["jobs"] else None
        if line:
            out.say(line)
        recs = [(j["id"], x) for j in r["jobs"] for x in j.get("recoveries") or []]
        if recs:
            out.table("recoveries", ["job", "attempt", "cause", "lost nodes", "at", "took (s)", "cost"],
                      [[jid, x["attempt"], x["kind"], x["lost"], out.fmt_time(x["detected_at"]), f"{x['seconds']:.1f}",
                        out.fmt_usd(x["cost_usd"])] for jid, x in recs])
        out.placement_table(r.get("placement"))
        for name, url in sorted(((r["jobs"] or [{}])[-1].get("tracking") or {}).items()):
            out.say(f"{name}: {url}")
        if r.get("by"):
            out.say(f"started by {r['by']}" + "".join(f"; job {j['id']} by {j['by']}" for j in r["jobs"][-1:]
                                                      if j.get("by") and j["by"] != r["by"]))
        if r.get("recovery"):
            out.say(f"recovery: {r['recovery']}")
        if r["status"] == "stopped":
            out.say(f"cluster {r['name']} is stopped: its disks are still billed; `gtrain start {r['name']}` brings "
                    f"it back, `gtrain down {r['name']}` deletes it")
