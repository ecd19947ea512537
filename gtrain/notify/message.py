"""One event, as the JSON gtrain sends (``format: json``, a ``command``'s stdin) and as each chat service's
documented webhook payload. Every string goes through :func:`gtrain.redact.scrub` first.

The payloads follow the services' published webhook formats:

- Slack incoming webhooks (https://api.slack.com/messaging/webhooks, "Sending messages using incoming
  webhooks"): a JSON body with ``text`` (the notification's fallback) and optional Block Kit ``blocks``
  (``section`` blocks with ``mrkdwn`` text, https://api.slack.com/reference/block-kit/blocks); the reply is
  ``200 ok``.
- Discord "Execute Webhook" (https://discord.com/developers/docs/resources/webhook#execute-webhook): ``content``
  (at most 2000 characters) and/or ``embeds`` (at most 10; an embed's ``title`` at most 256, ``description`` at
  most 4096 characters, ``color`` an integer, ``fields`` of ``{name, value, inline}``, at most 25); the reply
  is ``204 No Content``.
- Microsoft Teams incoming webhook / Workflows ("Create an Incoming Webhook", learn.microsoft.com
  /microsoftteams/platform/webhooks-and-connectors/how-to/add-incoming-webhook, "Send Adaptive Cards using an
  Incoming Webhook"): ``{"type": "message", "attachments": [{"contentType":
  "application/vnd.microsoft.card.adaptive", "content": {"$schema": ..., "type": "AdaptiveCard", "version":
  "1.4", "body": [TextBlock..., FactSet]}}]}``.
"""

from __future__ import annotations

import time
from typing import Any

from gtrain import redact

TITLES = {"succeeded": "succeeded", "failed": "FAILED", "cancelled": "was cancelled", "preempted": "was preempted",
          "recovered": "recovered", "budget_80": "reached 80% of its budget",
          "budget_reached": "reached its budget", "idle_stopped": "was stopped: GPUs idle",
          "health_failed": "failed its health check", "test": "test message"}
COLORS = {"succeeded": 0x2EB67D, "recovered": 0x2EB67D, "failed": 0xE01E5A, "health_failed": 0xE01E5A,
          "preempted": 0xECB22E, "budget_80": 0xECB22E, "budget_reached": 0xE01E5A, "idle_stopped": 0xECB22E,
          "cancelled": 0x888888, "test": 0x1F77B4}
DISCORD_CONTENT = 2000
DISCORD_TITLE = 256
DISCORD_DESCRIPTION = 4096
LAST_LINES = 20


def event(kind: str, *, cluster: str, job: str | None, state: str | None = None, exit_code: int | None = None,
          duration_s: float | None = None, cost_usd: float | None = None, failed: dict[str, Any] | None = None,
          last_lines: list[str] | None = None, report: str | None = None, detail: str | None = None,
          links: dict[str, str] | None = None, provider: str | None = None, progress: dict[str, Any] | None = None,
          world_size: dict[str, Any] | None = None) -> dict[str, Any]:
    """The event every target gets (secrets masked). ``progress`` (gtrain.state.progress.Progress as a dict)
    and ``world_size`` (``nodes``, ``ranks``, ``since``) carry their one-line ``text``."""
    ev = {"event": kind, "t": round(time.time(), 3), "cluster": cluster, "job": job, "provider": provider,
          "state": state, "exit_code": exit_code,
          "duration_s": None if duration_s is None else round(duration_s, 1),
          "cost_usd": None if cost_usd is None else round(cost_usd, 4), "failed": failed,
          "last_lines": list(last_lines or [])[-LAST_LINES:], "report": report, "detail": detail,
          "links": dict(links or {}), "progress": progress, "world_size": world_size}
    return redact.scrub_obj(ev)  # type: ignore[no-any-return]


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def title(ev: dict[str, Any]) -> str:
    return f"gtrain: job {ev.get('job') or '-'} on {ev['cluster']} {TITLES.get(ev['event'], ev['event'])}"


def facts(ev: dict[str, Any]) -> list[tuple[str, str]]:
    out = [("cluster", str(ev["cluster"])), ("job", str(ev.get("job") or "-")), ("state", str(ev.get("state") or "-")),
           ("exit code", "-" if ev.get("exit_code") is None else str(ev["exit_code"])),
           ("duration", _dur(ev.get("duration_s"))),
           ("cost so far", "-" if ev.get("cost_usd") is None else f"${ev['cost_usd']:.2f}")]
    for key, name in (("progress", "progress"), ("world_size", "world size")):
        if isinstance(ev.get(key), dict) and ev[key].get("text"):  # the node's own events have none
            out.append((name, str(ev[key]["text"])))
    if ev.get("failed"):
        f = ev["failed"]
        out.append(("failed first", f"rank {f.get('rank')} (node {f.get('node')}), exit {f.get('exit_code')}"))
    if ev.get("detail"):
        out.append(("detail", str(ev["detail"])))
    if ev.get("report"):
        out.append(("report", str(ev["report"])))
    out += [(name, url) for name, url in sorted((ev.get("links") or {}).items())]
    return out


def text(ev: dict[str, Any]) -> str:
    """Plain text: the e-mail body, the fallback of the chat payloads."""
    body = [title(ev), ""] + [f"{k}: {v}" for k, v in facts(ev)]
    if ev.get("last_lines"):
        body += ["", "last lines of the rank that failed first:"] + [f"  {ln}" for ln in ev["last_lines"]]
    return "\n".join(body) + "\n"


def _code(lines: list[str], limit: int) -> str:
    block = "\n".join(lines).replace("```", "'''")
    while len(block) > limit - 8 and "\n" in block:
        block = block.split("\n", 1)[1]
    return f"```\n{block[-(limit - 8):]}\n```"


def slack(ev: dict[str, Any]) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{title(ev)}*"}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in facts(ev)[:10]]},
    ]
    if ev.get("last_lines"):  # a section's text: at most 3000 characters
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _code(ev["last_lines"], 3000)}})
    return {"text": title(ev), "blocks": blocks}


def discord(ev: dict[str, Any]) -> dict[str, Any]:
    embed: dict[str, Any] = {"title": title(ev)[:DISCORD_TITLE], "color": COLORS.get(ev["event"], 0x888888),
                             "fields": [{"name": k, "value": v[:1024] or "-", "inline": len(v) < 30}
                                        for k, v in facts(ev)][:25]}
    if ev.get("last_lines"):
        embed["description"] = _code(ev["last_lines"], DISCORD_DESCRIPTION)
    return {"content": title(ev)[:DISCORD_CONTENT], "embeds": [embed]}


def teams(ev: dict[str, Any]) -> dict[str, Any]:
    body: list[dict[str, Any]] = [
        {"type": "TextBlock", "text": title(ev), "weight": "Bolder", "size": "Medium", "wrap": True},
        {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in facts(ev)]},
    ]
    if ev.get("last_lines"):
        body.append({"type": "TextBlock", "text": "\n\n".join(ev["last_lines"]), "fontType": "Monospace",
                     "wrap": True})
    return {"type": "message", "attachments": [{
        "contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None,
        "content": {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard",
                    "version": "1.4", "body": body}}]}


def payload(fmt: str, ev: dict[str, Any]) -> dict[str, Any]:
    if fmt == "slack":
        return slack(ev)
    if fmt == "discord":
        return discord(ev)
    if fmt == "teams":
        return teams(ev)
    return ev
