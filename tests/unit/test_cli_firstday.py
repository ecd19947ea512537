"""A user's first day, the small things: a zone pinned without a region plans in the zone's region (aws, gcp);
policies on `local` say they are not enforced there; `status` of a torn-down cluster points to what is kept;
`logs --json` is JSON lines; `--help` names the launcher and the providers; docs/commands.md lists every
command; setup's `python` is job.python."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gtrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, cwd=cwd)


@pytest.mark.parametrize(("provider", "section", "gpu", "zone", "region"), [
    ("aws", "", "H100:8", "us-east-1a", "us-east-1"), ("aws", "", "L4:1", "us-west-2b", "us-west-2"),
    ("gcp", "gcp: {project: p}\n", "L4:1", "europe-west4-a", "europe-west4"),
])
def test_zone_without_region_plans_in_the_zones_region(tmp_path: Path, provider: str, section: str, gpu: str,
                                                       zone: str, region: str) -> None:
    spec = tmp_path / "z.yaml"
    spec.write_text(f"name: z\nprovider: {provider}\nresources: {{accelerators: '{gpu}', zones: [{zone}]}}\n"
                    + section)
    r = gtrain("up", str(spec), "--dry-run", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert (plan["region"], plan["zone"]) == (region, zone)


def test_local_plan_says_its_policies_are_not_enforced(tmp_path: Path) -> None:
    spec = tmp_path / "l.yaml"
    spec.write_text("name: l\npolicies: {max_hours: 2, max_cost_usd: 5, idle_minutes: 30}\n")
    r = gtrain("up", str(spec), "--dry-run")
    assert "note: policies idle_minutes: 30, max_hours: 2, max_cost_usd: 5: not enforced on local" in r.stdout
    spec.write_text("name: l\n")
    assert "not enforced" not in gtrain("up", str(spec), "--dry-run").stdout


def test_help_names_the_launcher_and_every_provider() -> None:
    from gtrain.registry import REGISTRY

    top = gtrain("--help").stdout
    for name in REGISTRY:
        assert re.search(rf"\b{name}\b", top), name
    launch = gtrain("launch", "--help").stdout
    assert "job.launcher" in launch and "start torchrun on every node" not in launch


def test_commands_md_lists_every_command() -> None:
    from gtrain.cli.commands import COMMANDS

    table = (ROOT / "docs/commands.md").read_text().split("\n## ")[0]
    for name, _module, _help in COMMANDS:
        assert f"(#gtrain-{name})" in table, name


def test_torn_down_status_logs_json_and_setup_python(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import sys\nprint('job on', sys.executable)\nprint('x\\ty \"z\"')\n")
    marker = tmp_path / "job-python"  # job.python: gtrain's interpreter behind a wrapper that marks its children
    marker.write_text(f"#!/bin/sh\nGTRAIN_TEST_MARK=job-python exec {sys.executable} \"$@\"\n")
    marker.chmod(0o755)
    (tmp_path / "s.yaml").write_text(
        "name: day1\nnum_nodes: 1\njob:\n  run: train.py\n  launcher: python\n"
        f"  python: {marker}\n"
        "  setup: python -c \"import os; print('setup python:', os.environ.get('GTRAIN_TEST_MARK'))\"\n")
    r = gtrain("run", "s.yaml", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "setup python: job-python" in r.stdout + r.stderr
    # the cluster is gone: status says so and points to what gtrain kept
    st = gtrain("status", "day1")
    assert st.returncode == 2
    assert "cluster 'day1' was torn down" in st.stderr
    assert "gtrain logs day1" in st.stderr and "gtrain report day1" in st.stderr and "gtrain cost" in st.stderr
    # logs --json: one JSON object per line, the text as the job wrote it
    lg = gtrain("logs", "day1", "--json")
    assert lg.returncode == 0
    docs = [json.loads(line) for line in lg.stdout.splitlines()]
    assert docs and all(set(d) == {"node", "rank", "text"} for d in docs)
    assert {"node": 0, "rank": 0, "text": 'x\ty "z"'} in docs
    assert os.environ.get("GTRAIN_TEST_MARK") is None
