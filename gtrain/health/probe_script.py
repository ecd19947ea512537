"""The health job's script: torchrun starts it on every rank (one rank per GPU; one per CPU node). Not imported
by gtrain: its source is copied into a temporary workdir and run as a job through the cluster's job backend.

1. All-reduce bus bandwidth per message size, like nccl-tests (NCCL on GPUs, gloo on CPU):
   ``algbw = bytes / time``, ``busbw = algbw * 2(n-1)/n``.
2. Silent data corruption, on this rank's device:
   - an exact GEMM: integer-valued fp32 matrices (every product and sum exact in fp32), checked on the device by
     its row and column checksums (ABFT: ``e^T (A B) = (e^T A) B``) -- a wrong result is caught on the device
     itself, without a peer; and its digest, the same bits on every correct device of any kind;
   - a training-like GEMM chain (random normal inputs from a fixed seed, deterministic algorithms, TF32 off),
     whose digest must match every other device of the same model.
   ``--seconds S`` (``--full``) repeats both for S seconds with all-reduces between (under load); each
   repetition must give the first one's digest.
Each rank prints one line ``GTRAIN_HEALTH {json}`` and exits 0; a rank that cannot run prints its error there.
``--fault node:K[:gpu:I]`` (tests only: ``GTRAIN_HEALTH_FAULT``) adds 1 to one element of the results on node K
(local rank I, default 0), as a broken multiplier would.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import socket
import sys
import time
from typing import Any

TAG = "GTRAIN_HEALTH "


def _digest(torch: Any, t: Any) -> str:
    data = t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def _ints(torch: Any, n: int, seed: int) -> Any:
    """An n x n matrix of integers in [-3, 3] from integer hashing: the same on every machine and torch
    version (torch's RNG need not be)."""
    i = torch.arange(n * n, dtype=torch.int64)
    h = (i * 2654435761 + seed * 40503) % 2147483647
    h = (h * 48271) % 2147483647
    return (h % 7 - 3).to(torch.float32).reshape(n, n)


def _faulty(spec: str, node: int, local: int) -> bool:
    parts = spec.split(":") if spec else []
    if len(parts) < 2 or parts[0] != "node" or not parts[1].isdigit():
        return False
    gpu = int(parts[3]) if len(parts) >= 4 and parts[2] == "gpu" and parts[3].isdigit() else 0
    return int(parts[1]) == node and gpu == local


def sdc(torch: Any, device: Any, n: int, reps: int, fault: bool) -> dict[str, Any]:
    if device.type == "cuda":
        # (on CPU, one thread's GEMMs are deterministic already, and this call costs seconds of imports there)
        torch.use_deterministic_algorithms(True)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    a, b = _ints(torch, n, 1).to(device), _ints(torch, n, 2).to(device)
    c = a @ b
    if fault:
        c[0, 0] += 1
    abft_ok = bool(torch.equal(c.sum(0), a.sum(0) @ b) and torch.equal(c.sum(1), a @ b.sum(1)))
    exact = _digest(torch, c)
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, n, generator=gen).to(device)
    w = (torch.randn(n, n, generator=gen) / n ** 0.5).to(device)
    for _ in range(reps):
        x = torch.tanh(x @ w)
    if fault:
        x[0, 0] += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"abft_ok": abft_ok, "exact": exact, "float": _digest(torch, x)}


def allreduce(torch: Any, dist: Any, device: Any, sizes_mb: list[int], iters: int) -> list[dict[str, float]]:
    world = dist.get_world_size()
    out = []
    for mb in sizes_mb:
        numel = max(1, int(mb * 1e6 / 4))
        t = torch.ones(numel, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = (time.perf_counter() - t0) / iters
        algbw = numel * 4 / dt / 1e9
        out.append({"bytes": numel * 4, "time_us": round(dt * 1e6, 1), "algbw_gbs": round(algbw, 3),
                    "busbw_gbs": round(algbw * 2 * (world - 1) / world, 3) if world > 1 else 0.0})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--fault", default="")
    args = ap.parse_args(argv)
    node, local = int(os.environ.get("GTRAIN_NODE_RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    doc: dict[str, Any] = {"node": node, "local_rank": local, "rank": int(os.environ.get("RANK", "0")),
                           "hostname": socket.gethostname()}
    try:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        torch = importlib.import_module("torch")
        dist = importlib.import_module("torch.distributed")
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", local) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
            props = torch.cuda.get_device_properties(device)
            doc.update(device="cuda", index=local, model=props.name, uuid=str(getattr(props, "uuid", "") or ""))
        else:
            torch.set_num_threads(1)  # one thread: CPU GEMMs give the same bits on every node of a CPU type
            model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo", encoding="utf-8")
                          if ln.startswith("model name")), "cpu")
            doc.update(device="cpu", index=None, model=model, uuid="")
        dist.init_process_group("nccl" if cuda else "gloo")
        doc["backend"] = dist.get_backend()
        doc["world"] = dist.get_world_size()
        sizes = [8, 64, 256] if cuda else [1, 8]
        if args.seconds:
            sizes = [8, 64, 256, 1024] if cuda else [1, 8, 32]
        doc["allreduce"] = allreduce(torch, dist, device, sizes, 20 if cuda else 5)
        n, reps = (4096, 8) if cuda else (256, 4)
        fault = _faulty(args.fault, node, local)
        first = sdc(torch, device, n, reps, fault)
        runs, drift = 1, 0
        end = time.time() + args.seconds
        while time.time() < end:
            again = sdc(torch, device, n, reps, fault)
            runs += 1
            drift += int(again != first)
            dist.all_reduce(torch.ones(1 << 20, device=device))
        doc["sdc"] = {**first, "n": n, "reps": reps, "runs": runs, "drift": drift}
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported to the checks, which name the node
        doc["error"] = f"{type(e).__name__}: {e}"
    print(TAG + json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
