"""The CLI's side of the nodes' checkpoint tool: the bundle, the write probe at launch, and the relaunch of a
job's next attempt under the same job id (the nodes restore from the store before the script starts)."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

from gtrain.checkpoints.bundle import BUNDLE, bundle
from gtrain.errors import ConfigError, GtrainError, RemoteCommandError, SyncError

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.events import Reporter
    from gtrain.jobs.backend import JobBackend, JobPlan
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

#: what one attempt leaves in a job's folder on a node; moved to attempt-N/ before the next one starts
_ATTEMPT_FILES = ("state.json", "pid", "cancel", "node.log", "logs", "ckpt-stop", "ckpt-restored.json",
                  "ckpt-uploads.jsonl")


def _runners(backend: JobBackend) -> list[Any]:
    runners = getattr(backend, "runners", None)
    if runners is None:
        raise ConfigError(f"job.checkpoint_store: the {backend.name} backend does not run gtrain's checkpoint "
                          "uploader", field="job.checkpoint_store", hint="remove job.checkpoint_store here")
    return list(runners)


def _bundle_sha() -> str:
    import hashlib

    return hashlib.sha256(bundle()).hexdigest()


def run_tool(backend: JobBackend, plan: JobPlan, node: int, *args: str, timeout: float = 3600,
             ship: bool = False) -> dict[str, Any]:
    """Run the checkpoint tool on ``node`` with the job's env and secrets; its one JSON line. ``ship``: first
    copy the tool there unless the node holds the same bytes already (asked in the same command as the mkdir:
    no extra round trip, and ~300 kB not sent again to each node at every launch)."""
    from gtrain.jobs.nodescript import secret_stdin
    from gtrain.jobs.render import render

    job = plan.request.spec.job
    assert job is not None and job.checkpoint_store
    r, c = _runners(backend)[node], plan.private["contexts"][node]
    key = c.checkpoint_key or plan.job_id
    pyz = f"{r.root}/{BUNDLE}"
    script = render("ckpt.sh", c, bundle=pyz, ckpt_args=[args[0], job.checkpoint_store, key,
                                                         str(node), *args[1:]])
    if ship:
        held = r.run(f"mkdir -p {shlex.quote(c.job_dir)} && {{ sha256sum {shlex.quote(pyz)} 2>/dev/null || true; }}",
                     timeout=120).stdout.split()
        if held[:1] != [_bundle_sha()]:
            r.write_file(pyz, bundle(), 0o600)
    else:
        r.run(f"mkdir -p {shlex.quote(c.job_dir)}")
    r.write_file(f"{c.job_dir}/ckpt.sh", script.encode(), 0o700)
    res = r.run(f"bash {shlex.quote(c.job_dir)}/ckpt.sh", stdin=secret_stdin(job), check=False, timeout=timeout)
    last = (res.stdout.strip().splitlines() or [""])[-1]
    try:
        doc = dict(json.loads(last))
    except ValueError:
        raise RemoteCommandError(r.label, "checkpoint store", res.rc, res.stderr[-2000:]) from None
    if "error" in doc:
        raise SyncError(f"node {node}: job.checkpoint_store {job.checkpoint_store}: {doc['error']}",
                        hint=doc.get("hint") or "the nodes need write access to the store (job.env / job.secrets, "
                        "or an instance role)")
    return doc


def prepare(plan: JobPlan, backend: JobBackend, report: Reporter, *, attempt: int = 1, fresh: bool = False,
            nodes: list[int] | None = None) -> None:
    """Before a submit: record the durable-run fields in the plan's info; with a store, ship the tool to every
    node and probe a write from each (a store that refuses writes fails the launch here, nothing started).
    ``fresh``: the run starts over (node 0 marks the run's folder: older checkpoints no longer count)."""
    from gtrain.remote.fanout import parallel

    spec = plan.request.spec
    job = spec.job
    assert job is not None
    plan.info.update({"attempt": attempt, "checkpoint_store": job.checkpoint_store,
                      "recovery_policy": spec.policies.recovery.to_info(),
                      "spec": spec.to_yaml_dict(), "base_dir": spec.base_dir})
    if spec.elastic or job.fault_tolerance == "torchft":  # a lost node is replaced alone (gtrain.runs.elastic)
        # torchft: the groups left wait for a quorum, never restarted, however few they are
        least = 1 if job.fault_tolerance == "torchft" else spec.min_nodes or spec.num_nodes
        plan.info["elastic"] = {"min": least, "max": spec.num_nodes, "mode": job.fault_tolerance or "torchrun"}
        if job.fault_tolerance == "torchft" and job.torchft is not None and job.torchft.lighthouse:
            plan.info["elastic"]["node0"] = False  # the user's own Lighthouse: node 0 is replaced alone too
    if not job.checkpoint_store:
        return
    if backend.checkpoint_tool == "plan":  # the nodes exist only once submitted: each probes the store itself
        key = str(plan.info.get("checkpoint_key") or plan.job_id)
        plan.info["checkpoint_key"] = key
        if fresh:  # from here, before any node restores (this machine reaches the store, as `gtrain pull` does)
            from gtrain.checkpoints.store import Store

            st = Store(job.checkpoint_store, key)
            try:
                st.mark_fresh()
            finally:
                st.close()
            report.info(f"--fresh: run {key} starts over; its older checkpoints in the store are kept, not restored")
        return
    runners = _runners(backend)
    key = plan.private["contexts"][0].checkpoint_key or plan.job_id
    plan.info["checkpoint_key"] = key

    def one(i: int) -> None:
        run_tool(backend, plan, i, "probe", timeout=120, ship=True)

    parallel(one, list(range(len(runners))) if nodes is None else nodes)
    report.info(f"checkpoint store {job.checkpoint_store}/{key}: writable from "
                + ("every node" if nodes is None else f"node(s) {nodes}"))
    if fresh:
        run_tool(backend, plan, 0, "fresh", timeout=120)
        report.info(f"--fresh: run {key} starts over; its older checkpoints in the store are kept, not restored")


def job_spec(job: JobRecord, cluster: Cluster, ctx: Context) -> ClusterSpec:
    """The spec the job was launched with (its job section may differ from the cluster's)."""
    from gtrain.spec import parse_spec

    if isinstance(job.info.get("spec"), dict):
        return parse_spec(job.info["spec"], base_dir=job.info.get("base_dir"))
    return ctx.spec_of(cluster)


def relaunch(cluster: Cluster, job: JobRecord, ctx: Context, attempt: int) -> None:
    """Start attempt ``attempt`` of ``job`` under the same job id: what the last attempt left on each node is
    moved to ``attempt-N/``, the nodes restore the newest complete checkpoint from the store."""
    from gtrain.jobs.backend import JobRequest

    spec = job_spec(job, cluster, ctx)
    workdir = str(job.info.get("workdir") or spec.workdir_path())
    backend = ctx.backend(cluster)
    plan = backend.dryrun(backend.reserve(JobRequest(cluster, spec, job.id, workdir)))
    prepare(plan, backend, ctx.report, attempt=attempt)
    if backend.checkpoint_tool == "runners":
        _archive(backend, plan, attempt)
    info = {**ctx.store.get_job(job.id).info, **{k: v for k, v in plan.info.items() if k != "spec"},
            "final": False, "master": plan.info.get("master"), "attempt": attempt}
    backend.submit(plan, ctx.report)
    with ctx.store.tx() as c:  # a new attempt: the last one's end is not the job's
        c.execute("UPDATE jobs SET exit_code=NULL, ended_at=NULL WHERE id=?", (job.id,))
    ctx.store.update_job(job.id, status="running", info=info)
    ctx.report.info(f"job {job.id} attempt {attempt} started on {cluster.num_nodes} node(s)")


def _archive(backend: JobBackend, plan: JobPlan, attempt: int, nodes: list[int] | None = None) -> None:
    """What the last attempt left in the job's folder on each node (``nodes``: those), moved to ``attempt-N/``."""
    from gtrain.remote.fanout import parallel

    runners = _runners(backend)
    files = " ".join(_ATTEMPT_FILES)

    def archive(i: int) -> None:
        c = plan.private["contexts"][i]
        q = shlex.quote(c.job_dir)
        runners[i].run(f"mkdir -p {q} && cd {q} && prev=$(cat attempt 2>/dev/null || echo 1) && "
                       f"mkdir -p attempt-$prev && for f in {files}; do [ ! -e $f ] || mv -f $f attempt-$prev/; done; "
                       f"echo {attempt} > attempt")

    parallel(archive, list(range(len(runners))) if nodes is None else nodes)


def collect(cluster: Cluster, job: JobRecord, ctx: Context, nodes: list[int]) -> None:
    """Recovery, after the stop and before the relaunch: each of ``nodes`` (the survivors) uploads what it
    finished since its uploader's last pass, so the relaunch restores the newest checkpoint that exists
    anywhere, not the newest that had reached the store."""
    from gtrain.jobs.backend import JobRequest
    from gtrain.remote.fanout import parallel

    if not job.info.get("checkpoint_store") or not nodes:
        return
    spec = job_spec(job, cluster, ctx)
    backend = ctx.backend(cluster)
    if backend.checkpoint_tool == "plan":  # its nodes flushed as they were stopped; none is left to ask
        return
    plan = backend.dryrun(JobRequest(cluster, spec, job.id, str(job.info.get("workdir") or spec.workdir_path())))
    attempt = str(job.info.get("attempt", 1))

    def one(i: int) -> None:
        c = plan.private["contexts"][i]
        try:
            run_tool(backend, plan, i, "flush", c.checkpoint_dir, c.job_dir, attempt, "1", timeout=1800)
        except GtrainError as e:  # a node that cannot: the store's newest is restored
            ctx.report.warn(f"node {i}: could not collect its newest checkpoints: {e.message}")

    ctx.report.info(f"collecting the newest checkpoints of node(s) {nodes} into the store")
    parallel(one, nodes)
