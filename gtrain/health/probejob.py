"""The all-reduce + silent-data-corruption job (:mod:`gtrain.health.probe_script`), run as a real gtrain job
through the cluster's own job backend (``reserve`` / ``dryrun`` / ``submit`` / ``describe`` / ``log_iter`` /
``cancel``), so it runs wherever training runs: local directories, SSH hosts, clouds, a scheduler.

The job is not recorded in the state store (it is not the user's job: `status` and `logs` do not list it);
its files stay under the nodes' ``jobs/<cluster>-health-…`` folders like any job's, and its script is synced
into the nodes' workdir as ``.gtrain-health-probe.py``."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.events import SILENT
from gtrain.jobs.backend import JobRequest, LogLine
from gtrain.state import Job as JobRecord

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

SCRIPT = ".gtrain-health-probe.py"
TAG = "GTRAIN_HEALTH "
#: NCCL_DEBUG=INFO lines that say which transport NCCL picked
NET_MARKERS = (("NET/OFI", "efa"), ("Libfabric", "efa"), ("NET/IB", "ib"), ("NET/Socket", "socket"),
               ("Using network Socket", "socket"), ("Using network IB", "ib"))


@dataclass
class ProbeRun:
    job_id: str
    state: str
    seconds: float
    #: every rank's ``GTRAIN_HEALTH`` document
    ranks: list[dict[str, Any]] = field(default_factory=list)
    #: node -> transports NCCL reported (efa, ib, socket)
    nets: dict[int, set[str]] = field(default_factory=dict)
    #: node -> its last output lines (for a node that reported nothing)
    tails: dict[int, list[str]] = field(default_factory=dict)
    error: str | None = None


def fault_of(instances: dict[int, str | None]) -> str:
    """``GTRAIN_HEALTH_FAULT`` (tests only) as the probe script takes it: ``node:K[:gpu:I]`` as it is;
    ``instance:ID[:gpu:I]`` names the node by its provider id (rank -> id in ``instances``), so a node made
    again under that rank (``--replace-bad``) computes right; "" when no node of the cluster has that id."""
    fault = os.environ.get("GTRAIN_HEALTH_FAULT", "")
    kind, _, rest = fault.partition(":")
    if kind != "instance":
        return fault
    iid, sep, gpu = rest.partition(":gpu:")
    node = next((rank for rank, have in instances.items() if have == iid), None)
    return "" if node is None else f"node:{node}" + (f":gpu:{gpu}" if sep else "")


def probe_spec(spec: ClusterSpec, nproc: int, seconds: float, workdir: str, fault: str = "") -> ClusterSpec:
    """The health job's spec: the user's cluster, env and python; our script; no setup, data or secrets."""
    from gtrain.spec import Job

    user = spec.job
    argv = [SCRIPT, "--seconds", str(seconds)]
    if fault:
        argv += ["--fault", fault]
    env = {**(user.env if user else {}), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
           "OMP_NUM_THREADS": (user.env.get("OMP_NUM_THREADS", "1") if user else "1")}
    job = Job(workdir=workdir, run=shlex.join(argv), nproc_per_node=nproc, env=env,
              python=user.python if user else None, checkpoint_dir=user.checkpoint_dir if user else "checkpoints")
    return spec.model_copy(update={"job": job})


def run_probe_job(cluster: Cluster, spec: ClusterSpec, ctx: Context, *, nproc: int, seconds: float = 0.0,
                  timeout: float = 300.0) -> ProbeRun:
    import secrets

    t0 = time.monotonic()
    backend = ctx.backend(cluster)
    with tempfile.TemporaryDirectory(prefix="gtrain-health-") as tmp:
        src = Path(__file__).with_name("probe_script.py").read_text(encoding="utf-8")
        (Path(tmp) / SCRIPT).write_text(src, encoding="utf-8")
        fault = fault_of({n.rank: n.instance_id for n in ctx.nodes(cluster)})
        hspec = probe_spec(spec, nproc, seconds, tmp, fault)
        job_id = f"{cluster.name}-health-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        request = backend.reserve(JobRequest(cluster, hspec, job_id, tmp))
        plan = backend.dryrun(request)
        backend.submit(plan, SILENT)
    record = JobRecord(job_id, cluster.id, "running", time.time(), None, None, dict(plan.info))
    state, error = "unknown", None
    deadline = time.monotonic() + timeout + seconds
    try:
        while True:
            desc = backend.describe(record)
            state = desc.state.value
            if desc.state.terminal:
                break
            if time.monotonic() > deadline:
                error = f"no result after {timeout + seconds:.0f}s"
                break
            time.sleep(0.25)
    finally:
        if error is not None or state not in ("succeeded", "failed", "cancelled"):
            backend.cancel(record, grace_s=2)
    run = ProbeRun(job_id, state, time.monotonic() - t0, error=error)
    for node in range(cluster.num_nodes):
        lines: list[str] = []
        for item in backend.log_iter(record, node, tail=4000):
            if isinstance(item, LogLine):
                _take(run, node, item.text, lines)
        run.tails[node] = lines[-5:]
    return run


def _take(run: ProbeRun, node: int, text: str, lines: list[str]) -> None:
    if text.startswith(TAG):
        try:
            run.ranks.append(json.loads(text[len(TAG):]))
        except ValueError:
            pass
        return
    for marker, net in NET_MARKERS:
        if marker in text:
            run.nets.setdefault(node, set()).add(net)
    lines.append(text)
