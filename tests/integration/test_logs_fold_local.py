"""`logs -f` of 64 ranks (2 local nodes x 32 processes, launcher python): the line every rank prints shown once
with the ranks named, the one rank's traceback in full; --no-fold, --rank and --json every line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

JOB = """import os, sys, time
r = int(os.environ["RANK"])
print("hello from every rank", flush=True)
print("loss 2.31", flush=True)
time.sleep(1.0)
if r == 37:
    raise ValueError("bad batch on rank 37")
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})


def test_64_ranks_fold_into_one_line_and_the_failing_rank_shows_in_full(tmp_path: Path, gtrain_home: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(JOB)
    spec = tmp_path / "fold.yaml"
    spec.write_text(json.dumps({"name": "fold", "provider": "local", "num_nodes": 2,
                                "job": {"workdir": str(work), "run": "train.py", "launcher": "python",
                                        "nproc_per_node": 32, "env": {"OMP_NUM_THREADS": "1"}}}))
    assert cli("up", str(spec)).returncode == 0
    try:
        t0 = time.monotonic()
        live = cli("launch", str(spec), "--cluster", "fold", "--wait")
        wall = time.monotonic() - t0
        assert live.returncode == 1, live.stdout + live.stderr
        # live, the 64 hellos arrive as the processes start (on 2 cores: a second or more apart at worst):
        # fewer lines than ranks, whatever the machine's load; rank 37's exception in full
        assert live.stdout.count("hello from every rank") < 64, live.stdout
        assert "[node 1 rank 37] ValueError: bad batch on rank 37" in live.stdout

        folded = cli("logs", "fold", "-f")
        assert folded.returncode == 1
        lines = folded.stdout.splitlines()
        assert lines.count("[ranks 0-63] hello from every rank") == 1, folded.stdout
        assert lines.count("[ranks 0-63] loss 2.31") == 1, folded.stdout
        tb = [ln for ln in lines if ln.startswith("[node 1 rank 37] ")]
        assert tb[0] == "[node 1 rank 37] Traceback (most recent call last):", tb
        assert tb[-1] == "[node 1 rank 37] ValueError: bad batch on rank 37"
        assert any('File "' in ln and "train.py" in ln for ln in tb)
        assert not any(ln.startswith("[node") and "hello" in ln for ln in lines)

        every = cli("logs", "fold", "-f", "--no-fold").stdout
        assert every.count("hello from every rank") == 64 and "[ranks" not in every
        one = cli("logs", "fold", "-f", "--rank", "37").stdout
        assert "[node 1 rank 37] hello from every rank" in one and "[ranks" not in one
        js = [json.loads(x) for x in cli("logs", "fold", "-f", "--json").stdout.splitlines()]
        assert sum("hello from every rank" in d.get("text", "") for d in js) == 64
        print(f"launch --wait of 2 x 32 ranks: {wall:.1f} s")
    finally:
        cli("down", "fold", "--yes")
