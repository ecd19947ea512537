"""``gtrain sync`` as a user runs it, a new process each time, against SeaweedFS (tests/fixtures/seaweedfs.py):
it answers on the fast path (no typer, click or rich imported: start-up counts on every re-sync), and what it
prints and exits with is what the Typer command prints and exits with. The parser's forms:
tests/unit/test_cli_fast_sync.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.fixtures.seaweedfs import Weed

TYPER_MAIN = ("import sys; import gtrain.cli.fast as f; f.handle = lambda argv: None; "
              "from gtrain.cli.app import main; sys.argv = ['gtrain', *sys.argv[1:]]; main()")
NOT_ON_A_SYNC = {"typer", "click", "rich", "pydantic", "jinja2", "boto3", "botocore"}


def _env(repo_root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(repo_root), "GTRAIN_PROGRESS_SECONDS": "60"}


def _fast(args: list[str], repo_root: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "gtrain", "sync", *args], env=_env(repo_root),
                       capture_output=True, text=True, timeout=120, cwd=repo_root, stdin=subprocess.DEVNULL)
    lines = p.stderr.splitlines(keepends=True)
    mods = {ln.rsplit("|", 1)[1].strip() for ln in lines if ln.startswith("import time:") and "|" in ln}
    p.stderr = "".join(ln for ln in lines if not ln.startswith("import time:"))
    return p, mods


def _typer(args: list[str], repo_root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", TYPER_MAIN, "sync", *args], env=_env(repo_root), capture_output=True,
                          text=True, timeout=120, cwd=repo_root, stdin=subprocess.DEVNULL)


def _timeless(text: str) -> str:
    return re.sub(r'"seconds": [0-9.e-]+|in [0-9.]+s$|[0-9.]+ (B|KiB|MiB)/s', "T", text, flags=re.MULTILINE)


def test_cli_sync_skips_typer_and_answers_as_typer(tmp_path: Path, weed_bucket: str, weed_env: Weed,
                                                   gtrain_home: Path, repo_root: Path) -> None:
    src = tmp_path / "src"
    for i in range(30):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"f{i:03d}.bin").write_bytes(os.urandom(500 + i))
    url = f"s3://{weed_bucket}/p"

    up, mods = _fast([str(src), url, "--workers", "4"], repo_root)
    assert up.returncode == 0, up.stderr
    assert "moved: 30 up, 0 down, 0 deleted, 0 unchanged" in up.stdout
    assert not {m.split(".")[0] for m in mods} & NOT_ON_A_SYNC, sorted(mods)
    assert "obstore" in mods  # the compiled engine's path, the one the benchmark times

    same, mods = _fast(["--json", str(src), url], repo_root)  # the no-change re-sync
    assert same.returncode == 0, same.stderr
    assert not {m.split(".")[0] for m in mods} & NOT_ON_A_SYNC, sorted(mods)
    doc = json.loads(same.stdout)
    assert (doc["uploaded"], doc["skipped"]) == (0, 30)
    typer = _typer(["--json", str(src), url], repo_root)
    assert (typer.returncode, _timeless(typer.stdout), typer.stderr) == (0, _timeless(same.stdout), same.stderr)

    (src / "d0" / "f000.bin").unlink()  # a dry-run mirror: one delete planned, nothing changed
    args = [str(src), url, "--delete", "--dry-run"]
    dry, _ = _fast(args, repo_root)
    typer = _typer(args, repo_root)
    assert dry.returncode == typer.returncode == 0, dry.stderr + typer.stderr
    assert "would delete-remote d0/f000.bin (500 bytes): not in source" in dry.stdout
    assert (_timeless(dry.stdout), _timeless(dry.stderr)) == (_timeless(typer.stdout), _timeless(typer.stderr))

    gone = f"s3://{weed_bucket}-nope/p"  # an error of the server's: the same message and exit code
    missing, _ = _fast([str(src), gone], repo_root)
    typer = _typer([str(src), gone], repo_root)
    assert missing.returncode == typer.returncode == 2, missing.stderr
    assert "does not exist" in missing.stderr
    assert (missing.stdout, _timeless(missing.stderr)) == (typer.stdout, _timeless(typer.stderr))
