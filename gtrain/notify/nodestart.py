"""The laptop's side of the node's own sender (:mod:`gtrain.notify.nodewatch`, docs/notify.md): start it on
rank 0 of a cloud cluster with its secrets written to its standard input, and claim a node event's marker on
the node before the laptop sends that event itself (one event, one message)."""

from __future__ import annotations

import json
import os
import shlex
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec

#: the node-side marker key of each event the node's watcher may send (``@boot``: once per boot of the node)
NODE_KEYS = {"budget_80": "budget_80", "budget_reached": "budget_reached", "idle_stopped": "idle_stopped@boot"}
LOG = "$HOME/.gtrain-idle-watch.log"
#: one watcher per node: rank 0's (this one) and the plain idle watch (gtrain.providers.cloud.idle) lock it
PIDFILE = "~/.gtrain-idle-watch.pid"


def _source(module: str) -> str:
    import importlib

    with open(importlib.import_module(module).__file__ or "", encoding="utf-8") as f:
        return f.read()


def marker_dir(runner: Runner, cluster_name: str) -> str:
    return f"{runner.root}/notify/{cluster_name}"


def wanted(spec: ClusterSpec) -> list[str]:
    """The node events the spec's ``notify:`` asks for and the node can send (webhook / e-mail targets)."""
    n = spec.notify
    if n is None or (n.webhook is None and n.email is None):
        return []
    return [e for e in n.on if e in NODE_KEYS]


def payload(spec: ClusterSpec, runner: Runner, *, idle_s: int | None, poll_s: int, command: list[str],
            life_s: int | None, ends_in_s: int | None, usd_per_h: float | None, age_s: float,
            environ: dict[str, str] | None = None) -> tuple[bytes, list[str]]:
    """The one JSON line the watcher reads on its stdin (with the secrets' values), and what is missing."""
    env = os.environ if environ is None else environ
    n = spec.notify
    assert n is not None
    secrets: dict[str, str] = {}
    missing: list[str] = []
    for slot, name in (("webhook", n.webhook and n.webhook.url_secret), ("smtp", n.email and n.email.smtp_secret)):
        if name:
            if env.get(name):
                secrets[slot] = env[name]
            else:
                missing.append(name)
    sources: list[tuple[str, str | None]] = [
        ("gtrain", None), ("gtrain.redact", None), ("gtrain.notify", None),
        ("gtrain.notify.message", _source("gtrain.notify.message")),
        ("gtrain.notify.deliver", _source("gtrain.notify.deliver")),
        ("gtrain.remote", None), ("gtrain.remote.nodeside", _source("gtrain.remote.nodeside")),
        ("gtrain.notify.nodewatch", _source("gtrain.notify.nodewatch"))]
    cfg: dict[str, Any] = {
        "pidfile": PIDFILE, "idle_s": idle_s, "poll_s": poll_s, "command": command, "cluster": spec.name,
        "provider": spec.provider, "on": wanted(spec), "marker_dir": marker_dir(runner, spec.name),
        "webhook": n.webhook and {"format": n.webhook.format},
        "email": n.email and {"to": n.email.to, "sender": n.email.sender},
        "life_s": life_s, "ends_in_s": ends_in_s, "usd_per_h": usd_per_h, "age_s": age_s,
        "secrets": secrets, "sources": sources}
    return (json.dumps(cfg) + "\n").encode(), missing


def start(runner: Runner, spec: ClusterSpec, report: Reporter, **kw: Any) -> None:
    """Start the watcher on ``runner`` (rank 0): argv and the rendered command hold no secret; the secrets go
    through the SSH session's stdin into the watcher's memory only."""
    from gtrain.notify.nodewatch import BOOT

    line, missing = payload(spec, runner, **kw)
    for name in missing:
        report.warn(f"notify: {name} is not set here: the nodes' own watcher cannot send to that target "
                    "(set it and `gtrain up` again)")
    n = spec.notify
    names = [x for x in (n and n.webhook and n.webhook.url_secret, n and n.email and n.email.smtp_secret) if x]
    # env -u: a node that is this machine (a runner that inherits the laptop's environment) drops them too
    env = " ".join(["env", *[f"-u {x}" for x in names], f"GTRAIN_IDLE_CLUSTER={shlex.quote(spec.name)}"])
    runner.start_detached(f"exec {env} " + " ".join(map(shlex.quote, [runner.python, "-c", BOOT]))
                          + f' >>"{LOG}" 2>&1', stdin=line)
    report.info(f"node 0 sends {', '.join(wanted(spec))} itself when nobody follows (notify:)")


def claim_on(runner: Runner, cluster_name: str, kind: str) -> bool:
    """Claim ``kind``'s marker on the node of ``runner``: False when another sender has it."""
    key = NODE_KEYS[kind]
    res = runner.run_python(_source("gtrain.notify.nodewatch"),
                            ["claim", marker_dir(runner, cluster_name), key, "1" if kind == "idle_stopped" else "0"],
                            timeout=30)
    return bool(json.loads(res.stdout.strip().splitlines()[-1])["claimed"])
