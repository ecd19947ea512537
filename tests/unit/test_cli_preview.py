"""`launch --dry-run` and `run --dry-run` on a spec whose cluster does not exist: the plan, the price and every
node's rendered scripts, for local, aws and gcp, with no network and nothing created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SPECS = {
    "local": "name: pv-local\nprovider: local\nnum_nodes: 2\n",
    "aws": "name: pv-aws\nprovider: aws\nnum_nodes: 2\nresources: {accelerators: 'H100:8'}\n",
    "gcp": "name: pv-gcp\nprovider: gcp\nnum_nodes: 2\nresources: {accelerators: 'L4:1'}\ngcp: {project: p}\n",
}
PRICE = {"local": "$0.0000", "aws": "p5.48xlarge", "gcp": "g2-standard-4"}
OFFLINE = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent"}


def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, **OFFLINE})


@pytest.mark.parametrize("provider", sorted(SPECS))
@pytest.mark.parametrize("command", ["launch", "run"])
def test_dry_run_without_a_cluster_prints_plan_price_and_every_nodes_scripts(tmp_path: Path, provider: str,
                                                                             command: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPECS[provider] + "job: {run: train.py, env: {LR: '0.1'}}\n")
    r = gtrain(command, str(spec), "--dry-run", "--env", "EXTRA=on")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("plan\n") and PRICE[provider] in r.stdout and "$/h (cluster)" in r.stdout
    for node in (0, 1):
        for name in ("command", "launch.sh", "rank.sh"):
            assert f"# ---- node {node}: {name} ----" in r.stdout
    assert "export LR=0.1" in r.stdout and "export EXTRA=on" in r.stdout
    assert "--rdzv_endpoint='<node 0 address>:29500'" in r.stdout
    doc = json.loads(gtrain(command, str(spec), "--dry-run", "--json").stdout)
    assert doc["plan"]["num_nodes"] == 2 and set(doc["scripts"]) == {"0", "1"}
    assert json.loads(gtrain("status", "--json").stdout) == {"clusters": []}


def test_dry_run_refuses_what_the_real_run_would(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPECS["aws"] + "job: {run: missing.py}\n")
    r = gtrain("run", str(spec), "--dry-run")
    assert r.returncode == 2 and "missing.py" in r.stderr and "Traceback" not in r.stderr
    r = gtrain("launch", "--cluster", "pv-none", "--dry-run")  # no spec: nothing to preview
    assert r.returncode == 2 and "pv-none" in r.stderr
