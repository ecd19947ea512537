"""Benchmark of `gtrain up` on AWS against a moto server (not a test).

    .venv/bin/python bench/bench_aws.py [--runs 5] [--nodes 32]

Times ``gtrain up`` (Python API, SSH wait off: moto nodes have no sshd) of a 32-node cluster against a
1-node one, each followed by ``down`` (not timed). Target: 32 nodes <= 2x the time of 1 node (nodes are made
in one RunInstances per zone, then one CreateTags per node for its rank). Prints the medians and the ratio;
writes bench/results/aws.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.fixtures.moto_server import MOTO_ENV, _moto_binary  # noqa: E402
from tests.services import free_port, stop, wait_http  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=32)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-aws-"))
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = work / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*_moto_binary(), "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_http(f"{endpoint}/moto-api/data.json", proc, log)
        os.environ.update(MOTO_ENV)
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": str(work / "none"),
                           "AWS_SHARED_CREDENTIALS_FILE": str(work / "none"), "GTRAIN_HOME": str(work / "home")})
        for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
            os.environ.pop(k, None)
        import gtrain
        from gtrain.spec import parse_spec

        def spec(name: str, n: int) -> Any:
            return parse_spec({"name": name, "provider": "aws", "num_nodes": n,
                               "resources": {"accelerators": "A10G:1", "region": "us-east-1"},
                               "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.5}})

        samples: dict[int, list[float]] = {1: [], args.nodes: []}
        gtrain.down(gtrain.up(spec("warm", 1)).cluster.name)  # imports, clients, moto's lazy backends
        for i in range(args.runs):
            for n in (1, args.nodes):
                name = f"b{n}-{i}"
                t0 = time.perf_counter()
                res = gtrain.up(spec(name, n))
                samples[n].append(time.perf_counter() - t0)
                assert res.cluster is not None and res.cluster.num_nodes == n
                gtrain.down(name)
        one, many = statistics.median(samples[1]), statistics.median(samples[args.nodes])
        ratio = many / one
        target = 2.0
        print(f"gtrain up, 1 node:   median {one:.3f} s  ({', '.join(f'{x:.3f}' for x in samples[1])})")
        print(f"gtrain up, {args.nodes} nodes: median {many:.3f} s  "
              f"({', '.join(f'{x:.3f}' for x in samples[args.nodes])})")
        verdict = "ok" if ratio <= target else "MISSED"
        print(f"ratio {args.nodes}/1: {ratio:.2f}x (target <= {target:.1f}x) -> {verdict}")
        results = HERE / "results"
        results.mkdir(exist_ok=True)
        (results / "aws.json").write_text(json.dumps({
            "bench": "aws", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.platform(),
            "cpus": os.cpu_count(), "runs": args.runs, "nodes": args.nodes,
            "up_1_node_s": samples[1], f"up_{args.nodes}_nodes_s": samples[args.nodes],
            "median_1_s": one, f"median_{args.nodes}_s": many, "ratio": ratio, "target": target,
            "ok": ratio <= target,
        }, indent=2) + "\n")
        return 0 if ratio <= target else 1
    finally:
        stop(proc)


if __name__ == "__main__":
    sys.exit(main())
