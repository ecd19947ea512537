"""Telemetry cost benchmark (not a test): what the GPU sampler beside a job costs the job.

    .venv/bin/python bench/bench_health.py [--seconds 20] [--rounds 3]

1. steps/s of a tiny CPU training loop (a 2-layer MLP, 1 thread) with and without the sampler running beside it
   at its real interval (10 s), alternating A/B rounds (medians). The sampler is the one the launch script
   carries (rendered from templates/_telemetry.sh.j2), sampling the stub nvidia-smi of tests/fixtures (8 GPUs).
2. The sampler's own CPU time per sample, measured at a 0.25 s interval, as a share of one core at 10 s:
   the figure that does not drown in the noise of a shared machine.
Target: < 1 % either way. Prints a table and writes bench/results/health.json; exit 1 when (2) misses it.
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

from gtrain.jobs.render import NodeContext, render  # noqa: E402

STUB = HERE.parent / "tests" / "fixtures" / "nvidia_smi" / "nvidia-smi"
TRAIN = """
import sys, time, torch
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
end, steps = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step(); steps += 1
print(steps / float(sys.argv[1]))
"""


def sampler_source() -> str:
    ctx = NodeContext(job_id="bench", cluster="bench", node_rank=0, num_nodes=1, node_ips=["127.0.0.1"],
                      node_addr="127.0.0.1", master_addr="127.0.0.1", master_port=29500, nproc_per_node=1,
                      job_dir="/tmp/j", workdir="/tmp/w", checkpoint_dir="/tmp/w/c", python=sys.executable, argv=["t"])
    text = render("launch.sh", ctx)
    return text.split("<<'__GTRAIN_TELEMETRY__' &\n", 1)[1].split("\n__GTRAIN_TELEMETRY__", 1)[0]


def start_sampler(src: str, out: Path, interval: float, env: dict[str, str]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-", str(out), str(interval), str(os.getpid()), "34560"],
                         stdin=subprocess.PIPE, env=env)
    assert p.stdin is not None
    p.stdin.write(src.encode())
    p.stdin.close()
    return p


def steps_per_s(seconds: float, env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-c", TRAIN, str(seconds)], capture_output=True, text=True, env=env,
                         check=True).stdout
    return float(out.strip())


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and its reaped children (nvidia-smi calls), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    src = sampler_source()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GTRAIN_NVIDIA_SMI": str(STUB), "GTRAIN_SMI_FIXTURE": "a100_8_healthy",
               "OMP_NUM_THREADS": "1"}
        off, on = [], []
        for _ in range(args.rounds):
            off.append(steps_per_s(args.seconds, env))
            s = start_sampler(src, Path(tmp) / "t.jsonl", 10, env)
            on.append(steps_per_s(args.seconds, env))
            s.terminate()
            s.wait()
        # the sampler's own cost per sample
        out = Path(tmp) / "fast.jsonl"
        s = start_sampler(src, out, 0.25, env)
        time.sleep(10)
        cpu = cpu_seconds(s.pid)
        samples = len(out.read_text().splitlines()) // 8
        s.terminate()
        s.wait()
    per_sample = cpu / max(samples, 1)
    share_10s = per_sample / 10
    slowdown = 1 - statistics.median(on) / statistics.median(off)
    print(f"{'':<28}{'steps/s (median)':>18}")
    print(f"{'without sampler':<28}{statistics.median(off):>18.1f}   rounds {[round(x, 1) for x in off]}")
    print(f"{'with sampler (10 s)':<28}{statistics.median(on):>18.1f}   rounds {[round(x, 1) for x in on]}")
    print(f"steps/s change with the sampler: {-slowdown:+.2%} (noise of a shared machine included)")
    print(f"sampler CPU: {per_sample * 1e3:.1f} ms per sample of 8 GPUs ({samples} samples) "
          f"-> {share_10s:.3%} of one core at 10 s; target < 1%")
    results = {"steps_per_s_without": off, "steps_per_s_with": on, "slowdown": slowdown,
               "sampler_cpu_s_per_sample": per_sample, "sampler_share_of_core_at_10s": share_10s,
               "samples": samples, "ok": share_10s < 0.01}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "health.json").write_text(json.dumps(results, indent=2))
    return 0 if share_10s < 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
