"""Benchmark of the gtrain CLI itself (not a test).

    .venv/bin/python bench/bench_cli.py [--runs 20] [--launch-runs 5] [--out bench/results/cli.json]

a) wall time of ``gtrain --help`` and ``gtrain status`` (isolated GTRAIN_HOME holding a few local clusters)
   against ``python -c pass`` as the floor; ``sky``, ``dstack`` and ``torchx`` ``--help`` when installed;
   ``gtrain up --help`` (a command that goes through Typer); the target is 100 ms for ``--help`` and
   ``status``, shown next to ``torchx --help`` when installed, else next to the floor;
b) ``python -X importtime`` of ``gtrain --help`` and ``gtrain status``: no cloud SDK, paramiko, torch, pydantic
   or jinja2, and (the fast path) no typer, click or rich;
c) launch overhead: ``gtrain launch --wait`` of a 1-node x 1-process gloo job on an already-up local cluster
   against the same ``torch.distributed.run`` command started by hand; target <= 1 s added (medians).

Every figure is a median over the given number of runs (one unmeasured warm-up run first). Prints a table
and writes the raw samples and medians to bench/results/cli.json. Everything it makes (clusters, temp
dirs) is removed at the end, also on failure or Ctrl+C.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PY = sys.executable
GTRAIN = str(Path(PY).parent / "gtrain")

FORBIDDEN = ("boto3", "botocore", "paramiko", "torch", "google.cloud", "google.api_core", "pydantic", "jinja2",
             "typer", "click", "rich")
TARGET_STARTUP_MS = 100.0
OTHER_TOOLS = (("sky", "sky"), ("dstack", "dstack"), ("torchx", "torchx"))  # (executable, module)
STATUS_CLUSTERS = (("bench-s1", 1), ("bench-s2", 2), ("bench-s3", 1))
LAUNCH_CLUSTER = "bench-launch"
TARGET_OVERHEAD_MS = 1000.0

TINY_JOB = """\
import torch.distributed as dist

