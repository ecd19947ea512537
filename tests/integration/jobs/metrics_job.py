"""A job that logs metrics through gtrain.metrics on every rank, a key=value line on rank 0, and (local rank
0 of each node) a few GPU telemetry samples, the way the telemetry collector will write them."""

import argparse
import json
import os
import time
from pathlib import Path

import gtrain.metrics

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--scale", type=float, default=1.0)
ap.add_argument("--step-sleep", type=float, default=0.0)
args = ap.parse_args()

rank = int(os.environ["RANK"])
for step in range(args.steps):
    gtrain.metrics.log(step=step, loss=args.scale / (step + 1) + 0.01 * rank, lr=1e-3)
    if rank == 0:
        print(f"step {step} tok_s={1000 + step}", flush=True)
    time.sleep(args.step_sleep)
if os.environ.get("LOCAL_RANK") == "0":
    job = Path(os.environ["GTRAIN_METRICS_FILE"]).parent.parent
    (job / "telemetry").mkdir(exist_ok=True)
    node = os.environ["GTRAIN_NODE_RANK"]
    now = time.time()
    with open(job / "telemetry" / f"node-{node}.jsonl", "a") as f:
        for i in range(6):
            for gpu in range(2):
                f.write(json.dumps({"t": now - 6 + i, "gpu": gpu, "util": 10 * i + gpu, "mem_used": 1e9 * i,
                                    "mem_total": 8e10, "power": 100.0 + 10 * i + gpu}) + "\n")
print(f"rank {rank} done", flush=True)
