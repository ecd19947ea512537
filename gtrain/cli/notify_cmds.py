"""gtrain notify test SPEC: a sample message to every target of the spec's ``notify:`` block (docs/notify.md)."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.params import JSON


def register(app: typer.Typer) -> None:
    app.command("notify")(notify)


def notify(
    action: str = typer.Argument(..., metavar="test", show_default=False,
                                 help="`test`: send a sample message to every configured target."),
    spec: str = typer.Argument(..., metavar="SPEC", show_default=False, help="The spec file with a notify: block."),
    json_: bool = JSON,
) -> None:
    """Send a sample message to every target of the spec's notify: block (webhook, e-mail, command)."""
    from gtrain.errors import ConfigError
    from gtrain.notify.dispatch import send
    from gtrain.notify.message import event
    from gtrain.redact import register_secrets
    from gtrain.spec import load_spec

    out.set_json(json_)
    if action != "test":
        raise ConfigError(f"notify {action!r}: the one action is `test`", hint="gtrain notify test SPEC",
                          field="ACTION")
    parsed = load_spec(spec)
    if parsed.notify is None or not parsed.notify.targets():
        raise ConfigError(f"{spec}: no notify: targets", hint="add notify: {webhook: {url_secret: NAME, format: "
                          "slack}} (or email / command)", field="notify")
    register_secrets([n for n in (parsed.notify.webhook and parsed.notify.webhook.url_secret,
                                  parsed.notify.email and parsed.notify.email.smtp_secret) if n])
    ev = event("test", cluster=parsed.name, job="test", state="running", exit_code=None, duration_s=0.0,
               cost_usd=0.0, detail="a test message from `gtrain notify test`", provider=parsed.provider)
    outcomes = send(parsed.notify, ev)
    if json_:
        out.emit_json({"targets": [{"target": o.target, "ok": o.ok, "tries": o.tries, "detail": o.detail}
                                   for o in outcomes]})
    else:
        for o in outcomes:
            (out.say if o.ok else out.err)(f"{o.target}: {'delivered' if o.ok else 'NOT delivered'} "
                                           f"({o.detail}, {o.tries} tr{'y' if o.tries == 1 else 'ies'})")
    if not all(o.ok for o in outcomes):
        raise SystemExit(1)