dist.init_process_group("gloo")
dist.destroy_process_group()
"""


def run_cmd(cmd: Sequence[str], env: dict[str, str], cwd: str | None = None, check: bool = True,
            timeout: float = 600) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    """Run ``cmd`` to completion; return its wall time in seconds and the finished process."""
    t0 = time.perf_counter()
    p = subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, timeout=timeout)
    dt = time.perf_counter() - t0
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr.decode(errors='replace')[-2000:]}")
    return dt, p


def sample(cmd: Sequence[str], env: dict[str, str], runs: int, cwd: str | None = None) -> list[float]:
    run_cmd(cmd, env, cwd)  # warm-up: .pyc files, page cache
    return [run_cmd(cmd, env, cwd)[0] for _ in range(runs)]


def ms(samples: Sequence[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def imported_modules(cmd: Sequence[str], env: dict[str, str]) -> list[str]:
    """Names of every module ``cmd`` (a python -X importtime command line) imports, in import order."""
    _, p = run_cmd(cmd, env)
    mods = []
    for line in p.stderr.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                mods.append(name)
    return mods


def forbidden_in(mods: Sequence[str]) -> list[str]:
    return sorted({m for m in mods for f in FORBIDDEN if m == f or m.startswith(f + ".")})


def write_spec(path: Path, name: str, nodes: int, job: dict[str, Any] | None = None) -> None:
    lines = [f"name: {name}", "provider: local", f"num_nodes: {nodes}"]
    if job:
        lines.append("job:")
        lines += [f"  {k}: {json.dumps(v)}" for k, v in job.items()]
    path.write_text("\n".join(lines) + "\n")


def bench_startup(env: dict[str, str], runs: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    res["python -c pass"] = sample([PY, "-c", "pass"], env, runs)
    res["gtrain --help"] = sample([GTRAIN, "--help"], env, runs)
    res["gtrain status"] = sample([GTRAIN, "status"], env, runs)
    res["gtrain up --help (typer)"] = sample([GTRAIN, "up", "--help"], env, runs)
    for exe, mod in OTHER_TOOLS:
        path = shutil.which(exe)
        if path is None and importlib.util.find_spec(mod) is None:
            res[f"{exe} --help"] = None
            continue
        try:
            res[f"{exe} --help"] = sample([path, "--help"] if path else [PY, "-m", mod, "--help"], env, runs)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            res[f"{exe} --help"] = f"failed: {str(e).splitlines()[0]}"
    return res


def bench_imports(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, args in (("gtrain --help", ["--help"]), ("gtrain status", ["status"])):
        mods = imported_modules([PY, "-X", "importtime", "-m", "gtrain", *args], env)
        out[label] = {"modules": len(mods), "forbidden": forbidden_in(mods)}
    return out


def bench_launch(env: dict[str, str], tmp: Path, runs: int) -> dict[str, Any]:
    workdir = tmp / "job"
    workdir.mkdir()
    (workdir / "tiny.py").write_text(TINY_JOB)
    spec = workdir / "spec.yaml"
    write_spec(spec, LAUNCH_CLUSTER, 1, {"run": "tiny.py", "nproc_per_node": 1})
    run_cmd([GTRAIN, "up", str(spec)], env)

    wait_cmd = [GTRAIN, "launch", "--cluster", LAUNCH_CLUSTER, "--wait"]
    launch_cmd = [GTRAIN, "launch", "--cluster", LAUNCH_CLUSTER]
    follow_cmd = [GTRAIN, "logs", LAUNCH_CLUSTER, "-f"]

    def by_hand() -> float:
        cmd = [PY, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
               f"--rdzv_endpoint=127.0.0.1:{free_port()}", "tiny.py"]
        return run_cmd(cmd, env, cwd=str(workdir))[0]

    # warm-up of both, then interleaved so drift of the machine hits both sides alike
    run_cmd(wait_cmd, env)
    by_hand()
    gt: list[float] = []
    hand: list[float] = []
    split_launch: list[float] = []
    split_follow: list[float] = []
    for _ in range(runs):
        gt.append(run_cmd(wait_cmd, env)[0])
        hand.append(by_hand())
        # the same job in two commands: `launch` (returns once started) and `logs -f` (returns at its end)
        split_launch.append(run_cmd(launch_cmd, env)[0])
        split_follow.append(run_cmd(follow_cmd, env)[0])
    return {"gtrain launch --wait": gt, "torchrun by hand": hand, "gtrain launch (detached)": split_launch,
            "gtrain logs -f (to job end)": split_follow}


def cleanup(env: dict[str, str], names: Sequence[str]) -> list[str]:
    problems = []
    for name in names:
        try:
            _, p = run_cmd([GTRAIN, "down", name, "--yes"], env, check=False, timeout=300)
            # exit 2 = no such cluster (never made): nothing to clean
            if p.returncode not in (0, 2):
                problems.append(f"gtrain down {name} exited {p.returncode}")
        except subprocess.TimeoutExpired:
            problems.append(f"gtrain down {name} timed out")
    return problems


def fmt(v: Any) -> str:
    if v is None:
        return "not installed"
    if isinstance(v, str):
        return v
    return f"{ms(v):.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="runs of each fast command (default 20)")
    ap.add_argument("--launch-runs", type=int, default=5, help="runs of each launch variant (default 5)")
    ap.add_argument("--out", default=str(HERE / "results" / "cli.json"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gtrain-bench-cli-"))
    home = tmp / "home"
    env = {**os.environ, "GTRAIN_HOME": str(home), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    # as installed: byte-compiled. Some environments set PYTHONDONTWRITEBYTECODE, and then every start
    # compiles gtrain's modules from source again (~30 ms of `gtrain status` here): not what a user runs.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "gtrain"), quiet=1)
    env.pop("GTRAIN_DEBUG", None)
    made: list[str] = []
    results: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
        "runs": args.runs, "launch_runs": args.launch_runs,
    }
    problems: list[str] = []
    try:
        specs = tmp / "specs"
        specs.mkdir()
        for name, nodes in STATUS_CLUSTERS:
            write_spec(specs / f"{name}.yaml", name, nodes)
            made.append(name)
            run_cmd([GTRAIN, "up", str(specs / f"{name}.yaml")], env)

        print(f"a) start-up: {args.runs} runs each, GTRAIN_HOME with {len(STATUS_CLUSTERS)} clusters ...",
              flush=True)
        startup = bench_startup(env, args.runs)
        results["startup_s"] = startup
        results["startup_median_ms"] = {k: (ms(v) if isinstance(v, list) else v) for k, v in startup.items()}

        print("b) imports (python -X importtime -m gtrain ...) ...", flush=True)
        imports = bench_imports(env)
        results["imports"] = imports

        if importlib.util.find_spec("torch") is None:
            results["launch"] = "skipped: torch is not installed in this interpreter"
        else:
            print(f"c) launch overhead: {args.launch_runs} runs each ...", flush=True)
            made.append(LAUNCH_CLUSTER)
            launch = bench_launch(env, tmp, args.launch_runs)
            med = {k: ms(v) for k, v in launch.items()}
            overhead = round(med["gtrain launch --wait"] - med["torchrun by hand"], 1)
            results["launch_s"] = launch
            results["launch_median_ms"] = med
            results["launch_overhead_ms"] = overhead
            # the fastest run of each is less sensitive to other load on the machine than the median
            results["launch_overhead_min_ms"] = round(
                (min(launch["gtrain launch --wait"]) - min(launch["torchrun by hand"])) * 1000, 1)
            results["launch_overhead_target_ms"] = TARGET_OVERHEAD_MS
    finally:
        problems += cleanup(env, made)
        shutil.rmtree(tmp, ignore_errors=True)
    results["cleanup_problems"] = problems

    # ---- report -------------------------------------------------------------------------------------
    floor = results["startup_median_ms"]["python -c pass"]
    print()
    print(f"{'command':<32}{'median ms':>12}{'over floor':>13}")
    for k, v in startup.items():
        over = f"{ms(v) - floor:+.1f}" if isinstance(v, list) else ""
        print(f"{k:<32}{fmt(v):>12}{over:>13}")
    ref = "torchx --help" if isinstance(startup.get("torchx --help"), list) else "python -c pass"
    for k in ("gtrain --help", "gtrain status"):
        v = ms(startup[k])
        verdict = "ok" if v <= TARGET_STARTUP_MS else "OVER TARGET"
        print(f"{k:<32}{v:>12.1f}  (target <= {TARGET_STARTUP_MS:.0f} ms: {verdict}; {ref}: {ms(startup[ref]):.1f})")
    results["startup_target_ms"] = TARGET_STARTUP_MS
    print()
    bad = False
    for label, r in imports.items():
        found = r["forbidden"]
        verdict = "IMPORTS " + ", ".join(found) if found else "ok: none of " + ", ".join(FORBIDDEN)
        bad = bad or bool(found)
        print(f"{label:<32}{r['modules']:>5} modules  {verdict}")
    if isinstance(results.get("launch_median_ms"), dict):
        print()
        print(f"{'launch (1 node x 1 proc, gloo)':<32}{'median ms':>12}")
        for k, v in results["launch_median_ms"].items():
            print(f"{k:<32}{v:>12.1f}")
        over = results["launch_overhead_ms"]
        verdict = "ok" if over <= TARGET_OVERHEAD_MS else "OVER TARGET"
        print(f"{'added by gtrain':<32}{over:>12.1f}  (target <= {TARGET_OVERHEAD_MS:.0f} ms: {verdict})")
        print(f"{'added, fastest runs':<32}{results['launch_overhead_min_ms']:>12.1f}")
    else:
        print(results["launch"])
    for p in problems:
        print(f"cleanup: {p}", file=sys.stderr)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {out}")
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
