"""Item 12: secret values never reach state.db, stored errors, JSON or the lines gtrain shows."""

from __future__ import annotations

import base64
import json
import stat
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtrain import redact
from gtrain.errors import ConfigError, RemoteCommandError
from gtrain.events import Reporter
from gtrain.state import StateStore

SECRET = "s3cr/t+tok en=42"


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    redact.clear()
    yield
    redact.clear()


def _raw(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(home.glob("state.db*")))


def test_error_text_with_a_secret_never_reaches_the_db_files(gtrain_home: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MYSEC", SECRET)
    assert redact.register_secrets(["MYSEC", "UNSET_NAME"]) == ["MYSEC"]
    enc = urllib.parse.quote(SECRET, safe="")
    b64 = base64.b64encode(SECRET.encode()).decode()
    s = StateStore()
    c = s.create_cluster(name="demo", provider="local", num_nodes=1, spec={"name": "demo"})
    s.create_job(c.id, "j1", {"secret_names": ["MYSEC"]})
    err = RemoteCommandError("node 0", "job.setup", 1, f"GET https://u:{enc}@h/x?t={SECRET}\nauth {b64}")
    s.update_job("j1", status="failed", exit_code=1, info={"error": str(err), "tail": [SECRET]})
    rid = s.record_resource(c.id, "bucket", f"ref-{SECRET}", meta={"note": SECRET})
    s.mark_resource(rid, "created", meta={SECRET: "as a key"})
    s.update_cluster(c.id, extra={"last_error": err.stderr_tail})
    raw = _raw(gtrain_home)  # the database and its WAL, read as bytes: nothing checkpointed away
    assert (gtrain_home / "state.db-wal").exists()
    for form in (SECRET, enc, b64, json.dumps(SECRET)[1:-1]):
        assert form.encode() not in raw, form
    assert b"***" in raw
    info = s.get_job("j1").info
    assert SECRET not in info["error"] and "u:***@h/x?t=***" in info["error"]
    s.close()


def test_errors_scrub_message_hint_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOK", "hunter2hunter2")
    redact.register_secrets(["TOK"])
    e = ConfigError("bad token hunter2hunter2", hint="unset hunter2hunter2", field="x")
    assert "hunter2" not in json.dumps(e.to_dict()) and "hunter2" not in str(e)


def test_short_values_are_not_registered() -> None:
    assert not redact.register("abc") and not redact.register("")
    assert redact.scrub("abc abc") == "abc abc"
    assert redact.register("abcd")
    assert redact.scrub("xabcdx") == "x***x"


def test_redacting_reporter_scrubs_every_line() -> None:
    seen: list[str] = []

    class Rec(Reporter):
        def line(self, node: int, rank: int | None, text: str) -> None:
            seen.append(text)

        def warn(self, msg: str) -> None:
            seen.append(msg)

    redact.register("pa55word!")
    rep = redact.RedactingReporter(Rec())
    rep.line(0, None, "curl -u me:pa55word! x")
    rep.warn("pa55word%21 leaked")
    assert seen == ["curl -u me:*** x", "*** leaked"]


def test_state_files_private_and_loose_home_tightened(gtrain_home: Path) -> None:
    gtrain_home.mkdir(mode=0o755)
    gtrain_home.chmod(0o755)
    s = StateStore()
    s.create_cluster(name="demo", provider="local", num_nodes=1, spec={})
    assert stat.S_IMODE(gtrain_home.stat().st_mode) == 0o700
    files = sorted(gtrain_home.glob("state.db*"))
    assert [p.name for p in files] == ["state.db", "state.db-shm", "state.db-wal"]
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    s.close()
    (gtrain_home / "state.db").chmod(0o644)  # made by an older gtrain
    s = StateStore()
    s.list_clusters()
    assert stat.S_IMODE((gtrain_home / "state.db").stat().st_mode) == 0o600
    s.close()
