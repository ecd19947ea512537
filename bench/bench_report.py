"""Report and plot speed benchmark (not a test): `gtrain report` of a run with 100k metric points, and
`gtrain plot`'s first frame, both from the archive of a cluster that is gone (the real CLI, a new process).

    .venv/bin/python bench/bench_report.py [--points 100000] [--repeat 3]

The run: 2 nodes x 2 ranks; rank 0 logs loss/lr/grad_norm/tok_s at every step (``--points`` points in all),
the other ranks loss; 2 GPUs x 2 nodes of telemetry every 5 s over the run; a recovery event.
Targets: report <= 2 s and <= 2 MB (downsampled for display; the archive keeps every point); plot <= 0.5 s to
the first frame. The first report parses every line (and caches the columns in ARCHIVE/.cache/); later ones
and plot read the cache. Run as installed (byte-compiled). Prints a table and writes bench/results/report.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gtrain.runlog import archive  # noqa: E402
from gtrain.state import StateStore  # noqa: E402

METRICS = ("loss", "lr", "grad_norm", "tok_s")


def make_run(home: Path, points: int) -> tuple[str, str]:
    """A terminated cluster with one finished job and its archive; returns (cluster name, archive folder)."""
    store = StateStore(home)
    spec = {"name": "bench", "provider": "local", "num_nodes": 2, "job": {"run": "train.py", "nproc_per_node": 2}}
    c = store.create_cluster(name="bench", provider="local", num_nodes=2, spec=spec, market="spot",
                             instance_type="g5.xlarge", price_per_hour=1.0)
    steps = points // (len(METRICS) + 3)  # rank 0: every metric; ranks 1..3: loss
    t0 = time.time() - steps * 0.05 - 60
    for rank in range(2):
        store.open_interval(c.id, rank, instance_type="g5.xlarge", market="spot", price_per_hour=1.0, started_at=t0)
    job_id = "bench-20260101-000000-abcd"
    store.create_job(c.id, job_id, {"run": "train.py"})
    store.update_job(job_id, status="succeeded", exit_code=0)
    store.close_intervals(c.id)
    store.update_cluster(c.id, status="terminated", terminated_at=time.time())
    store.close()
    d = archive.job_dir(home, c.id, job_id)
    (d / "metrics").mkdir(parents=True)
    for rank in range(4):
        with open(d / "metrics" / f"rank-{rank}.jsonl", "w") as f:
            for s in range(steps):
                rec: dict[str, float] = {"t": round(t0 + 30 + s * 0.05, 3), "step": s, "rank": rank,
                                         "loss": 4.0 / (1 + s / 500) + 0.01 * rank}
                if rank == 0:
                    rec.update(lr=3e-4 * min(1.0, s / 1000), grad_norm=1.0 + (s % 97) / 97, tok_s=9000.0 + s % 311)
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    (d / "telemetry").mkdir()
    for node in range(2):
        with open(d / "telemetry" / f"node-{node}.jsonl", "w") as f:
            for i in range(int(steps * 0.05 / 5)):
                for gpu in range(2):
                    f.write(json.dumps({"t": t0 + 30 + 5 * i, "gpu": gpu, "util": 90 + i % 10,
                                        "mem_used": 2e10, "mem_total": 2.4e10}) + "\n")
    archive.record_event(home, c.id, "recovery", t=t0 + 30 + steps * 0.025, node=1, job=job_id, msg="preempted")
    return "bench", str(d)


def timed(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, env=env, timeout=120)
    return time.perf_counter() - start, r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gtrain-bench-report-") as tmp:
        home = Path(tmp) / "home"
        name, folder = make_run(home, a.points)
        n_points = sum(len(json.loads(line)) - 3 for p in Path(folder, "metrics").glob("*.jsonl")
                       for line in p.read_text().splitlines())
        env = {**os.environ, "GTRAIN_HOME": str(home), "PYTHONPATH": str(HERE.parent), "NO_COLOR": "1",
               "COLUMNS": "120", "LINES": "32"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: byte-compiled (a warm-up run writes the .pyc)
        cold, r = timed(["report", name, "--out", str(Path(tmp) / "cold.html")], env)  # first: parses every line
        if r.returncode != 0:
            print(r.stderr)
            return 1
        out = Path(tmp) / "report.html"
        report_s, plot_s = [], []
        for _ in range(a.repeat):
            s, r = timed(["report", name, "--out", str(out)], env)
            if r.returncode != 0:
                print(r.stderr)
                return 1
            report_s.append(s)
            s, r = timed(["plot", name, "--metric", "loss"], env)
            if r.returncode != 0 or "┌" not in r.stdout:
                print(r.stderr)
                return 1
            plot_s.append(s)
        size = out.stat().st_size
    res = {"points": n_points, "report_first_s": round(cold, 3),
           "report_s": round(statistics.median(report_s), 3), "report_bytes": size,
           "plot_first_frame_s": round(statistics.median(plot_s), 3), "repeat": a.repeat, "cpus": os.cpu_count()}
    ok = max(cold, res["report_s"]) <= 2.0 and size <= 2 * 2**20 and res["plot_first_frame_s"] <= 0.5
    print(f"{'points':>8}{'1st report s':>14}{'report s':>10}{'report MB':>11}{'plot s':>9}"
          "   targets: <= 2 s, <= 2 MB, <= 0.5 s")
    print(f"{n_points:>8}{cold:>14.3f}{res['report_s']:>10.3f}{size / 2**20:>11.3f}{res['plot_first_frame_s']:>9.3f}"
          f"   {'ok' if ok else 'OVER TARGET'}")
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "report.json").write_text(json.dumps(res, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
