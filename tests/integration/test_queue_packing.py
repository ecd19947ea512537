"""`job.gpus_per_node: 1` with `--queue` on a one-node cluster of 4 "GPUs" (the spec's inventory; no GPU is
touched): four jobs run side by side, each with its own CUDA_VISIBLE_DEVICES and rendezvous port, a fifth waits
for a GPU; a whole-node job waits for all of them; a packed job on a two-node cluster is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gtrain

JOB = '''import os, pathlib, time
d = pathlib.Path(os.environ["OUT"])
label = os.environ["LABEL"]
(d / f"{label}.gpu").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "-") + " " + os.environ["MASTER_PORT"])
while not (d / "release").exists():
    time.sleep(0.05)
'''


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_four_one_gpu_jobs_side_by_side_and_a_fifth_waits(tmp_path: Path) -> None:
    work, outd = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    outd.mkdir()
    (work / "job.py").write_text(JOB)
    spec = tmp_path / "p.yaml"
    job = {"workdir": str(work), "run": "job.py", "launcher": "python", "queue": True, "gpus_per_node": 1,
           "env": {"OUT": str(outd), "LABEL": "unset"}}
    spec.write_text(json.dumps({"name": "p", "provider": "local", "num_nodes": 1,
                                "resources": {"accelerators": "A100:4"}, "job": job}))
    gtrain.up(spec)
    try:
        ids = {}
        for label in ("j1", "j2", "j3", "j4", "j5"):
            r = cli("launch", str(spec), "--env", f"LABEL={label}", "--json")
            assert r.returncode == 0, r.stderr
            ids[label] = json.loads(r.stdout)["job_id"]
        whole = tmp_path / "whole.yaml"
        whole.write_text(json.dumps({"name": "p", "provider": "local", "num_nodes": 1,
                                     "resources": {"accelerators": "A100:4"},
                                     "job": {**job, "gpus_per_node": None, "env": {**job["env"], "LABEL": "all"}}}))
        r = cli("launch", str(whole), "--json")
        assert r.returncode == 0, r.stderr
        deadline = time.time() + 30
        while len(list(outd.glob("*.gpu"))) < 4 and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)  # a fifth would have started by now
        seen = {p.stem: p.read_text().split() for p in outd.glob("*.gpu")}
        assert sorted(seen) == ["j1", "j2", "j3", "j4"]
        assert sorted(v[0] for v in seen.values()) == ["0", "1", "2", "3"]
        assert len({v[1] for v in seen.values()}) == 4  # each its own rendezvous port
        r = cli("queue", "p", "--json")
        states = {d["job_id"]: d["state"] for d in json.loads(r.stdout)["jobs"]}
        assert [states[ids[k]] for k in ("j1", "j2", "j3", "j4", "j5")] == ["running"] * 4 + ["waiting"]
        (outd / "release").touch()
        deadline = time.time() + 30
        while not (outd / "all.gpu").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (outd / "j5.gpu").read_text().split()[0] in "0123"
        # the whole node: no CUDA_VISIBLE_DEVICES of the queue's
        assert (outd / "all.gpu").read_text().split()[0] == os.environ.get("CUDA_VISIBLE_DEVICES", "-")
        two = tmp_path / "two.yaml"
        two.write_text(json.dumps({"name": "p2", "provider": "local", "num_nodes": 2,
                                   "resources": {"accelerators": "A100:4"}, "job": job}))
        gtrain.up(two)
        try:
            r = cli("launch", str(two))
            assert r.returncode == 2 and "multi-node job takes whole nodes" in r.stderr, r.stderr
        finally:
            gtrain.down("p2")
    finally:
        gtrain.down("p")
