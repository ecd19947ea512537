"""LocalRunner.stream: a command's exit code is its own, never the -9 of a kill after its output ended."""

from __future__ import annotations

import time
from pathlib import Path

from gtrain.remote.local import LocalRunner


def test_stream_returns_the_exit_code_of_a_process_that_is_still_exiting(tmp_path: Path) -> None:
    runner = LocalRunner(tmp_path)
    codes = []
    for i in range(40):
        lines: list[str] = []
        # output closes first, the process ends a moment later: the window where a kill used to land
        rc = runner.stream(f"echo line {i}; exec >&- 2>&-; sleep 0.01; exit {i % 3}", lines.append)
        assert lines == [f"line {i}"]
        codes.append(rc)
    assert codes == [i % 3 for i in range(40)]


def test_stream_many_quick_commands_all_succeed(tmp_path: Path) -> None:
    runner = LocalRunner(tmp_path)
    assert [runner.stream("echo ok", lambda _: None) for _ in range(60)] == [0] * 60


def test_stream_timeout_still_kills(tmp_path: Path) -> None:
    runner = LocalRunner(tmp_path)
    t = time.monotonic()
    rc = runner.stream("exec >&- 2>&-; sleep 30", lambda _: None, timeout=0.5)
    assert rc == -9 and time.monotonic() - t < 10
