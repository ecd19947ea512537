"""`gtrain sync` on the fast path (gtrain/cli/fast.py): exactly ``SRC DST`` with ``--delete``, ``--dry-run``,
``--workers N`` / ``--workers=N`` (1..128) and ``--json``, in any order; every other form goes to Typer, whose
messages and exit codes stay as they were. The sync itself against a server: tests/integration/test_sync_fast_cli.py."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.cli import fast

#: main() with the fast path switched off: what Typer alone answers (main still turns exceptions into exit codes)
TYPER_MAIN = ("import sys; import gtrain.cli.fast as f; f.handle = lambda argv: None; "
              "from gtrain.cli.app import main; sys.argv = ['gtrain', *sys.argv[1:]]; main()")

DEFAULTS = {"delete": False, "dry_run": False, "json_": False, "workers": 16}


@pytest.mark.parametrize(("args", "want"), [
    (["a", "s3://b/p"], {}),
    (["--delete", "a", "s3://b/p"], {"delete": True}),
    (["a", "--dry-run", "s3://b/p", "--json"], {"dry_run": True, "json_": True}),
    (["--workers", "4", "a", "s3://b/p"], {"workers": 4}),
    (["a", "s3://b/p", "--workers=128", "--delete", "--dry-run", "--json"],
     {"workers": 128, "delete": True, "dry_run": True, "json_": True}),
    (["a", "--workers=1", "s3://b/p"], {"workers": 1}),
    (["a", "s3://b/p", "--workers", "007"], {"workers": 7}),
    (["", "s3://b/p"], {"src": ""}),  # an empty argument is an argument to click too (and an error of the sync's)
])
def test_fast_forms_parse(args: list[str], want: dict[str, object]) -> None:
    assert fast._sync_args(args) == {**DEFAULTS, "src": "a", "dst": "s3://b/p", **want}


NOT_FAST = [
    [], ["a"], ["a", "b", "c"],
    ["-h"], ["--help"], ["a", "b", "-h"], ["a", "b", "--help"],
    ["--", "a", "b"], ["a", "--", "b"], ["-", "b"], ["a", "-"],
    ["a", "b", "--workers"], ["a", "b", "--workers", "0"], ["a", "b", "--workers=0"],
    ["a", "b", "--workers", "129"], ["a", "b", "--workers", "-1"], ["a", "b", "--workers", "x"],
    ["a", "b", "--workers="], ["a", "b", "--workers", " 4"], ["a", "b", "--workers", "+4"],
    ["a", "b", "--workers", "1_0"], ["a", "b", "--workers", "\u0664"], ["a", "b", "--workers", "--json"],
    ["a", "b", "--workers", "4", "--workers", "5"], ["a", "b", "--workers=4", "--workers", "4"],
    ["a", "b", "--workers=4=5"], ["a", "b", "--json", "--json"], ["a", "b", "--delete", "--delete"],
    ["a", "b", "--json=1"], ["a", "b", "--delete=true"], ["a", "b", "--dry"], ["a", "b", "-j"],
    ["a", "b", "--bogus"], ["a", "b", "--version"],
]


@pytest.mark.parametrize("args", NOT_FAST)
def test_every_other_form_goes_to_typer(args: list[str], gtrain_home: Path) -> None:
    assert fast._sync_args(args) is None
    assert fast.handle(["sync", *args]) is None  # nothing ran: Typer answers


def test_fast_default_workers_is_the_typer_options() -> None:
    from gtrain.cli.data_cmds import sync

    assert inspect.signature(sync).parameters["workers"].default.default == fast._SYNC_WORKERS


def _both(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """(`python -X importtime -m gtrain sync ARGS`, the same through Typer alone)."""
    run = {"capture_output": True, "text": True, "timeout": 60, "cwd": cwd, "stdin": subprocess.DEVNULL}
    fast_run = subprocess.run([sys.executable, "-X", "importtime", "-m", "gtrain", "sync", *args], **run)  # type: ignore[call-overload]
    typer_run = subprocess.run([sys.executable, "-c", TYPER_MAIN, "sync", *args], **run)  # type: ignore[call-overload]
    return fast_run, typer_run


def _split(stderr: str) -> tuple[str, set[str]]:
    """(stderr without -X importtime's lines, the modules it imported)"""
    lines = stderr.splitlines(keepends=True)
    mods = {ln.rsplit("|", 1)[1].strip() for ln in lines if ln.startswith("import time:") and "|" in ln}
    return "".join(ln for ln in lines if not ln.startswith("import time:")), mods


@pytest.mark.parametrize("args", [["--workers", "0", "a", "b"], ["a"], ["a", "b", "--bogus"],
                                  ["a", "b", "--workers", "x"]])
def test_usage_errors_are_typers(args: list[str], tmp_path: Path, gtrain_home: Path) -> None:
    f, t = _both(args, tmp_path)
    err, mods = _split(f.stderr)
    assert "typer" in mods  # Typer answered
    assert (f.returncode, f.stdout, err) == (t.returncode, t.stdout, t.stderr)
    assert f.returncode == 2 and "Usage: gtrain sync [OPTIONS] SRC DST" in err, err
    if args[0] == "--workers":
        assert "Invalid value for '--workers': 0 is not in the range 1<=x<=128." in err


@pytest.mark.parametrize("args", [["SRC", "bad://x/y"], ["SRC", "bad://x/y", "--json"], ["SRC", "elsewhere"],
                                  ["SRC", "s3://Bad_Bucket/p", "--dry-run", "--workers=3", "--json"]])
def test_sync_errors_are_the_same_on_both_paths(args: list[str], tmp_path: Path, gtrain_home: Path) -> None:
    (tmp_path / "SRC").mkdir()
    f, t = _both(args, tmp_path)
    err, mods = _split(f.stderr)
    assert not {m.split(".")[0] for m in mods} & {"typer", "click", "rich"}, sorted(mods)  # the fast path ran
    assert (f.returncode, f.stdout, err) == (t.returncode, t.stdout, t.stderr)
    assert f.returncode == 2 and err.startswith("Error: "), err
    assert ('"error": "ConfigError"' in f.stdout) == ("--json" in args)
