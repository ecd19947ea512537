"""CLI flags and prompts: bad values exit 2 naming the flag, `down` asks with default no and refuses --json
without --yes, tables wrap by column, `gtrain ssh` passes arguments and commands through."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest


def gtrain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=env)


@pytest.fixture
def cluster(tmp_path: Path) -> str:
    spec = tmp_path / "c.yaml"
    spec.write_text("name: flags\nprovider: local\nnum_nodes: 2\n")
    assert gtrain("up", str(spec)).returncode == 0
    return "flags"


def status_of(name: str) -> str:
    return str(json.loads(gtrain("status", name, "--json").stdout)["status"])


@pytest.mark.parametrize(("args", "flag"), [
    (["logs", "flags", "--node", "-1"], "--node"), (["logs", "flags", "--rank", "-1"], "--rank"),
    (["logs", "flags", "--tail", "-5"], "--tail"), (["pull", "flags", "--node", "-2"], "--node"),
    (["catalog", "--limit", "-1"], "--limit"), (["catalog", "--count", "0"], "--count"),
    (["ssh-forget", "h", "--port", "-1"], "--port"), (["ssh-forget", "h", "--port", "70000"], "--port"),
    (["ssh", "flags", "--node", "-1"], "--node"), (["exec", "flags", "--node", "-1", "--", "true"], "--node"),
])
def test_bad_flag_values_exit_2_naming_the_flag(cluster: str, args: list[str], flag: str) -> None:
    r = gtrain(*args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stderr.startswith(f"Error: {flag} ") and "Traceback" not in r.stderr


def test_down_json_without_yes_refuses_and_deletes_nothing(cluster: str) -> None:
    r = gtrain("down", cluster, "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["field"] == "--yes" and "--json needs --yes to delete" in doc["message"]
    assert status_of(cluster) == "up"
    assert json.loads(gtrain("down", cluster, "--json", "--yes").stdout)["already_down"] is False


def test_down_prompt_defaults_to_no(cluster: str) -> None:
    """On a terminal, Enter at the prompt keeps the cluster: `[y/N]`."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: gtrain down on a terminal
        os.execv(sys.executable, [sys.executable, "-m", "gtrain", "down", cluster])
    seen = b""
    deadline = time.monotonic() + 60
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                seen += os.read(fd, 1024)
            except OSError:
                break
    assert b"[y/N]" in seen, seen
    os.write(fd, b"\r")
    while True:
        try:
            if not os.read(fd, 1024):
                break
        except OSError:
            break
    _, st = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(st) == 1
    assert status_of(cluster) == "up"
    assert gtrain("down", cluster, "--yes").returncode == 0


def test_catalog_at_80_columns_never_breaks_a_word() -> None:
    r = gtrain("catalog", "--gpu", "H100", "--limit", "0", env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    table = lines[:-1]  # the last line is the note under the table
    assert all(len(ln) <= 80 for ln in table), max(table, key=len)
    words = set(r.stdout.split())
    from gtrain import catalog

    for o in catalog.offers(gpu="H100"):
        assert o.instance_type in words and o.region in words, o


def test_table_wraps_by_column_at_spaces_only() -> None:
    from gtrain.cli.output import render_table

    lines = render_table(["name", "text"], [["p5.48xlarge", "a b c d e f g h"]], limit=20)
    assert lines[0].startswith("name") and all(len(ln) <= 20 for ln in lines)
    assert "p5.48xlarge" in lines[1]
    # a word longer than the room stays whole: the row gets wider instead
    assert render_table(["a"], [["x" * 30]], limit=10)[1] == "x" * 30


def test_ssh_runs_a_command_after_dashdash(cluster: str, gtrain_home: Path) -> None:
    r = gtrain("ssh", cluster, "--node", "1", "--", "echo", "at", "$PWD")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"at {gtrain_home / 'clusters' / cluster / 'node-1'}"
    assert gtrain("ssh", cluster, "--", "exit 3").returncode == 3


def test_ssh_args_pass_through_to_ssh() -> None:
    from gtrain.cli.node_cmds import shell_command, split_extra

    argv = ["ssh", "-F", "/h/ssh/config", "lab-0"]
    opts, cmd = split_extra(["-L", "6006:localhost:6006"], ["gtrain", "ssh", "lab", "-L", "6006:localhost:6006"])
    assert shell_command(argv, opts, cmd) == [*argv, "-L", "6006:localhost:6006"]
    opts, cmd = split_extra(["-A", "nvidia-smi", "-q"], ["gtrain", "ssh", "lab", "-A", "--", "nvidia-smi", "-q"])
    assert shell_command(argv, opts, cmd) == ["ssh", "-F", "/h/ssh/config", "-A", "lab-0", "nvidia-smi", "-q"]


def test_ssh_option_on_a_local_node_exits_2(cluster: str) -> None:
    r = gtrain("ssh", cluster, "-L", "6006:localhost:6006")
    assert r.returncode == 2 and "need a node reached over SSH" in r.stderr


def test_cost_confirmation_comes_from_the_provider_class(tmp_path: Path) -> None:
    """A provider whose class says ``confirms_cost`` is asked about, whatever its name: no TTY, no --yes -> 2."""
    spec = tmp_path / "c.yaml"
    spec.write_text("name: paid\nprovider: local\nnum_nodes: 1\n")
    code = ("import sys\nfrom gtrain.providers import provider_class\n"
            "provider_class('local').confirms_cost = True\n"
            f"sys.argv = ['gtrain', 'up', {str(spec)!r}]\n"
            "from gtrain.cli.app import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "needs confirmation" in r.stderr, r.stderr
    assert json.loads(gtrain("status", "--json").stdout) == {"clusters": []}


def test_include_hint_only_for_nodes_reached_over_ssh(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text("name: nohint\nprovider: local\nnum_nodes: 1\n")
    r = gtrain("up", str(spec))
    assert r.returncode == 0 and "Include" not in r.stdout + r.stderr
