"""A provider from outside gtrain/ (tests/fake_provider.py, installed through the ``gtrain.providers`` entry
point) is a first-class citizen: its spec section, `gtrain up/down` at the CLI with the price confirmed, and
`gtrain gc --provider fake` finding by tag what a lost state database forgot -- with no line of gtrain naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fake_provider import installed, tagged


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_plugin_provider_through_the_cli_and_gc(tmp_path: Path, gtrain_home: Path) -> None:
    with installed(tmp_path / "cloud"):
        spec = tmp_path / "f.yaml"
        spec.write_text(json.dumps({"name": "plug", "provider": "fake", "num_nodes": 2, "fake": {}}))
        r = cli("up", str(spec), "--json")
        assert r.returncode == 2 and "--yes" in r.stderr  # it bills: no TTY, no --yes -> refused, nothing made
        assert tagged() == []
        r = cli("up", str(spec), "--yes", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plan"]["price_per_hour"] == 0.5 and len(tagged()) == 2
        (gtrain_home / "state.db").unlink()  # a lost laptop: state is gone, the instances are not
        for extra in ("-wal", "-shm"):
            (gtrain_home / f"state.db{extra}").unlink(missing_ok=True)
        r = cli("gc", "--provider", "fake", "--json")
        assert r.returncode == 0, r.stderr
        found = json.loads(r.stdout)
        assert len(found["orphans"]) == 2 and not found["deleted"]
        r = cli("gc", "--provider", "fake", "--yes", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["deleted"], r.stderr
        assert tagged() == []
        r = cli("gc", "--provider", "local", "--json")  # a provider with nothing to sweep: named, exit 2
        assert r.returncode == 2 and "--provider" in r.stderr
