"""A missing optional dependency is named with the extra that installs it (exit 2), never "a bug in gtrain";
and each extra in pyproject.toml holds everything its provider imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gtrain.errors import install_hint

BLOCKER = """
import sys

BLOCKED = {blocked!r}


class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Block())
"""


def run_blocked(tmp_path: Path, blocked: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=blocked))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=60,
                          env=env, stdin=subprocess.DEVNULL)


SSH_SPEC = "name: lab\nprovider: ssh\nnum_nodes: 1\nssh:\n  hosts: [127.0.0.1]\n  port: 1\n"


def test_ssh_provider_without_paramiko_names_the_extra(tmp_path: Path) -> None:
    spec = tmp_path / "lab.yaml"
    spec.write_text(SSH_SPEC)
    r = run_blocked(tmp_path, ["paramiko"], "up", str(spec))
    assert r.returncode == 2, r.stderr
    assert "this needs the `ssh` extra" in r.stderr and install_hint("ssh") in r.stderr
    assert "bug in gtrain" not in r.stderr and "Traceback" not in r.stderr


def test_missing_extra_under_json_is_one_document(tmp_path: Path) -> None:
    spec = tmp_path / "lab.yaml"
    spec.write_text(SSH_SPEC)
    r = run_blocked(tmp_path, ["paramiko"], "up", str(spec), "--json")
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert doc["error"] == "MissingExtra" and doc["extra"] == "ssh" and doc["hint"] == install_hint("ssh")


@pytest.mark.parametrize(("module", "extra"), [("paramiko", "ssh"), ("botocore", "aws"), ("boto3", "aws"),
                                               ("google.cloud.storage", "gcp"), ("cryptography", "ssh"),
                                               ("torch", "train")])
def test_each_sdk_maps_to_its_extra(module: str, extra: str) -> None:
    from gtrain.cli.app import missing_extra

    try:
        raise RuntimeError("wrapped") from ModuleNotFoundError(f"No module named {module!r}", name=module)
    except RuntimeError as e:
        assert missing_extra(e) == (module, extra)
    assert missing_extra(ModuleNotFoundError("No module named 'gtrain.nope'", name="gtrain.nope")) is None


def test_extras_are_complete(repo_root: Path) -> None:
    extras = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        out: set[str] = set()
        for d in extras[extra]:
            name = d.split(">")[0].split("[")[0].split("=")[0].strip().lower()
            if name == "gtrain-cli":  # a self-reference: gtrain-cli[a,b]
                for sub in d.split("[", 1)[1].rstrip("]").split(","):
                    out |= names(sub.strip())
            else:
                out.add(name)
        return out

    assert {"paramiko", "cryptography"} <= names("ssh")
    assert {"boto3", "botocore", "cryptography", "paramiko", "obstore"} <= names("aws")
    assert {"google-cloud-compute", "google-cloud-storage", "paramiko", "cryptography"} <= names("gcp")
    assert names("ssh") | names("aws") | names("gcp") | names("train") <= names("all")


def test_a_cyclic_chain_of_causes_ends(tmp_path: Path) -> None:
    """An exception that is its own context (seen with google-auth's ImportError) must not spin the CLI."""
    from gtrain.cli.app import missing_extra

    a = ImportError("outer")
    b = ModuleNotFoundError("No module named 'packaging'", name="packaging")
    a.__context__ = b
    b.__context__ = a
    assert missing_extra(a) is None


def test_a_dependency_an_extra_forgot_is_named_with_that_extra() -> None:
    """google-auth raising ImportError because `packaging` is missing: the gcp extra's piece, not 'a bug'."""
    from gtrain.cli.app import missing_extra

    code = compile("raise ImportError('google-auth requires packaging') from inner", "<google>", "exec")
    try:
        try:
            raise ModuleNotFoundError("No module named 'packaging'", name="packaging")
        except ModuleNotFoundError as inner:
            exec(code, {"__name__": "google.auth.transport.urllib3", "inner": inner})
    except ImportError as e:
        assert missing_extra(e) == ("packaging", "gcp")


def readme_install() -> tuple[str, dict[str, str]]:
    """README's first screen (up to the tour) and its provider -> extra table."""
    head = (Path(__file__).parents[2] / "README.md").read_text().split("## A five-minute tour")[0]
    rows = {}
    for line in head.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0]] = cells[1]
    return head, rows


def test_readme_first_screen_says_how_to_install_and_which_extra_each_provider_needs(tmp_path: Path) -> None:
    from gtrain.registry import REGISTRY

    head, rows = readme_install()
    assert head.index("make demo") < head.index("**Install**")  # the tour commands stay on top
    for line in ("pipx install './gtrain[aws]'", "uv tool install './gtrain[gcp]'", "pip install -e './gtrain[ssh]'"):
        assert line in head
    # never the index's `gtrain` (an unrelated project): the distribution is gtrain-cli, from a checkout
    assert "pip install 'gtrain" not in head and "`gtrain-cli`" in head
    assert set(rows) == set(REGISTRY)  # every built-in provider, nothing else
    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for provider, extra in rows.items():
        assert extra == "(none)" or extra in extras, (provider, extra)
    # what the CLI says when the extra is missing is the extra README names for that provider
    spec = tmp_path / "lab.yaml"
    spec.write_text(SSH_SPEC)
    r = run_blocked(tmp_path, ["paramiko"], "up", str(spec))
    assert r.returncode == 2 and install_hint(rows["ssh"]) in r.stderr, r.stderr

