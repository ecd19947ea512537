"""The node's own sender (gtrain.notify.nodewatch): started the way `gtrain up` starts it on rank 0 (a detached
process fed ONE line on its stdin, through a real runner), it sends the budget events to a real local HTTP
server once each, skips what the laptop claimed first, and its secret (the webhook URL) is in no process's
argv or environment, no file under the node's root or home, and not in its log."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gtrain.events import Reporter
from gtrain.notify import nodestart
from gtrain.remote.local import LocalRunner
from gtrain.spec import parse_spec
from tests.notify_receivers import smtp, webhook
from tests.procscan import procs_holding

_LAUNCHERS = {b"bash", b"sh", b"env", b"setsid"}


def _scan_proc(needle: bytes) -> list[str]:
    """Processes whose argv or environment holds ``needle``. The environment of the shell that starts the watcher
    on a node that is this machine is the laptop's, for the few ms before its ``exec env -u ...``: a launcher's
    environment is not counted (its argv is)."""
    return procs_holding(needle, laptops_env=lambda argv: os.path.basename(argv.split(b"\0", 1)[0]) in _LAUNCHERS)


def _scan_files(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_node_watcher_sends_budget_events_once_with_its_secret_only_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, root = tmp_path / "home", tmp_path / "node-root"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # the watcher's pidfile and log: ~/.gtrain-idle-watch.*
    monkeypatch.setenv("GTRAIN_NOTIFY_BACKOFF_S", "0.01")
    spec = parse_spec({"name": "nw-test", "provider": "local", "notify": {
        "on": ["budget_80", "budget_reached", "failed"],
        "webhook": {"url_secret": "NW_TEST_HOOK", "format": "slack"},
        "email": {"to": ["ops@example.com"], "smtp_secret": "NW_TEST_SMTP"}}})
    assert nodestart.wanted(spec) == ["budget_80", "budget_reached"]
    runner = LocalRunner(root)
    with webhook([503]) as hook, smtp() as (smtp_url, mails):  # the first try fails: retried from the node
        secret = hook.url.encode()
        monkeypatch.setenv("NW_TEST_HOOK", hook.url)
        monkeypatch.setenv("NW_TEST_SMTP", smtp_url)
        # the laptop sent budget_80 first (its follower saw the cost): the node must not send it again
        assert nodestart.claim_on(runner, "nw-test", "budget_80") is True
        assert nodestart.claim_on(runner, "nw-test", "budget_80") is False
        # a lifetime of 400 s with 64 s left: past 80% now; `budget_reached` 60 s before the end = in 4 s
        nodestart.start(runner, spec, _Report(), idle_s=None, poll_s=1, command=[], life_s=400, ends_in_s=64,
                        usd_per_h=2.0, age_s=336)
        deadline, seen = time.monotonic() + 20, 0
        while not hook.delivered and time.monotonic() < deadline:
            seen += len(_scan_proc(b"gtrain.notify.nodewatch"))  # the watcher, by its argv (python3 -c BOOT)
            assert not _scan_proc(secret), "the webhook URL is in a process's argv or environment"
            time.sleep(0.2)
        assert seen, "the watcher was never seen running"
        log = home / ".gtrain-idle-watch.log"
        while "budget_reached: email" not in (log.read_text() if log.exists() else "") \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # nothing else comes
    assert [b["text"].rsplit(" ", 3)[-3:] for b in hook.delivered] == [["reached", "its", "budget"]], hook.requests
    assert [r["status"] for r in hook.requests] == [503, 200]
    assert len(mails) == 1 and mails[0].rcpt_tos == ["ops@example.com"]  # the same event by e-mail, once
    assert b"reached its budget" in mails[0].content
    facts = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in hook.delivered[0]["blocks"][1]["fields"]}
    assert facts["*cluster*"] == "nw-test" and facts["*cost so far*"] == "$0.19"  # ~340 s of 400 at $2/h
    text = log.read_text()
    assert "budget_80: already sent by gtrain" in text and "delivered after 2 tries" in text, text
    # the node's marker: the laptop's follower finds it and sends nothing
    assert nodestart.claim_on(runner, "nw-test", "budget_reached") is False
    marks = json.loads((root / "notify" / "nw-test" / "budget_reached.json").read_text())
    assert marks["by"] == "node" and marks["outcomes"][0]["ok"] is True
    assert not _scan_files(root, secret) and not _scan_files(home, secret)
    assert b"s3cr3t-token" not in text.encode()


class _Report(Reporter):
    def warn(self, msg: str) -> None:
        raise AssertionError(msg)
