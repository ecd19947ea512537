"""The job-backend contract's job: every rank says hello; the last rank can exit with a code; all can sleep."""

import argparse
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--exit-code", type=int, default=0)
ap.add_argument("--sleep", type=float, default=0.0)
args = ap.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"contract hello rank {rank}/{world} node {os.environ['GTRAIN_NODE_RANK']}", flush=True)
print(f"contract stderr rank {rank}", file=sys.stderr, flush=True)
if args.sleep:
    time.sleep(args.sleep)
if rank == world - 1 and args.exit_code:
    sys.exit(args.exit_code)
