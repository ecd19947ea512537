"""Log latency benchmark (not a test): how long after a node writes a line does `gtrain logs -f` see it?

    .venv/bin/python bench/bench_logs.py [--lines 100]

A real job (torchrun, 1 node x 1 process) prints a wall-clock timestamp every 50 ms; the Python API's
follower (what `gtrain logs -f` and `launch --wait` use) records when each line arrives. Same machine,
same clock. Run on the local provider and on the ssh provider (a real sshd host in a network namespace).
Target: p95 <= 0.5 s. Prints a table and writes bench/results/logs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import gtrain  # noqa: E402
from tests.fixtures.sshd import start_ssh_hosts  # noqa: E402

TICKER = """
import sys, time
n = int(sys.argv[1])
for i in range(n):
    print(f"tick {i} {time.time():.6f}", flush=True)
    time.sleep(0.05)
"""


def measure(spec: Path, name: str) -> list[float]:
    gtrain.up(spec)
    try:
        job = gtrain.launch(spec)
        lat: list[float] = []

        def on_line(line: object) -> None:
            text = getattr(line, "text", "")
            if text.startswith("tick "):
                lat.append(time.time() - float(text.split()[2]))

        gtrain.wait(name, job_id=job.job_id, on_line=on_line)
        return lat
    finally:
        gtrain.down(name)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=100)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-logs-"))
    os.environ["GTRAIN_HOME"] = str(work / "home")
    (work / "ticker.py").write_text(TICKER)
    job = {"workdir": str(work), "run": f"ticker.py {args.lines}", "nproc_per_node": 1}
    results: dict[str, dict[str, float]] = {}

    local = work / "local.yaml"
    local.write_text(json.dumps({"name": "bench-logs-local", "num_nodes": 1, "job": job}))
    runs = {"local": measure(local, "bench-logs-local")}

    with start_ssh_hosts(1) as hosts:
        h = hosts[0]
        ssh_spec = work / "ssh.yaml"
        ssh_spec.write_text(json.dumps({
            "name": "bench-logs-ssh", "provider": "ssh", "num_nodes": 1,
            "ssh": {"user": h.user, "identity_file": h.identity_file, "python": sys.executable,
                    "hosts": [f"{h.address}:{h.port}"], "host_keys": {f"{h.address}:{h.port}": h.host_key_line}},
            "job": job,
        }))
        runs["ssh"] = measure(ssh_spec, "bench-logs-ssh")

    print(f"{'provider':<10}{'lines':>7}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}   target p95 <= 500 ms")
    ok = True
    for name, lat in runs.items():
        if not lat:
            print(f"{name:<10} no lines seen")
            ok = False
            continue
        p50, p95, mx = statistics.median(lat) * 1000, pct(lat, 95) * 1000, max(lat) * 1000
        results[name] = {"lines": len(lat), "p50_ms": round(p50, 1), "p95_ms": round(p95, 1), "max_ms": round(mx, 1)}
        ok = ok and p95 <= 500
        print(f"{name:<10}{len(lat):>7}{p50:>10.1f}{p95:>10.1f}{mx:>10.1f}")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "logs.json").write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
