"""Issue 28 item 7: remote output reaching the terminal has no control sequence left but plain colours."""

from __future__ import annotations

import pytest

from gtrain.cli import output
from gtrain.termsafe import safe

HOSTILE = {
    "title": "a\x1b]0;pwned\x07b",
    "clipboard": "a\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\b",
    "clear": "a\x1b[2Jb",
    "alternate": "a\x1b[?1049hb",
    "link": "a\x1b]8;;https://evil.example\x1b\\b\x1b]8;;\x1b\\",
    "reset": "a\x1bcb",
    "c1-csi": "a\x9b2Jb",
    "dcs": "a\x1bP+q544e\x1b\\b",
    "cursor": "a\x1b[10;10Hb",
    "unterminated": "ab\x1b]0;never ends",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_control_sequences_are_removed(name: str) -> None:
    for keep in (False, True):
        got = safe(HOSTILE[name], keep_sgr=keep)
        assert "\x1b" not in got and "\x9b" not in got and "\x07" not in got, (name, got)
        assert got.startswith("a") and "b" in got


def test_plain_colours_kept_only_when_asked_and_other_controls_shown() -> None:
    text = "\x1b[1;31mred\x1b[0m"
    assert safe(text) == "red" and safe(text, keep_sgr=True) == text
    assert safe("a\x07\x08\x00b\tc") == "a^G^H^@b\tc" and safe("10%\r55%\r100%") == "100%"
    assert safe("plain text, no control") == "plain text, no control"


def test_what_the_cli_prints_is_neutralised(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    for text in HOSTILE.values():
        output.LinePrinter()(SimpleNamespace(node=0, rank=1, text=text))
        output.err(f"Error: setup failed: {text}")
        output.say(text)
        output.CLIReporter().line(0, 1, text)
        output.CLIReporter().warn(text)
        output.table(text, ["c"], [[text]])
    got = capsys.readouterr()
    for stream in (got.out, got.err):
        assert "\x1b" not in stream and "\x07" not in stream and "\x9b" not in stream
        assert "[node 0 rank 1] ab" in stream
