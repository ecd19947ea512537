"""Start-up: the fast path prints exactly what Typer prints, and `status` / `--help` import nothing heavy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("typer", "click", "rich", "pydantic", "jinja2", "paramiko", "boto3", "botocore", "google", "azure", "torch",
         "obstore", "nebius", "grpc")


def imported(*args: str, env: dict[str, str] | None = None) -> set[str]:
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "gtrain", *args], capture_output=True, text=True,
                       timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode in (0, 2), r.stderr[-2000:]
    return {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")
            and "|" in ln}


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["--help"], ["--version"], []])
def test_fast_invocations_import_nothing_heavy(args: list[str], gtrain_home: Path) -> None:
    mods = imported(*args)
    assert "gtrain" in mods
    bad = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert not bad, bad


def test_status_with_clusters_imports_no_sdk_pydantic_or_jinja(tmp_path: Path, gtrain_home: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("name: fast\nprovider: local\nnum_nodes: 1\n")
    subprocess.run([sys.executable, "-m", "gtrain", "up", str(spec)], check=True, capture_output=True, timeout=60)
    mods = imported("status")
    bad = sorted(m for m in mods if m.split(".")[0] in ("pydantic", "jinja2", "paramiko", "boto3", "google", "torch",
                                                        "typer", "rich"))
    assert not bad, bad


COMPARE = """
import io, os, sys, contextlib
from gtrain.cli import fast
from gtrain.cli.app import build_app
bad = []
for cols in list(range(20, 130, 1)):
    os.environ["COLUMNS"] = str(cols)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            build_app()(args=["--help"], prog_name="gtrain")
        except SystemExit:
            pass
    if buf.getvalue() != fast.root_help():
        bad.append(cols)
print("BAD:" + ",".join(map(str, bad)))
"""


def test_fast_help_is_typers_help_at_every_width() -> None:
    r = subprocess.run([sys.executable, "-c", COMPARE], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "BAD:", r.stdout + r.stderr


def test_fast_help_version_and_no_args_as_typer() -> None:
    code = "from gtrain.cli.app import build_app; build_app()(args=['--help'], prog_name='gtrain')"
    typer_help = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    for args, code in ((["--help"], 0), (["-h"], 0), ([], 2)):
        r = subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout) == (code, typer_help.stdout), args
    v = subprocess.run([sys.executable, "-m", "gtrain", "--version"], capture_output=True, text=True, timeout=60)
    tv = subprocess.run(
        [sys.executable, "-c", "from gtrain.cli.app import build_app; build_app()(args=['--version'], prog_name='g')"],
        capture_output=True, text=True, timeout=60)
    assert v.stdout == tv.stdout == "gtrain 0.1.0\n"


def test_fast_status_is_typers_status(tmp_path: Path, gtrain_home: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("name: same\nprovider: local\nnum_nodes: 2\n")
    subprocess.run([sys.executable, "-m", "gtrain", "up", str(spec)], check=True, capture_output=True, timeout=60)
    for args in (["status", "--json"], ["status", "same", "--json"], ["status", "--json", "same"]):
        fast = subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=60)
        typer = subprocess.run([sys.executable, "-c", "import sys; from gtrain.cli.app import build_app; "
                                "build_app()(args=sys.argv[1:], prog_name='gtrain')", *args],
                               capture_output=True, text=True, timeout=60)
        assert fast.returncode == typer.returncode == 0
        # uptime moves between the two calls; everything else is the same
        norm = [__import__("re").sub(r'"uptime_hours": [0-9.e-]+', "", x.stdout) for x in (fast, typer)]
        assert norm[0] == norm[1], args


def test_command_table_matches_each_commands_docstring() -> None:
    """The cheap help table (gtrain/cli/commands.py) says what each command's own docstring says."""
    from gtrain.cli.app import build_app
    from gtrain.cli.commands import COMMANDS

    group = __import__("typer").main.get_command(build_app())
    for name, _, text in COMMANDS:
        cmd = group.get_command(None, name)
        assert cmd is not None, name
        assert (cmd.help or "").split("\n\n")[0].split() == text.split(), name


def test_shell_completion_is_on() -> None:
    env = {**os.environ, "_GTRAIN_COMPLETE": "complete_bash", "COMP_WORDS": "gtrain sta", "COMP_CWORD": "1"}
    r = subprocess.run([sys.executable, "-m", "gtrain"], capture_output=True, text=True, timeout=60, env=env)
    assert "status" in r.stdout, (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "gtrain", "--show-completion", "bash"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "_GTRAIN_COMPLETE" in r.stdout, r.stderr


def test_usage_lines_have_plain_metavars() -> None:
    from gtrain.cli.commands import COMMANDS

    code = ("import sys, io, contextlib\nfrom gtrain.cli.app import build_app\nout = []\n"
            f"for name in {[n for n, _, _ in COMMANDS]!r}:\n"
            "    buf = io.StringIO()\n"
            "    with contextlib.redirect_stdout(buf):\n"
            "        try: build_app()(args=[name, '--help'], prog_name='gtrain')\n"
            "        except SystemExit: pass\n"
            "    out.append(buf.getvalue())\n"
            "print('\\n'.join(out))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    text = r.stdout
    assert "Usage: gtrain down [OPTIONS] CLUSTER\n" in text
    assert "Usage: gtrain up [OPTIONS] SPEC\n" in text
    assert "<str>" not in text and "<int>" not in text and "{" not in text, text
