"""GPU acceptance check, run by ``bench/gpu_check.sh`` (see bench/README.md, "gpu_check.sh"): on this machine's
GPUs, through gtrain's CLI on the ``local`` provider, in a throw-away GTRAIN_HOME:

1. ``allreduce``: an NCCL all-reduce sweep (1 MiB .. 1 GiB) across 2 local "nodes" x (GPUs / 2) ranks (1 x 1
   on a 1-GPU machine: NCCL refuses two ranks on one GPU), bus bandwidth per size as nccl-tests counts it
   (algbw x 2(n-1)/n), a correctness sum, then ``--load`` seconds of GEMMs + all-reduces so the telemetry
   sampler reads real power;
2. ``telemetry``: ``gtrain status CLUSTER --gpus --json`` during that load (every GPU with a power reading) and
   after it, with the job's energy from those readings (``energy.kwh``);
3. ``health``: ``gtrain health CLUSTER --full --json`` on a 1-node cluster of every GPU (the all-reduce
   sweep, the GEMM digests -- the SDC probe -- repeated under load for 60 s);
4. ``container``: where docker answers, ``docker run`` with gtrain's own argv (``--gpus all``, host network,
   IPC and PID) of a local image (``GPUCHECK_IMAGE``, else the first one ``docker images`` lists; nothing is
   pulled) running ``nvidia-smi -L``: the same GPUs seen inside.

Writes ``bench/results/gpu.json`` (or ``GPUCHECK_OUT``). No GPU (no ``nvidia-smi``, or it lists none): one line
saying so, ``{"gpu": false}`` written, exit 0. Exit 1 when a step failed on a GPU machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("GPUCHECK_OUT") or ROOT / "bench" / "results" / "gpu.json")
LOAD_S = float(os.environ.get("GPUCHECK_LOAD_S") or 40)

ALLREDUCE = r'''
import json, os, sys, time
import torch
import torch.distributed as dist

out, load_s = sys.argv[1], float(sys.argv[2])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", rank % torch.cuda.device_count())  # 2 local "nodes": node 1's ranks take the next GPUs
torch.cuda.set_device(dev)
dist.init_process_group("nccl")
free, _ = torch.cuda.mem_get_info()
sweep = []
for mib in (1, 8, 64, 256, 1024):
    nbytes = mib << 20
    if nbytes * 3 > free:
        break
    x = torch.zeros(nbytes // 4, device=dev)
    for _ in range(5):
        dist.all_reduce(x)
    iters = 20 if mib <= 64 else 10
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t = torch.tensor([(time.perf_counter() - t0) / iters], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time
    alg = nbytes / t.item() / 1e9
    sweep.append({"bytes": nbytes, "seconds": t.item(), "algbw_gbps": round(alg, 2),
                  "busbw_gbps": round(alg * 2 * (world - 1) / world, 2)})
    del x
y = torch.full((1024,), float(rank + 1), device=dev)
dist.all_reduce(y)
correct = bool((y == world * (world + 1) / 2).all().item())
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
end, loops = time.time() + load_s, 0
while time.time() < end:  # load: the telemetry sampler reads the power it draws
    for _ in range(8):
        b = a @ a
    dist.all_reduce(b[:256])
    torch.cuda.synchronize()
    loops += 1
print(f"rank {rank}: all-reduce {'correct' if correct else 'WRONG'}; "
      f"busbw {sweep[-1]['busbw_gbps'] if sweep else '-'} GB/s at {sweep[-1]['bytes'] >> 20 if sweep else '-'} MiB",
      flush=True)
if rank == 0:
    with open(out, "w") as f:
        json.dump({"world": world, "nodes": int(os.environ.get("GTRAIN_NUM_NODES") or 0) or None,
                   "backend": dist.get_backend(), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                   "torch": torch.__version__, "correct": correct, "sweep": sweep, "load_loops": loops}, f)
dist.destroy_process_group()
sys.exit(0 if correct else 1)
'''


def say(msg: str) -> None:
    print(f"gpu_check: {msg}", flush=True)


def write(doc: dict[str, Any]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    say(f"results -> {OUT}")


def gpus() -> tuple[list[dict[str, Any]], str]:
    """This machine's GPUs from nvidia-smi, or [] and why there are none."""
    smi = os.environ.get("GPUCHECK_NVIDIA_SMI") or shutil.which("nvidia-smi")
    if not smi or not Path(smi).exists():
        return [], "nvidia-smi not found"
    try:
        res = subprocess.run([smi, "--query-gpu=index,name,memory.total,power.draw,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi did not answer: {e}"
    rows = [[c.strip() for c in ln.split(",")] for ln in res.stdout.splitlines() if ln.count(",") >= 4]
    if res.returncode != 0 or not rows:
        why = (res.stdout + res.stderr).strip().splitlines()
        return [], f"nvidia-smi lists no GPU (exit {res.returncode}{': ' + why[0] if why else ''})"
    return [{"index": int(r[0]), "name": r[1], "memory_mib": r[2], "power_w": r[3], "driver": r[4]}
            for r in rows], ""


def gtrain(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True,
                             timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        res = subprocess.CompletedProcess(e.cmd, 124, str(e.stdout or ""), f"timed out after {timeout:.0f} s")
    say(f"gtrain {' '.join(args)}: exit {res.returncode} ({time.monotonic() - t0:.1f} s)")
    return res


def tail(res: subprocess.CompletedProcess[str]) -> str:
    return (res.stdout + res.stderr)[-2000:]


def spec(tmp: Path, name: str, nodes: int, nproc: int, run: str) -> Path:
    doc = {"name": name, "provider": "local", "num_nodes": nodes,
           "job": {"workdir": str(tmp / "work"), "run": run, "nproc_per_node": nproc,
                   "env": {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "1"}}}
    p = tmp / f"{name}.yaml"
    p.write_text(json.dumps(doc))
    return p


def allreduce_and_telemetry(tmp: Path, env: dict[str, str], n_gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    nodes = 2 if n_gpus >= 2 else 1
    nproc = n_gpus // nodes
    result = tmp / "allreduce.json"
    s = spec(tmp, "gpucheck-ar", nodes, nproc, f"allreduce.py {result} {LOAD_S:g}")
    step: dict[str, Any] = {"nodes": nodes, "nproc_per_node": nproc, "ok": False}
    tele: dict[str, Any] = {"ok": False}
    up = gtrain("up", str(s), env=env, timeout=120)
    if up.returncode != 0:
        step["error"] = tail(up)
        return step, tele
    launch = gtrain("launch", str(s), "--cluster", "gpucheck-ar", env=env, timeout=120)
    if launch.returncode != 0:
        step["error"] = tail(launch)
        return step, tele
    t0 = time.monotonic()
    during: dict[str, Any] = {}
    while time.monotonic() - t0 < LOAD_S + 120:  # sample while the load runs (once its power shows)
        time.sleep(5)
        st = gtrain("status", "gpucheck-ar", "--gpus", "--json", env=env, timeout=60)
        try:
            during = json.loads(st.stdout)
        except ValueError:
            continue
        powered = [g for g in during.get("gpus") or [] if _num(g.get("power")) not in (None, 0.0)]
        if len(powered) >= n_gpus or time.monotonic() - t0 > LOAD_S - 5:
            break
    wait = gtrain("logs", "gpucheck-ar", "-f", env=env, timeout=LOAD_S + 240)
    step["exit"] = wait.returncode
    step["log_tail"] = wait.stdout[-1500:]
    if result.exists():
        step.update(json.loads(result.read_text()))
    step["ok"] = wait.returncode == 0 and bool(step.get("correct")) and bool(step.get("sweep"))
    if step.get("sweep"):
        step["busbw_gbps_max"] = max(x["busbw_gbps"] for x in step["sweep"])
    after = gtrain("status", "gpucheck-ar", "--gpus", "--json", env=env, timeout=60)
    try:
        doc = json.loads(after.stdout)
    except ValueError:
        doc = {"error": tail(after)}
    gpus_during = during.get("gpus") or []
    energy = doc.get("energy") or {}
    per_node = energy.get("nodes") or [{}]
    tele.update(during=gpus_during, energy=energy,
                gpus_with_power=sum(_num(g.get("power")) not in (None, 0.0) for g in gpus_during),
                # local "nodes" share the machine and each samples every GPU: the machine's is one node's figure
                kwh=per_node[0].get("kwh"))
    tele["ok"] = tele["gpus_with_power"] >= 1 and bool(tele["kwh"]) and not energy.get("estimate")
    return step, tele


def _num(cell: Any) -> float | None:
    try:
        return float(str(cell).split()[0].rstrip("W%"))
    except (ValueError, IndexError):
        return None


def health(tmp: Path, env: dict[str, str], n_gpus: int) -> dict[str, Any]:
    s = spec(tmp, "gpucheck-h", 1, n_gpus, "allreduce.py /dev/null 0")
    up = gtrain("up", str(s), env=env, timeout=120)
    if up.returncode != 0:
        return {"ok": False, "error": tail(up)}
    res = gtrain("health", "gpucheck-h", "--full", "--json", env=env, timeout=300)
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        return {"ok": False, "exit": res.returncode, "error": tail(res)}
    checks = {c["name"] if c["node"] is None else f"{c['name']}[{c['node']}]": {
        k: c.get(k) for k in ("verdict", "figure", "reason")} for c in doc.get("checks") or []}
    sdc = [v for k, v in checks.items() if k.startswith("sdc.")]
    return {"ok": res.returncode == 0 and bool(sdc) and all(v["verdict"] == "ok" for v in sdc),
            "exit": res.returncode, "verdict": doc.get("verdict"), "seconds": doc.get("seconds"), "checks": checks}


def container(n_gpus: int) -> dict[str, Any]:
    docker = shutil.which("docker")
    if not docker:
        return {"skipped": "docker not found"}
    try:
        info = subprocess.run([docker, "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True,
                              timeout=30)
        images = subprocess.run([docker, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                                text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"skipped": f"docker did not answer: {e}"}
    if info.returncode != 0:
        return {"skipped": f"docker daemon not reachable: {info.stderr.strip()[:300]}"}
    local = [i for i in images.stdout.split() if not i.endswith(":<none>")]
    image = os.environ.get("GPUCHECK_IMAGE") or (local[0] if local else "")
    if not image:
        return {"skipped": "no local image (set GPUCHECK_IMAGE; nothing is pulled)"}
    from gtrain.containers.runtime import run_argv
    from gtrain.spec import Job

    argv = run_argv(Job(run="x", image=image), cluster="gpucheck", job_id="c", node_rank=0, gpus=True, mounts=[],
                    workdir="/")
    argv = [a for a in argv if a != "-i"] + ["nvidia-smi", "-L"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"ok": False, "image": image, "argv": argv, "error": "timed out after 180 s"}
    seen = [ln for ln in res.stdout.splitlines() if ln.startswith("GPU ")]
    return {"ok": res.returncode == 0 and len(seen) == n_gpus, "image": image, "argv": argv, "gpus_seen": len(seen),
            "exit": res.returncode, "output": (res.stdout + res.stderr)[-1000:]}


def _stopped(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # the time limit (gpu_check.sh's timeout): clusters down, results written


def main() -> int:
    import signal

    signal.signal(signal.SIGTERM, _stopped)
    t0 = time.monotonic()
    found, why = gpus()
    if not found:
        say(f"no GPU: {why}; nothing to check (exit 0)")
        write({"gpu": False, "reason": why, "at": time.time()})
        return 0
    say(f"{len(found)} GPU(s): {', '.join(sorted({g['name'] for g in found}))}; driver {found[0]['driver']}")
    doc: dict[str, Any] = {"gpu": True, "gpus": found, "at": time.time(), "steps": {}}
    try:
        import torch
    except ImportError:
        say(f"torch is not importable by {sys.executable}: install a CUDA build of torch there (see "
            "bench/README.md, gpu_check.sh); nothing else was checked")
        doc["steps"]["torch"] = {"ok": False, "error": "torch not importable"}
        write(doc)
        return 1
    doc["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "devices": torch.cuda.device_count()}
    with tempfile.TemporaryDirectory(prefix="gtrain-gpucheck-") as d:
        tmp = Path(d)
        (tmp / "work").mkdir()
        (tmp / "work" / "allreduce.py").write_text(ALLREDUCE)
        env = {**os.environ, "GTRAIN_HOME": str(tmp / "home"), "NO_COLOR": "1", "GTRAIN_TELEMETRY_INTERVAL": "2",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        steps = doc["steps"]
        try:
            steps["allreduce"], steps["telemetry"] = allreduce_and_telemetry(tmp, env, len(found))
            steps["health"] = health(tmp, env, len(found))
            steps["container"] = container(len(found))
        except SystemExit as e:
            doc["stopped"] = f"stopped by a signal (exit {e.code}): the time limit; steps not reached are missing"
            say(doc["stopped"])
            steps.setdefault("limit", {"ok": False})
        finally:
            for name in ("gpucheck-ar", "gpucheck-h"):
                gtrain("down", name, "--yes", env=env, timeout=60)
    doc["seconds"] = round(time.monotonic() - t0, 1)
    failed = [k for k, v in doc["steps"].items() if v.get("ok") is False]
    doc["ok"] = not failed
    ar, tele, h = (doc["steps"].get(k, {}) for k in ("allreduce", "telemetry", "health"))
    say(f"all-reduce: {ar.get('world')} rank(s) on {ar.get('nodes')} node(s), busbw max "
        f"{ar.get('busbw_gbps_max')} GB/s, {'correct' if ar.get('correct') else 'NOT correct'}")
    say(f"telemetry: {tele.get('gpus_with_power')} GPU(s) with power readings; energy {tele.get('kwh')} kWh")
    say(f"health --full: {h.get('verdict')} ({h.get('seconds')} s)")
    c = doc["steps"].get("container", {})
    say(f"container: {c.get('skipped') or ('ok' if c.get('ok') else 'FAILED')}")
    say(f"{'ok' if not failed else 'FAILED: ' + ', '.join(failed)} in {doc['seconds']} s")
    write(doc)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
