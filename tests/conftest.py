"""Shared fixtures. Expensive services (moto, GCS emulator, sshd hosts) are session-scoped plugins in
tests/fixtures/, listed here; every test gets its own GTRAIN_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# every module in tests/fixtures/ is a plugin (session-scoped services: moto, GCS emulator, sshd hosts)
pytest_plugins: list[str] = sorted(
    f"tests.fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)


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


def _untracked() -> set[str] | None:
    """Files in the checkout that git neither tracks nor ignores (None outside a git checkout)."""
    import subprocess

    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent.parent, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {ln[3:] for ln in r.stdout.splitlines() if ln.startswith("??")} if r.returncode == 0 else None


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._gtrain_untracked = _untracked()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A test writes into its tmp_path, never into the checkout (a relative --to, a report, a pulled folder).
    before = getattr(session.config, "_gtrain_untracked", None)
    after = _untracked() if before is not None else None
    if before is not None and after is not None and after - before:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line(f"tests left files in the checkout: {sorted(after - before)[:10]}", red=True)
    # In CI a skipped test is a failed test: nothing may quietly not run.
    if os.environ.get("CI") == "true":
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        skipped = reporter.stats.get("skipped", []) if reporter else []
        if skipped:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            if reporter:
                reporter.write_line(f"CI: {len(skipped)} test(s) skipped; a skip is a failure here", red=True)
