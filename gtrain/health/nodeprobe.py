"""Functions that run ON a node for the health checks and the telemetry, stdlib only (a node has python3,
not gtrain). Shipped like :mod:`gtrain.remote.nodeside`: the runner sends this file's source on stdin
(``python3 - FUNC ARGS…``) and reads one JSON document back (:func:`gtrain.health.probe.call_node`).

Nothing here interprets what it reads: the raw ``nvidia-smi`` CSV goes back as text and is parsed (and judged)
on the gtrain side (:mod:`gtrain.health.gpu`), so a parser fix never needs a node update.

The telemetry sampler itself lives in ``templates/_telemetry.sh.j2`` (it must be on the node before any
call: the launch script carries it); :func:`telemetry` reads what it wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

#: what `gtrain health` asks of every GPU (``nvidia-smi --help-query-gpu`` names)
HEALTH_FIELDS = (
    "index", "name", "serial", "uuid", "pci.bus_id", "driver_version", "persistence_mode", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count", "retired_pages.pending",
    "remapped_rows.pending", "remapped_rows.failure", "clocks_throttle_reasons.active",
    "temperature.gpu", "power.draw", "memory.used", "memory.total", "utilization.gpu",
)
#: the fields every driver since 2015 knows, asked when the full list is refused (an old driver)
BASIC_FIELDS = ("index", "name", "serial", "uuid", "driver_version", "persistence_mode", "memory.total")
#: the fault-injection switch (tests only): ``GTRAIN_HEALTH_FAULT=node:K`` makes node K's GEMM digest differ
FAULT_ENV = "GTRAIN_HEALTH_FAULT"
#: a stub or a non-standard install can be named instead of the one on PATH
SMI_ENV = "GTRAIN_NVIDIA_SMI"


def _smi() -> str | None:
    return os.environ.get(SMI_ENV) or shutil.which("nvidia-smi")


def _run(argv: list[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except (OSError, subprocess.SubprocessError) as e:
        return 127, "", f"{type(e).__name__}: {e}"


def gpu_query() -> dict[str, object]:
    """``nvidia-smi --query-gpu=… --format=csv`` (header kept: it names the columns and their units), the
    CUDA version from the head of ``nvidia-smi -q``, and the GPU device files. No nvidia-smi: ``present`` false."""
    smi = _smi()
    devs = sorted(d for d in _listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit())
    if smi is None:
        return {"present": False, "devices": devs}
    asked = list(HEALTH_FIELDS)
    rc, out, err = _run([smi, f"--query-gpu={','.join(asked)}", "--format=csv"])
    dropped: list[str] = []
    # an older driver refuses the whole query for one name it lacks (remapped_rows.* before R5xx, say), with
    # `Field "remapped_rows.pending" is not a valid field to query.` on stdout and exit 2: drop that one, retry
    while rc != 0 and (bad := _invalid_field(out + err)) in asked and len(asked) > len(BASIC_FIELDS):
        asked.remove(bad)
        dropped.append(bad)
        rc, out, err = _run([smi, f"--query-gpu={','.join(asked)}", "--format=csv"])
    fields = "full" if not dropped else "partial"
    if rc != 0 and "not a valid field" in (out + err):
        rc, out, err = _run([smi, f"--query-gpu={','.join(BASIC_FIELDS)}", "--format=csv"])
        fields = "basic"
    cuda = None
    qrc, qout, _ = _run([smi, "-q"])
    for line in qout.splitlines()[:40] if qrc == 0 else []:
        key, _, value = line.partition(":")
        if key.strip() == "CUDA Version":
            cuda = value.strip()
            break
    return {"present": True, "rc": rc, "csv": out, "stderr": err[-2000:], "fields": fields, "cuda": cuda,
            "devices": devs, "dropped": dropped}


def _invalid_field(text: str) -> str | None:
    """The name in nvidia-smi's `Field "NAME" is not a valid field to query.`"""
    head, sep, _ = text.partition('" is not a valid field')
    return head.rpartition('Field "')[2] if sep else None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def xid_errors() -> dict[str, object]:
    """NVIDIA Xid lines since boot, from the kernel log (``dmesg``, else the journal); ``readable`` false
    when neither can be read here (no permission): then the count is unknown, not zero."""
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        if shutil.which(argv[0]) is None:
            continue
        rc, out, _ = _run(argv, timeout=20)
        if rc == 0 and out.strip():
            lines = [ln.strip() for ln in out.splitlines() if "NVRM: Xid" in ln]
            return {"readable": True, "source": argv[0], "count": len(lines), "lines": lines[-5:]}
    return {"readable": False}


