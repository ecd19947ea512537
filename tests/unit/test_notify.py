"""Notifications against real receivers: a local HTTP server as the webhook, aiosmtpd for e-mail, a real
command reading the event on stdin. Payload shapes are checked against what Slack, Discord and Teams document
(see gtrain/notify/message.py for the sources)."""

from __future__ import annotations

import email
import json
import sys
from pathlib import Path

import pytest

from gtrain import redact
from gtrain.notify import deliver, message
from gtrain.notify.dispatch import claim, send
from gtrain.spec.notify import NotifySpec
from tests.notify_receivers import smtp, webhook


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_NOTIFY_BACKOFF_S", "0.01")
    redact.clear()


def _failed_event() -> dict:  # type: ignore[type-arg]
    return message.event("failed", cluster="c1", job="j-1", state="failed", exit_code=3, duration_s=75.2,
                         cost_usd=1.2345, failed={"node": 1, "rank": 1, "exit_code": 3},
                         last_lines=[f"line {i}" for i in range(30)], report="/tmp/r.html", provider="local")


def test_webhook_500_three_times_then_200_delivers_once() -> None:
    with webhook([500, 500, 500]) as hook:
        out = deliver.webhook(hook.url, "json", _failed_event())
    assert out.ok and out.tries == 4
    assert [r["status"] for r in hook.requests] == [500, 500, 500, 200]
    assert len(hook.delivered) == 1 and hook.delivered[0]["event"] == "failed"
    assert hook.requests[0]["content_type"] == "application/json"


def test_webhook_that_never_recovers_is_reported_not_raised_and_url_masked() -> None:
    with webhook([503] * 10) as hook:
        out = deliver.webhook(hook.url, "json", _failed_event())
    assert not out.ok and out.tries == deliver.TRIES and "HTTP 503" in out.detail
    assert len(hook.requests) == deliver.TRIES
    assert "s3cr3t-token" not in redact.scrub(f"posting to {hook.url}")  # the URL is registered as a secret


def test_webhook_4xx_is_not_retried() -> None:
    with webhook([404]) as hook:
        out = deliver.webhook(hook.url, "json", _failed_event())
    assert not out.ok and out.tries == 1 and len(hook.requests) == 1


def test_slack_payload_follows_incoming_webhook_format() -> None:
    with webhook() as hook:
        assert deliver.webhook(hook.url, "slack", _failed_event()).ok
    body = hook.delivered[0]
    assert isinstance(body["text"], str) and "FAILED" in body["text"]  # the notification's fallback text
    assert all(b["type"] == "section" for b in body["blocks"])
    fields = body["blocks"][1]["fields"]
    assert len(fields) <= 10 and all(f["type"] == "mrkdwn" for f in fields)  # Block Kit: at most 10 fields
    code = body["blocks"][2]["text"]["text"]
    assert code.startswith("```") and "line 29" in code and len(code) <= 3000
    assert "line 9" not in code  # the last 20 lines only


def test_discord_payload_follows_execute_webhook_limits() -> None:
    ev = _failed_event()
    ev["last_lines"] = ["x" * 500] * 20
    body = message.discord(ev)
    assert len(body["content"]) <= 2000 and len(body["embeds"]) == 1
    emb = body["embeds"][0]
    assert len(emb["title"]) <= 256 and len(emb["description"]) <= 4096 and isinstance(emb["color"], int)
    assert len(emb["fields"]) <= 25 and all(set(f) == {"name", "value", "inline"} for f in emb["fields"])


def test_teams_payload_is_an_adaptive_card_message() -> None:
    body = message.teams(_failed_event())
    assert body["type"] == "message"
    att = body["attachments"][0]
    assert att["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = att["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    facts = {f["title"]: f["value"] for b in card["body"] if b["type"] == "FactSet" for f in b["facts"]}
    assert facts["exit code"] == "3" and facts["cost so far"] == "$1.23"


def test_email_through_a_real_smtp_server_and_command_on_stdin(tmp_path: Path) -> None:
    got_file = tmp_path / "event.json"
    cmd = f"{sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write(sys.stdin.read())' {got_file}"
    spec = NotifySpec.model_validate({"email": {"to": ["me@example.com"], "smtp_secret": "SMTP_URL",
                                                "sender": "gtrain@example.com"}, "command": cmd})
    with smtp() as (url, got):
        outs = send(spec, _failed_event(), {"SMTP_URL": url})
    assert [o.ok for o in outs] == [True, True], outs
    assert len(got) == 1 and got[0].rcpt_tos == ["me@example.com"]
    msg = email.message_from_bytes(got[0].content)
    assert "FAILED" in msg["Subject"] and msg["From"] == "gtrain@example.com"
    text = next(p for p in msg.walk() if p.get_content_type() == "text/plain").get_payload(decode=True).decode()
    assert "exit code: 3" in text and "line 29" in text
    assert json.loads(got_file.read_text())["job"] == "j-1"


def test_missing_secret_is_an_outcome_not_an_error() -> None:
    spec = NotifySpec.model_validate({"webhook": {"url_secret": "NOPE_URL", "format": "slack"}})
    [out] = send(spec, _failed_event(), {})
    assert not out.ok and "NOPE_URL is not set" in out.detail


def test_secret_values_are_masked_in_the_event() -> None:
    redact.register("hunter2-password")
    ev = message.event("failed", cluster="c", job="j", last_lines=["connecting with hunter2-password"])
    assert "hunter2-password" not in json.dumps(ev)


def test_one_event_one_claim(tmp_path: Path) -> None:
    assert claim(tmp_path, "cid", "jid", "failed") is not None
    assert claim(tmp_path, "cid", "jid", "failed") is None
    assert claim(tmp_path, "cid", "jid", "preempted-2") is not None


def test_spec_refuses_a_url_in_place_of_a_secret_name() -> None:
    from gtrain.errors import ConfigError
    from gtrain.spec import parse_spec

    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "a", "notify": {"webhook": {"url_secret": "https://hooks.slack.com/x"}}})
    assert "notify.webhook.url_secret" in e.value.message and "environment variable name" in e.value.message
    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "a", "notify": {"on": ["finished"]}})
    assert "finished" in e.value.message
