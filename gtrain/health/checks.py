"""`gtrain health`: every check on every node, in one report (:func:`run_health`); the launch preflight that
runs it is :func:`gtrain.runs.preflight.preflight`. The per-check rules are in docs/health.md (and the GPU
ones in :mod:`gtrain.health.gpu`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import RemoteError
from gtrain.health import gpu
from gtrain.health.model import Check, HealthReport, Verdict
from gtrain.remote.fanout import parallel

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.health.probejob import ProbeRun
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

DISK_FAIL_GB, DISK_WARN_GB = 2.0, 20.0
CLOCK_WARN_S, CLOCK_FAIL_S = 1.0, 60.0
#: an all-reduce under this share of the NIC's line rate (NCCL, more than one node) is a warning
BUSBW_WARN_SHARE = 0.25
FULL_SECONDS = 60.0


def call_node(runner: Runner, func: str, *args: str, timeout: float = 60) -> Any:
    """Run ``gtrain.health.nodeprobe.<func>(*args)`` on the node (its source on stdin); its JSON answer."""
    src = Path(__file__).with_name("nodeprobe.py").read_text(encoding="utf-8")
    res = runner.run_python(src, [func, *args], timeout=timeout)
    return json.loads(res.stdout)


def checkpoint_store(spec: ClusterSpec) -> str:
    """``job.checkpoint_store`` when the spec has one (a URL, or a model with ``url``), else ""."""
    store = getattr(spec.job, "checkpoint_store", None) if spec.job else None
    if store is None:
        return ""
    return str(getattr(store, "url", None) or getattr(store, "uri", None) or store)


def run_health(cluster: Cluster, ctx: Context, mode: str = "quick", spec: ClusterSpec | None = None) -> HealthReport:
    t0 = time.monotonic()
    spec = spec or ctx.spec_of(cluster)
    report = HealthReport(cluster.name, mode)
    runners = ctx.runners(cluster)
    ckpt = spec.job.checkpoint_dir if spec.job else "checkpoints"
    store = checkpoint_store(spec)
    ctx.report.info(f"health ({mode}): asking {len(runners)} node(s)")

    def ask(i: int) -> tuple[dict[str, Any] | None, float, str | None]:
        try:
            doc = call_node(runners[i], "health", f"{runners[i].root}/workdir/{ckpt}", store)
            return doc, time.time(), None
        except (RemoteError, ValueError) as e:
            return None, time.time(), getattr(e, "message", str(e))

    answers = parallel(ask, list(range(len(runners))))
    probes = {i: a[0] for i, a in enumerate(answers) if a[0] is not None}
    for i, (doc, _, err) in enumerate(answers):
        if doc is None:
            report.add(Check("node.reach", Verdict.FAIL, "unreachable", f"the node did not answer: {err}", i))
    want_name, want_count = spec.resources.gpu_name, spec.resources.gpus_per_node
    for i, p in sorted(probes.items()):
        report.add(*gpu.node_checks(i, p, want_name, want_count), _disk(i, p))
        if store:
            report.add(_store(i, p))
    if spec.resources.tpu:  # a TPU slice: JAX's device count per worker host instead of nvidia-smi
        from gtrain.health.tpu import tpu_checks

        report.add(*tpu_checks(spec, runners))
    if (versions := gpu.version_check(probes)) is not None:
        report.add(versions)
    if probes:
        report.add(_clocks({i: (p["time"] - answers[i][1]) for i, p in probes.items()}))
    if report.failed():  # a node that fails already is not worth the job's minute: say why it did not run
        report.add(Check("interconnect.job", Verdict.SKIPPED, "not run", "all-reduce and GEMM digests not run: "
                         "node checks failed above"))
    else:
        from gtrain.health.probejob import run_probe_job

        devices = [len((p.get("gpu") or {}).get("devices") or []) for p in probes.values()]
        nproc = min(devices) or 1
        ctx.report.info(f"health: all-reduce and GEMM digests on {len(runners)} node(s) x {nproc} device(s)")
        run = run_probe_job(cluster, spec, ctx, nproc=nproc, seconds=FULL_SECONDS if mode == "full" else 0.0)
        report.add(*job_checks(cluster, spec, run, nproc, probes))
    report.seconds = time.monotonic() - t0
    return report


def _disk(node: int, p: dict[str, Any]) -> Check:
    d = p.get("disk") or {}
    free = float(d.get("free_gb") or 0)
    v = Verdict.FAIL if free < DISK_FAIL_GB else Verdict.WARN if free < DISK_WARN_GB else Verdict.OK
    return Check("host.disk", v, f"{free:g} GB free", f"free at the checkpoint path {d.get('path')} "
                 f"(fail < {DISK_FAIL_GB:g} GB, warn < {DISK_WARN_GB:g} GB)", node)


def _store(node: int, p: dict[str, Any]) -> Check:
    s = p.get("store") or {}
    if s.get("ok"):
        return Check("host.store", Verdict.OK, "reachable", f"{s.get('store')}: {s.get('how')}", node)
    return Check("host.store", Verdict.FAIL, "unreachable", f"{s.get('store')}: {s.get('how')} failed: "
                 f"{s.get('error', 'not writable')}", node)


def _clocks(offsets: dict[int, float]) -> Check:
    spread = max(offsets.values()) - min(offsets.values())
    v = Verdict.FAIL if spread >= CLOCK_FAIL_S else Verdict.WARN if spread >= CLOCK_WARN_S else Verdict.OK
    each = ", ".join(f"node {i} {o:+.3f}s" for i, o in sorted(offsets.items()))
    return Check("host.clock", v, f"{spread * 1e3:.0f} ms spread", f"clock offsets vs this machine (within the "
                 f"round trip): {each}", data={"offsets": offsets})


def job_checks(cluster: Cluster, spec: ClusterSpec, run: ProbeRun, nproc: int,
               probes: dict[int, dict[str, Any]]) -> list[Check]:
    out: list[Check] = []
    by_node: dict[int, list[dict[str, Any]]] = {}
    for r in run.ranks:
        by_node.setdefault(int(r.get("node", -1)), []).append(r)
    for node in range(cluster.num_nodes):
        docs = by_node.get(node, [])
        errors = [d["error"] for d in docs if d.get("error")]
        if len(docs) < nproc or errors:
            why = errors[0] if errors else (f"{len(docs)} of {nproc} rank(s) reported ({run.state}"
                                            f"{'; ' + run.error if run.error else ''}): "
                                            + " | ".join(run.tails.get(node, [])[-2:]))
            out.append(Check("interconnect.job", Verdict.FAIL, f"{len(docs)}/{nproc} ranks", why[:400], node))
    good = [r for r in run.ranks if not r.get("error") and r.get("sdc")]
    if not good:
        return out or [Check("interconnect.job", Verdict.FAIL, "no result", run.error or run.state)]
    out.append(_allreduce(cluster, spec, good))
    if (fabric := _fabric(cluster, spec, good, run)) is not None:
        out.append(fabric)
    out += sdc_checks(good, probes)
    return out


def _allreduce(cluster: Cluster, spec: ClusterSpec, good: list[dict[str, Any]]) -> Check:
    from gtrain.catalog.network import network

    r0 = min(good, key=lambda r: int(r.get("rank", 0)))
    sizes = r0.get("allreduce") or []
    table = ", ".join(f"{s['bytes'] / 1e6:g} MB {s['busbw_gbs']:g}" for s in sizes)
    big = sizes[-1] if sizes else {"busbw_gbs": 0.0, "bytes": 0}
    figure = f"{big['busbw_gbs']:g} GB/s busbw at {big['bytes'] / 1e6:g} MB"
    net = network(cluster.provider, cluster.instance_type or spec.resources.instance_type)
    why = f"{r0.get('backend')} across {r0.get('world')} rank(s); busbw GB/s per size: {table}"
    v = Verdict.OK
    if net is not None and cluster.num_nodes > 1 and r0.get("backend") == "nccl":
        line = net.gbps / 8
        share = big["busbw_gbs"] / line if line else 1.0
        why += f"; {share:.0%} of the {net.gbps:g} Gbit/s NIC ({line:g} GB/s)"
        if share < BUSBW_WARN_SHARE:
            v = Verdict.WARN
    elif net is None:
        why += "; no line rate known for this instance type"
    return Check("interconnect.allreduce", v, figure, why, data={"sizes": sizes})


def _fabric(cluster: Cluster, spec: ClusterSpec, good: list[dict[str, Any]], run: ProbeRun) -> Check | None:
    from gtrain.catalog.network import network
    if not any(r.get("backend") == "nccl" for r in good) or cluster.num_nodes < 2:
        return None
    net = network(cluster.provider, cluster.instance_type or spec.resources.instance_type)
    if net is None or net.fabric is None:
        return None
    used = sorted(set().union(*run.nets.values())) if run.nets else []
    if net.fabric in used:
        return Check("interconnect.fabric", Verdict.OK, net.fabric, f"NCCL used {net.fabric} (NCCL_DEBUG=INFO)")
    return Check("interconnect.fabric", Verdict.FAIL, ",".join(used) or "unknown",
                 f"{net.instance_type} has {net.fabric.upper()} but NCCL used {', '.join(used) or 'no reported'} "
                 "transport: install/enable its NCCL plugin (aws-ofi-nccl) or check FI_PROVIDER / NCCL_IB_HCA")


def _label(r: dict[str, Any], probes: dict[int, dict[str, Any]]) -> str:
    node = int(r.get("node", -1))
    if r.get("device") == "cuda":
        serial = gpu.serial_of(probes.get(node, {}), r.get("index"), r.get("uuid") or None)
        return f"GPU {r.get('index')}" + (f" (serial {serial})" if serial else "")
    return f"CPU rank {r.get('local_rank')}"


def _reference(docs: list[dict[str, Any]], key: str) -> str | None:
    """The digest most devices that passed their own checksum check agree on (ties: the lowest rank's)."""
    trusted = [d for d in docs if d["sdc"].get("abft_ok")] or docs
    counts = Counter(d["sdc"][key] for d in trusted)
    if not counts:
        return None
    best = max(counts.values())
    return next(d["sdc"][key] for d in sorted(trusted, key=lambda d: int(d.get("rank", 0)))
                if counts[d["sdc"][key]] == best)


def sdc_checks(good: list[dict[str, Any]], probes: dict[int, dict[str, Any]]) -> list[Check]:
    """Per node: every device's checksum check, its exact digest against the cluster's, its float digest
    against the devices of the same model, and (``--full``) the same digest on every repetition."""
    exact_ref = _reference(good, "exact")
    float_ref = {m: _reference([d for d in good if d.get("model") == m], "float") for m in {d.get("model")
                                                                                           for d in good}}
    out = []
    for node in sorted({int(d.get("node", -1)) for d in good}):
        bad: list[str] = []
        mine = sorted((d for d in good if int(d.get("node", -1)) == node), key=lambda d: int(d.get("local_rank", 0)))
        for d in mine:
            s, what = d["sdc"], _label(d, probes)
            if not s.get("abft_ok"):
                bad.append(f"{what}: GEMM checksum mismatch (row/column sums disagree with the product)")
            if s.get("exact") != exact_ref:
                bad.append(f"{what}: exact GEMM digest {s.get('exact')} != cluster {exact_ref}")
            if s.get("float") != float_ref.get(d.get("model")):
                bad.append(f"{what}: GEMM digest {s.get('float')} != {float_ref.get(d.get('model'))} of the other "
                           f"{d.get('model')} devices")
            if s.get("drift"):
                bad.append(f"{what}: {s['drift']} of {s.get('runs')} repetitions gave another result")
        runs = sum(int(d["sdc"].get("runs", 1)) for d in mine)
        if bad:
            out.append(Check("sdc.digest", Verdict.FAIL, f"{len(bad)} mismatch(es)", "; ".join(bad), node,
                             {"devices": [{"label": _label(d, probes), **d["sdc"]} for d in mine]}))
        else:
            n = mine[0]["sdc"].get("n") if mine else 0
            out.append(Check("sdc.digest", Verdict.OK, f"{len(mine)} device(s) agree",
                             f"{n}x{n} GEMMs ({runs} run(s)): checksums hold, digests equal the cluster's", node))
    return out
