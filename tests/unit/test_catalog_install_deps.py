"""`.ci/install-deps` (what `make test` and `.ci/run` call first): it reports exactly what is missing, and is
instant and silent when everything is there. Run in --check mode against a PATH we build, never installing."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

PROGRAMS = ("sshd", "ssh", "ssh-keygen", "rsync", "ip", "ps", "pkill", "unshare", "nsenter", "tmux",
            "chromium", "chromedriver", "slurmctld", "slurmd", "sbatch", "munged", "dockerd", "docker",
            "docker-registry")


def _fake_bin(tmp_path: Path, present: tuple[str, ...]) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for name in present:
        p = d / name
        p.write_text("#!/bin/sh\nexit 0\n")
        p.chmod(0o755)
    return d


def _run(repo_root: Path, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(path), "INSTALL_DEPS_SBIN": "", "HOME": os.environ.get("HOME", "/")}
    return subprocess.run(["/bin/bash", str(repo_root / ".ci" / "install-deps"), *args], env=env,
                          capture_output=True, text=True, timeout=30)


def test_check_names_missing_sshd_and_its_package(repo_root: Path, tmp_path: Path) -> None:
    path = _fake_bin(tmp_path, tuple(p for p in PROGRAMS if p != "sshd"))
    r = _run(repo_root, path, "--check")
    assert r.returncode == 1, r
    assert "missing sshd (packages: openssh-server)" in r.stderr
    assert "sudo " in r.stderr and "install-deps" in r.stderr  # the one command to run
    assert "rsync" not in r.stderr


def test_check_lists_every_missing_package_once(repo_root: Path, tmp_path: Path) -> None:
    r = _run(repo_root, _fake_bin(tmp_path, ()), "--check")
    assert r.returncode == 1
    line = next(ln for ln in r.stderr.splitlines() if "missing" in ln)
    pkgs = line.split("(packages: ")[1].rstrip(")").split()
    assert pkgs == ["openssh-server", "openssh-client", "rsync", "iproute2", "procps", "util-linux", "tmux", "chromium",
                    "chromium-driver", "slurm-wlm", "slurm-client", "munge", "docker.io", "docker-registry"]


@pytest.mark.parametrize("args", [("--check",), ()])
def test_everything_present_is_fast_and_installs_nothing(repo_root: Path, tmp_path: Path,
                                                         args: tuple[str, ...]) -> None:
    # no apt-get on this PATH: were it needed, the script would fail, so exit 0 proves it never got there
    path = _fake_bin(tmp_path, PROGRAMS)
    t0 = time.perf_counter()
    r = _run(repo_root, path, *args)
    assert r.returncode == 0, r
    assert time.perf_counter() - t0 < 2.0
    assert r.stderr == ""


def test_unknown_argument_is_refused(repo_root: Path, tmp_path: Path) -> None:
    r = _run(repo_root, _fake_bin(tmp_path, PROGRAMS), "--install-everything")
    assert r.returncode == 2 and "--check" in r.stderr


def test_make_test_and_ci_run_both_call_it(repo_root: Path) -> None:
    make = (repo_root / "Makefile").read_text()
    assert "\ttest: deps" not in make  # (sanity: recipe lines are tab-indented, targets are not)
    assert any(ln.startswith("test: deps") for ln in make.splitlines())
    assert ".ci/install-deps" in make
    ci = (repo_root / ".ci" / "run").read_text()
    assert ".ci/install-deps" in ci and "apt-get" not in ci
