"""Issue 41: one spec's ``any_of`` over aws, runpod, vast and nebius planned with no credentials and no network
(a laptop on a plane, CI without secrets): every candidate priced side by side from its provider's dated bundled
prices, each marked as such, and the cheapest chosen; nothing is asked of any API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

NOWHERE = "http://127.0.0.1:9"  # nothing listens there: any request would fail at once
SPEC = """name: four
resources:
  any_of:
    - {provider: aws, accelerators: "H100:8", region: us-east-1}
    - {provider: runpod, accelerators: "H100:8"}
    - {provider: vast, accelerators: "H100:8"}
    - {provider: nebius, accelerators: "H100:8"}
nebius: {project_id: project-e00abc, subnet_id: vpcsubnet-e00abc}
job: {run: train.py}
"""


def test_any_of_over_aws_runpod_vast_and_nebius_prices_all_four_offline(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "train.py").write_text("print(1)\n")
    drop = ("AWS_", "RUNPOD_", "VAST_", "NEBIUS_", "GTRAIN_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(HOME=str(tmp_path / "home"), GTRAIN_HOME=str(tmp_path / "gtrain"), HTTPS_PROXY=NOWHERE,
               HTTP_PROXY=NOWHERE, AWS_CONFIG_FILE=str(tmp_path / "none"), NO_COLOR="1",
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    r = subprocess.run([sys.executable, "-m", "gtrain", "up", str(tmp_path / "spec.yaml"), "--dry-run", "--json"],
                       capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    cands = doc["placement"]["candidates"]
    assert sorted(c["provider"] for c in cands) == ["aws", "nebius", "runpod", "vast"], cands
    prices = {c["provider"]: c["cluster_price_per_hour"] for c in cands}
    assert all(isinstance(p, int | float) and p > 0 for p in prices.values()), cands
    chosen = [c for c in cands if c["outcome"] == "chosen"]
    assert len(chosen) == 1 and chosen[0]["cluster_price_per_hour"] == min(prices.values()), cands
    assert doc["created"] is False and doc["plan"]["provider"] == chosen[0]["provider"]
    notes = " ".join(doc["plan"]["notes"])
    assert "OFFLINE" in notes and "estimate" in notes, notes  # the chosen one says where its price came from
