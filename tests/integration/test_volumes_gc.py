"""``gtrain gc`` and volumes, on aws against the session's moto server (test_volumes_aws.py's helpers): a volume
held by a live cluster is no orphan; once its cluster is down it is listed with its standing charge, and so is one
``gtrain volume create`` made and nothing ever attached; ``gc --yes`` leaves them (they outlive clusters on
purpose); with the local state gone they are still found by tag; ``gc --delete`` deletes them. The sweep itself
is written against the ``VolumeKeeper`` protocol (gtrain/runs/volumes.py), so every provider that keeps volumes
gets it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.runs import cluster as core
from gtrain.runs import volumes as vol_ops
from tests.integration import test_volumes_aws as aws

pytestmark = pytest.mark.usefixtures("moto_server")

MINE = ("vg-held", "vg-free")


def gc(*args: str) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-m", "gtrain", "gc", "--provider", "aws", "--region", aws.REGION, "--json",
                        *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    doc: dict[str, object] = json.loads(r.stdout)
    return doc


def orphans(doc: dict[str, object]) -> dict[str, float]:
    vols = doc["volumes"]
    assert isinstance(vols, dict)
    return {v["name"]: v["usd_per_month"] for v in vols["orphans"] if v["name"] in MINE}


def test_gc_lists_volumes_no_live_cluster_holds_and_deletes_only_with_delete() -> None:
    ctx = aws.context()
    c = core.up(aws.spec("vg-a", [{"name": "vg-held", "size_gb": 20, "mount": "/data"}]), ctx).cluster
    assert c is not None
    vol_ops.create(ctx, aws.spec("vg-b", [{"name": "vg-free", "size_gb": 5, "mount": "/d", "type": "gp2"}]),
                   "vg-free")
    held = vol_ops.sweep(ctx.provider("aws"), ctx.store.list_clusters(), [aws.REGION], False)  # type: ignore[arg-type]
    assert {v.name for v in held.orphans} & set(MINE) == {"vg-free"}  # vg-held is attached to live vg-a
    core.down("vg-a", ctx)
    r = subprocess.run([sys.executable, "-m", "gtrain", "gc", "--provider", "aws", "--region", aws.REGION],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert "volumes no live cluster holds" in r.stdout and "vg-held" in r.stdout and "vg-free" in r.stdout
    assert "gtrain gc --provider aws --delete" in r.stdout, r.stdout
    swept = gc("--yes")  # the cluster resources' sweep: volumes stay
    assert orphans(swept) == {"vg-held": 1.6, "vg-free": 0.5}  # 20 GB gp3 at $0.08, 5 GB gp2 at $0.10
    assert aws.tagged("vg-held") and aws.tagged("vg-free")
    home = Path(os.environ["GTRAIN_HOME"])
    for f in home.glob("state.db*"):
        f.unlink()  # this machine forgot everything: the volumes are found by tag all the same
    done = gc("--delete")
    vols = done["volumes"]
    assert orphans(done) == {"vg-held": 1.6, "vg-free": 0.5}
    assert isinstance(vols, dict) and set(MINE) <= set(vols["deleted"]) and vols["left"] == []
    assert not aws.tagged("vg-held") and not aws.tagged("vg-free")