def _store_reach(store: str, timeout: float = 5.0) -> dict[str, object]:
    """Can this node reach the checkpoint store: a TCP connection to an object store's endpoint, or a local
    folder that exists and is writable."""
    if not store:
        return {}
    scheme, sep, rest = store.partition("://")
    if not sep:
        path = os.path.expanduser(store)
        return {"store": store, "ok": os.path.isdir(path) and os.access(path, os.W_OK), "how": "writable folder"}
    hosts = {"s3": "s3.amazonaws.com", "gs": "storage.googleapis.com"}
    host, port = hosts.get(scheme, rest.split("/", 1)[0]), 443
    if scheme in ("http", "https"):
        hp = rest.split("/", 1)[0]
        host, _, p = hp.partition(":")
        port = int(p) if p.isdigit() else (443 if scheme == "https" else 80)
    if scheme == "file":
        return {"store": store, "ok": os.path.isdir(rest) and os.access(rest, os.W_OK), "how": "writable folder"}
    t0 = time.time()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
        return {"store": store, "ok": True, "how": f"tcp {host}:{port}", "ms": round((time.time() - t0) * 1e3, 1)}
    except OSError as e:
        return {"store": store, "ok": False, "how": f"tcp {host}:{port}", "error": str(e)}


def health(checkpoint_path: str, store: str = "", with_xid: str = "1") -> dict[str, object]:
    """Everything the host-side checks need from one node, in one call. ``time`` is taken last, just before
    the answer is written, so the clock offset is measured against when the answer arrives."""
    path = os.path.expanduser(checkpoint_path)
    probe = path
    while probe and not os.path.exists(probe):  # the folder may not exist yet: measure where it would be
        probe = os.path.dirname(probe)
    du = shutil.disk_usage(probe or "/")
    out: dict[str, object] = {
        "hostname": socket.gethostname(), "python": sys.version.split()[0],
        "disk": {"path": path, "free_gb": round(du.free / 1e9, 1), "total_gb": round(du.total / 1e9, 1)},
        "gpu": gpu_query(),
    }
    if with_xid == "1":
        out["xid"] = xid_errors()
    if store:
        out["store"] = _store_reach(store)
    out["time"] = time.time()
    return out


# ---- telemetry --------------------------------------------------------------------------------------

def telemetry(job_dir: str, last: str = "360", metrics: str = "", energy: str = "") -> dict[str, object]:
    """The newest ``last`` samples of every ``JOB/telemetry/*.jsonl`` on this node, and the newest two lines
    of the job's metrics file (``metrics``, when the job writes one: steps/s is read from them). With
    ``energy`` (a GPU's board power in W, or ``0``): ``energy``, every kept sample integrated (:func:`integrate`)."""
    out: dict[str, object] = {"samples": [], "metrics": []}
    tdir = os.path.join(job_dir, "telemetry")
    rows: list[object] = []
    every: list[object] = []
    for name in sorted(_listdir(tdir)):
        if name.endswith(".jsonl"):
            rows += _tail_json(os.path.join(tdir, name), int(last))
            if energy:
                every += _all_json(os.path.join(tdir, name))
    out["samples"] = rows
    if energy:
        out["energy"] = integrate(every, float(energy) or None)
    if metrics:
        out["metrics"] = [m for m in _tail_json(metrics, 2) if isinstance(m, dict)]
    return out


