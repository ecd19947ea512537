"""Delivery to one target: a webhook (stdlib HTTP POST), e-mail (smtplib) or a local command (the event JSON on
its stdin). Each try that fails for a reason that may pass (a connection error, HTTP 429 or 5xx, an SMTP
temporary error) is retried with exponential back-off; nothing here raises: the outcome is returned, a run
never fails because a message could not be sent."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

from gtrain import redact
from gtrain.notify import message

#: tries per target (the first and its retries); GTRAIN_NOTIFY_TRIES overrides
TRIES = 4
#: the first back-off, doubled each try; GTRAIN_NOTIFY_BACKOFF_S overrides
BACKOFF_S = 1.0
TIMEOUT_S = 10.0
RETRY_AFTER_MAX_S = 30.0


@dataclass
class Outcome:
    target: str
    ok: bool
    tries: int
    detail: str


def _tries() -> int:
    try:
        return max(1, int(os.environ.get("GTRAIN_NOTIFY_TRIES", TRIES)))
    except ValueError:
        return TRIES


def _backoff(n: int) -> float:
    try:
        base = float(os.environ.get("GTRAIN_NOTIFY_BACKOFF_S", BACKOFF_S))
    except ValueError:
        base = BACKOFF_S
    return base * (2 ** n)


class _Retry(Exception):
    def __init__(self, detail: str, wait: float | None = None) -> None:
        super().__init__(detail)
        self.detail, self.wait = detail, wait


def _with_retries(target: str, once: Any) -> Outcome:
    tries = _tries()
    for n in range(tries):
        try:
            detail = once()
            return Outcome(target, True, n + 1, redact.scrub(str(detail)))
        except _Retry as e:
            if n + 1 >= tries:
                return Outcome(target, False, n + 1, redact.scrub(e.detail))
            time.sleep(min(RETRY_AFTER_MAX_S, e.wait) if e.wait is not None else _backoff(n))
        except Exception as e:  # noqa: BLE001 -- a message never fails the run
            return Outcome(target, False, n + 1, redact.scrub(f"{type(e).__name__}: {e}"))
    return Outcome(target, False, tries, "no try made")


def webhook(url: str, fmt: str, ev: dict[str, Any]) -> Outcome:
    redact.register(url)  # the URL is the credential: it never reaches a log or a message
    body = json.dumps(message.payload(fmt, ev)).encode()

    def once() -> str:
        req = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "gtrain-notify"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 -- the user's webhook
                return f"HTTP {resp.status}"
        except urllib.error.HTTPError as e:
            if e.code == 429 or e.code >= 500:
                ra = e.headers.get("Retry-After") if e.headers else None
                wait = float(ra) if ra and ra.replace(".", "", 1).isdigit() else None
                raise _Retry(f"HTTP {e.code}", wait) from None
            raise RuntimeError(f"HTTP {e.code}: {e.read(300).decode('utf-8', 'replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise _Retry(f"{type(e).__name__}: {getattr(e, 'reason', e)}") from None

    return _with_retries(f"webhook ({fmt})", once)


def email(smtp_url: str, sender: str, to: list[str], ev: dict[str, Any]) -> Outcome:
    import smtplib

    redact.register(smtp_url)
    u = urllib.parse.urlsplit(smtp_url)
    if u.scheme not in ("smtp", "smtps") or not u.hostname:
        return Outcome("email", False, 0, "the SMTP secret is not smtp://[user:password@]host[:port] (or smtps://)")
    if u.password:
        redact.register(urllib.parse.unquote(u.password))
    starttls = "starttls=1" in (u.query or "")
    msg = EmailMessage()
    msg["Subject"], msg["From"], msg["To"] = message.title(ev), sender, ", ".join(to)
    msg.set_content(message.text(ev))
    msg.add_attachment(json.dumps(ev, indent=2).encode(), maintype="application", subtype="json",
                       filename="event.json")

    def once() -> str:
        cls = smtplib.SMTP_SSL if u.scheme == "smtps" else smtplib.SMTP
        try:
            with cls(u.hostname or "", u.port or (465 if u.scheme == "smtps" else 25), timeout=TIMEOUT_S) as s:
                if starttls:
                    s.starttls()
                if u.username:
                    s.login(urllib.parse.unquote(u.username), urllib.parse.unquote(u.password or ""))
                s.send_message(msg)
            return f"sent to {len(to)} recipient(s)"
        except smtplib.SMTPResponseException as e:
            if 400 <= e.smtp_code < 500:
                raise _Retry(f"SMTP {e.smtp_code}") from None
            raise RuntimeError(f"SMTP {e.smtp_code}") from None
        except (smtplib.SMTPServerDisconnected, smtplib.SMTPConnectError, OSError) as e:
            raise _Retry(f"{type(e).__name__}: {e}") from None

    return _with_retries("email", once)


def command(cmd: str, ev: dict[str, Any]) -> Outcome:
    argv = shlex.split(cmd)

    def once() -> str:
        try:
            res = subprocess.run(argv, input=json.dumps(ev).encode(), capture_output=True, timeout=60,
                                 check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise _Retry(f"{type(e).__name__}: {e}") from None
        if res.returncode != 0:
            raise _Retry(f"exit {res.returncode}: {res.stderr.decode('utf-8', 'replace')[-300:].strip()}")
        return "exit 0"

    return _with_retries(f"command ({argv[0]})", once)
