"""Shared fixtures. Expensive services (moto, GCS emulator, sshd hosts) are session-scoped plugins in
tests/fixtures/, listed here; every test gets its own GTRAIN_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins: list[str] = ["tests.fixtures.moto_server", "tests.fixtures.gcs_emulator"]


@pytest.fixture(autouse=True)
def gtrain_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gtrain-home"
    monkeypatch.setenv("GTRAIN_HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("GTRAIN_DEBUG", raising=False)
    return home


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI a skipped test is a failed test: nothing may quietly not run.
    if os.environ.get("CI") == "true":
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        skipped = reporter.stats.get("skipped", []) if reporter else []
        if skipped:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            if reporter:
                reporter.write_line(f"CI: {len(skipped)} test(s) skipped; a skip is a failure here", red=True)