def _all_json(path: str) -> list[object]:
    out: list[object] = []
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


#: samples of one GPU further apart than this are not joined (the sampler's default interval is 10 s)
MAX_GAP_S = 60.0


def _num(v: object) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf"):
        return float(v)
    return None


def integrate(samples: list[object], tdp_w: float | None = None) -> dict[str, object]:
    """Energy of one node's samples (``{"t", "gpu", "power", "util"}``): per GPU, between two samples at most
    :data:`MAX_GAP_S` apart, the mean of their draws x the time between them; a sample without a draw but with
    a utilisation counts ``tdp_w`` x utilisation (``estimate``). ``joules`` None: no power data at all."""
    by_gpu: dict[int, list[tuple[float, float, bool]]] = {}
    for s in samples:
        if not isinstance(s, dict):
            continue
        t, gpu = _num(s.get("t")), s.get("gpu")
        if t is None or not isinstance(gpu, int) or isinstance(gpu, bool):
            continue
        watts, est = _num(s.get("power")), False
        util = _num(s.get("util"))
        if watts is None and tdp_w and util is not None:
            watts, est = tdp_w * max(0.0, min(util, 100.0)) / 100.0, True
        if watts is not None and watts >= 0:
            by_gpu.setdefault(gpu, []).append((t, watts, est))
    host = _host_joules([s for s in samples if isinstance(s, dict) and s.get("host") == "rapl"])
    joules, span, gap, estimate = 0.0, 0.0, 0.0, False
    for pts in by_gpu.values():
        pts.sort()
        for (t0, w0, e0), (t1, w1, e1) in zip(pts, pts[1:]):  # noqa: B905 -- pairs of one list
            dt = t1 - t0
            if dt <= 0:
                continue
            if dt > MAX_GAP_S:
                gap += dt
                continue
            joules += (w0 + w1) / 2 * dt
            estimate = estimate or e0 or e1
        span = max(span, pts[-1][0] - pts[0][0])
    return {"joules": joules if by_gpu else None, "gpus": len(by_gpu), "seconds": span, "gap_s": gap,
            "estimate": estimate, "host_joules": host}


def _host_joules(rows: list[dict[str, object]]) -> float | None:
    """CPU package energy from RAPL counter rows (``{"t", "uj": [...], "max_uj": [...]}``): the counters'
    increase between rows at most :data:`MAX_GAP_S` apart, a counter that wrapped counted through its range."""
    pts: list[tuple[float, list[int], list[int]]] = []
    for r in rows:
        t, uj, top = _num(r.get("t")), r.get("uj"), r.get("max_uj")
        if t is not None and isinstance(uj, list) and isinstance(top, list):
            try:
                pts.append((t, [int(x) for x in uj], [int(x) for x in top]))
            except (TypeError, ValueError):
                continue  # a damaged row
    pts.sort(key=lambda p: p[0])
    if len(pts) < 2:
        return None
    total = 0.0
    for (t0, a, top), (t1, b, _top) in zip(pts, pts[1:]):  # noqa: B905 -- pairs of one list
        if not 0 < t1 - t0 <= MAX_GAP_S or len(a) != len(b) or len(a) != len(top):
            continue
        for x, y, m in zip(a, b, top):  # noqa: B905 -- lengths checked
            total += (y - x if y >= x else m - x + y) / 1e6
    return total


def _tail_json(path: str, n: int) -> list[object]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * (n + 1)))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    out: list[object] = []
    for line in data.splitlines()[-n:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a half-written line, or the cut first line of the window
    return out


FUNCS = {"health": health, "telemetry": telemetry, "gpu_query": gpu_query}

if __name__ == "__main__":
    name, args = sys.argv[1], sys.argv[2:]
    print(json.dumps(FUNCS[name](*args)))  # type: ignore[operator]
