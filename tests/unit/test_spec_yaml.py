"""The spec's YAML loader against hostile and mistyped files: alias bombs, duplicate keys, deep nesting, size,
and job.env kept byte for byte. The bomb and nesting cases run the real CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.spec import load_spec, parse_spec
from gtrain.spec.loader import load


def gtrain(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=30,
                       cwd=cwd, stdin=subprocess.DEVNULL)
    return r, time.perf_counter() - t


def laughs(anchor_at: str) -> str:
    """Nine nested anchors: *i expands to 9**9 (387 million) strings."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{cur}: &{cur} [{', '.join([f'*{prev}'] * 9)}]")
    body = "\n".join(f"  {ln}" for ln in lines)
    return {
        "name": "\n".join(lines) + "\nname: *i\n",
        "regions": f"name: demo\nresources:\n{body}\n  regions: *i\n",
        "ssh": f"name: demo\nprovider: ssh\nssh:\n{body}\n  hosts: *i\n",
    }[anchor_at]


@pytest.mark.parametrize("where", ["name", "regions", "ssh"])
def test_alias_bomb_is_refused_at_once_by_the_cli(tmp_path: Path, where: str) -> None:
    (tmp_path / "bomb.yaml").write_text(laughs(where))
    r, took = gtrain("up", "bomb.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert err[0].startswith("Error: bomb.yaml at line ") and "aliases expand it to more than" in err[0], err
    assert "Traceback" not in r.stderr and len(err) <= 2
    assert took < 5, f"{took:.2f} s"  # python + gtrain import dominate; the refusal itself takes milliseconds


def test_alias_bomb_refusal_is_milliseconds_and_small(tmp_path: Path) -> None:
    p = tmp_path / "bomb.yaml"
    p.write_text(laughs("name"))
    # peak RSS from /proc (VmHWM, this process's own memory): getrusage's ru_maxrss survives exec on Linux and
    # can report the forking parent's size (a pytest process with torch loaded) instead of ours
    code = ("import re, time; from gtrain.spec import load_spec\n"
            "t = time.perf_counter()\n"
            f"try: load_spec({str(p)!r})\n"
            "except Exception as e: print(type(e).__name__, time.perf_counter() - t,"
            " re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout.split()
    assert out[0] == "ConfigError"
    assert float(out[1]) < 0.5 and int(out[2]) < 300_000  # seconds; KiB of peak RSS (imports included)


def test_aliases_of_normal_size_still_work(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("name: demo\nresources:\n  zones: &z [us-east-1a, us-east-1b]\n  regions: [us-east-1]\n"
                 "job: {run: &r t.py, setup: *r}\n")
    s = load_spec(p)
    assert s.resources.zones == ["us-east-1a", "us-east-1b"] and s.job is not None and s.job.setup == "t.py"


def test_self_referring_alias_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"alias \*a refers to itself"):
        load("name: demo\nx: &a [1, *a]\n", "s.yaml")


@pytest.mark.parametrize(
    ("text", "field", "lines"),
    [
        ("name: demo\nnum_nodes: 1\njob:\n  run: t.py\nnum_nodes: 16\n", "num_nodes", (2, 5)),
        ("name: demo\njob:\n  run: t.py\n  env:\n    A: '1'\n    A: '2'\n", "job.env.A", (5, 6)),
        ("name: demo\nprovider: ssh\nssh:\n  hosts:\n    - {host: a, port: 22, port: 23}\n", "ssh.hosts[0].port",
         (5, 5)),
    ],
)
def test_duplicate_keys_are_refused_with_both_lines(tmp_path: Path, text: str, field: str,
                                                    lines: tuple[int, int]) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_spec(p)
    assert ei.value.field == field and ei.value.exit_code == 2
    assert f"given twice, at line {lines[0]} and line {lines[1]}" in ei.value.message


def test_very_deep_nesting_is_a_named_exit_2_even_under_json(tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("name: demo\nresources: " + "[" * 20000 + "]" * 20000 + "\n")
    (tmp_path / "block.yaml").write_text("name: demo\njob:\n" + "".join(" " * i + "k:\n" for i in range(1, 200)))
    for f, field in (("deep.yaml", "resources"), ("block.yaml", "job")):
        r, took = gtrain("up", f, "--dry-run", "--json", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        doc = json.loads(r.stdout)
        assert doc["field"] == field and "nested more than 50 levels deep" in doc["message"]
        assert "bug in gtrain" not in r.stderr and took < 5


def test_document_over_1_mib_is_refused_before_parsing(tmp_path: Path) -> None:
    p = tmp_path / "big.yaml"
    p.write_text("name: demo\n" + "# padding\n" * 120_000)
    with pytest.raises(ConfigError, match="is over 1 MiB"):
        load_spec(p)


def test_directory_is_not_a_spec_file(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "spec.yaml").write_text("name: demo\n")
    r, _ = gtrain("up", "proj", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    assert "'proj' is a directory, not a spec file" in r.stderr and "proj/spec.yaml" in r.stderr


ENV_YAML = """\
name: demo
job:
  run: t.py
  env:
    LR: 0.00001
    MODE: 0755
    FLAG: yes
    OFF_: off
    T: 12:30
    N: 1_000
    HEX: 0x1F
    SCI: 1e3
    PAD: '  padded  '
    DQ: "tab\\there"
    NONE: null
    TILDE: ~
    EMPTY:
    ON: 1
    BLOCK: |
      line1
      line2
    FOLD: >-
      a
      b
    SAME: &v 007
    AGAIN: *v
"""


def test_env_values_are_the_text_written_never_converted(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(ENV_YAML)
    s = load_spec(p)
    assert s.job is not None
    assert s.job.env == {
        "LR": "0.00001", "MODE": "0755", "FLAG": "yes", "OFF_": "off", "T": "12:30", "N": "1_000", "HEX": "0x1F",
        "SCI": "1e3", "PAD": "  padded  ", "DQ": "tab\there", "NONE": "null", "TILDE": "~", "EMPTY": "",
        "ON": "1", "BLOCK": "line1\nline2\n", "FOLD": "a b", "SAME": "007", "AGAIN": "007",
    }
    # the cluster is re-parsed from its stored copy: the values survive the round trip
    again = parse_spec(s.to_yaml_dict())
    assert again.job is not None and again.job.env == s.job.env


def test_env_text_does_not_leak_into_other_fields_through_an_alias(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("name: demo\nnum_nodes: &n 2\njob: {run: t.py, env: {N: *n}}\n")
    s = load_spec(p)
    assert s.num_nodes == 2 and s.job is not None and s.job.env == {"N": "2"}


def test_env_merge_keys_are_text_too() -> None:
    data = load("base: &b {X: 0755}\njob: {env: {<<: *b, Y: yes}}\n", "s.yaml", merge=True)
    assert data["job"]["env"] == {"X": "0755", "Y": "yes"}


@pytest.mark.parametrize(("text", "field"), [
    ("base: &b {X: 1}\njob: {env: {<<: *b, Y: yes}}\n", "job.env"),
    ("b: &b {max_hours: 1}\npolicies:\n  <<: *b\n", "policies"),
    ("b: &b {name: x}\n<<: *b\n", "SPEC"),
    ("b: &b {host: h}\nssh:\n  hosts: [{<<: *b, user: u}]\n", "ssh.hosts[0]")])
def test_a_merge_key_is_refused_anywhere_in_a_spec(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load(text, "s.yaml")
    assert ei.value.field == field and "a YAML merge key (<<) is not allowed in a spec" in ei.value.message
    assert load("b: &b {max_hours: 1}\npolicies: *b\n", "s.yaml")["policies"] == {"max_hours": 1}  # an alias: fine


@pytest.mark.parametrize(("value", "kind"), [("[1, 2]", "list"), ("{a: 1}", "mapping")])
def test_env_non_scalar_says_quote_it(tmp_path: Path, value: str, kind: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: demo\njob:\n  run: t.py\n  env:\n    A: {value}\n")
    with pytest.raises(ConfigError) as ei:
        load_spec(p)
    assert ei.value.field == "job.env.A" and f"a {kind} is not an environment value; quote it" in ei.value.message
    assert "at line 5" in ei.value.message


def test_env_from_python_must_be_text() -> None:
    with pytest.raises(ConfigError, match="quote it"):
        parse_spec({"name": "demo", "job": {"run": "t.py", "env": {"LR": 1e-05}}})
