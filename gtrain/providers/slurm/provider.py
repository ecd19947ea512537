"""The ``slurm`` provider: a team's Slurm cluster, reached from this machine or through a login node.

``up`` checks the cluster (sinfo answers, the partition exists and has ``num_nodes`` nodes with the GPUs
asked, ``sbatch --test-only`` accepts the request) and records it; it allocates nothing. Jobs run through
:class:`~gtrain.providers.slurm.backend.SlurmBackend`. ``down`` scancels every job of the cluster and removes
gtrain's folder under ``slurm.shared_dir`` (unless ``slurm.keep_files``). The cost is GPU-hours of the jobs
(sacct, or slurmctld's own start/end times when accounting is off) times ``slurm.rate_per_gpu_hour``.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.providers.base import IntervalCost, NodeStatus, Plan, Provider
from gtrain.providers.slurm.login import login_info, runner_for, sbatch_lines
from gtrain.providers.slurm.options import SlurmOptions, parse_options, shared_where
from gtrain.spec.volumes import path_notes, path_refusal, path_script

if TYPE_CHECKING:
    from gtrain.jobs.backend import JobBackend
    from gtrain.providers.slurm.commands import Slurm, SqueueRow
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval
    from gtrain.state.nodes import NodeRecord

_GRES_RE = re.compile(r"gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")
_DOWN_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "maint", "future", "unknown")


def gres_gpus(gres: str) -> tuple[str | None, int]:
    """(GPU type, count) of a node's ``%G`` (``gpu:h100:8(S:0-1)``, ``gpu:4``, ``(null)``)."""
    best: tuple[str | None, int] = (None, 0)
    for m in _GRES_RE.finditer(gres):
        if int(m.group(2)) > best[1]:
            best = (m.group(1), int(m.group(2)))
    return best


class SlurmProvider(Provider):
    name = "slurm"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._slurm: dict[str, Slurm] = {}
        self._rows: dict[str, tuple[float, SqueueRow | None]] = {}
        self._lock = threading.Lock()

    # ---- the login side ----------------------------------------------------------------------------

    def _runner_for(self, opts: dict[str, Any], root: str, label: str, *, tofu: bool = False) -> Runner:
        return runner_for(opts, root, label, self.report, tofu=tofu)

    def _login(self, cluster: Cluster) -> dict[str, Any]:
        return dict(cluster.extra.get("slurm") or {})

    def login_runner(self, cluster: Cluster) -> Runner:
        # rooted at /: every path gtrain passes is absolute, and a local runner makes its root on each call
        return self._runner_for(self._login(cluster), "/", f"{cluster.name} login side")

    def slurm(self, cluster: Cluster) -> Slurm:
        from gtrain.providers.slurm.commands import Slurm

        with self._lock:
            if cluster.id not in self._slurm:
                self._slurm[cluster.id] = Slurm(self.login_runner(cluster), self._login(cluster).get("conf"))
            return self._slurm[cluster.id]

    def login_call(self, cluster: Cluster, func: str, *args: str) -> Any:
        """A :mod:`~gtrain.providers.slurm.nodefiles` function on the login side (in-process when local)."""
        import json

        from gtrain.providers.slurm import nodefiles

        if not self._login(cluster).get("login"):
            return json.loads(json.dumps(nodefiles.FUNCS[func](*args)))  # type: ignore[operator]
        with open(nodefiles.__file__, encoding="utf-8") as f:
            src = f.read()
        res = self.login_runner(cluster).run_python(src, [func, *args], timeout=120)
        return json.loads(res.stdout)

    def squeue_row(self, cluster: Cluster, sid: str, max_age: float | None) -> SqueueRow | None:
        """The job's squeue row: a fresh call, or one made less than ``max_age`` s ago (log followers share
        it); None when slurmctld no longer knows the job."""
        now = time.monotonic()
        with self._lock:
            hit = self._rows.get(sid)
        if hit is not None and max_age and now - hit[0] < max_age:
            return hit[1]
        rows = self.slurm(cluster).squeue([sid])
        row = (rows or {}).get(sid)
        with self._lock:
            self._rows[sid] = (time.monotonic(), row)
        return row

    # ---- plan / provision --------------------------------------------------------------------------

    def sbatch_lines(self, spec: ClusterSpec, opts: SlurmOptions, cluster: Cluster | None, job_id: str,
                     root: str) -> list[str]:
        """The #SBATCH options of a job of this spec (what `up --dry-run` shows, what sbatch gets)."""
        return sbatch_lines(spec, opts, cluster, job_id, root)

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = parse_options(spec)
        lines = self.sbatch_lines(spec, opts, None, "<job-id>", "<shared_dir>/gtrain/" + spec.name)
        gpus = spec.resources.gpus_per_node if spec.resources.accelerators else 0
        return Plan(
            provider="slurm", num_nodes=spec.num_nodes, instance_type=f"slurm:{opts.partition or 'default'}",
            market="slurm", region=opts.login or "this machine", gpu_name=spec.resources.gpu_name,
            gpus_per_node=gpus, price_per_hour=opts.rate_per_gpu_hour * gpus, max_hours=spec.policies.max_hours,
            notes=[f"`up` takes and holds an allocation of {spec.num_nodes} node(s) (salloc --no-shell) until "
                   "`down`: each launch is a step in it, the held time is charged" if opts.hold else
                   "allocates nothing at `up`: each launch is one sbatch job",
                   "a job would ask: " + " ".join(lines),
                   f"charged {opts.rate_per_gpu_hour}/GPU-hour of job time (slurm.rate_per_gpu_hour)",
                   *path_notes(spec)],
        )

    @staticmethod
    def _volumes(spec: ClusterSpec, runner: Runner, where: str) -> None:
        """A volume is a folder of the filesystem the nodes share, used where it is (no link: a link made on
        the login side would not be on the nodes); checked there."""
        for i, v in enumerate(spec.volumes or []):
            if v.path and v.path != v.mount:
                raise ConfigError(f"invalid spec: volumes[{i}].path: slurm uses the shared folder where it is; "
                                  f"{v.mount} cannot be made a link to {v.path} on the nodes",
                                  hint=f"drop path and set mount: {v.path}", field=f"volumes[{i}].path")
        res = runner.run(path_script(spec, link=False), timeout=60, check=False)
        if err := path_refusal(spec, where, res.stdout):
            raise err

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        from gtrain.providers.slurm.commands import Slurm

        opts = parse_options(spec)
        raw = opts.model_dump()
        probe_runner = self._runner_for(raw, "/", f"{cluster.name} login side", tofu=True)
        slurm = Slurm(probe_runner, opts.conf)
        self.check_cluster(spec, opts, slurm)
        shared = opts.shared_dir or "~"
        where = shared_where(opts)
        sub = f"gtrain/{cluster.name}"
        if spec.volumes:  # folders of the filesystem the nodes share: checked before anything is made
            self._volumes(spec, probe_runner, opts.login or "the login side")
        rid = self.store.record_resource(cluster.id, "slurm-dir", f"{opts.login or 'local'}:{shared}/{sub}")
        root = probe_runner.check(f"mkdir -p {where}/{sub}/workdir {where}/{sub}/jobs && cd {where}/{sub} && pwd -P")
        root = root.strip()
        self.store.mark_resource(rid, "created", ref=f"{opts.login or 'local'}:{root}")
        # the request itself, checked by the scheduler (account, qos, time, constraint), nothing submitted
        probe = f"{root}/jobs/.gtrain-probe.sh"
        lines = [ln for ln in self.sbatch_lines(spec, opts, cluster, "gtrain-probe", root)
                 if not ln.startswith(("--output", "--open-mode"))]
        probe_runner.write_file(probe, ("#!/bin/bash\n" + "".join(f"#SBATCH {ln}\n" for ln in lines)
                                        + "true\n").encode(), 0o700)
        try:
            said = slurm.test_only(probe)
        finally:
            probe_runner.run(f"rm -f {shlex.quote(probe)}", check=False)
        self.report.info(f"slurm accepts the request: {said.splitlines()[-1] if said else 'ok'}")
        extra = {**cluster.extra, "slurm": self.login_info(opts, root)}
        if opts.hold:
            from gtrain.providers.slurm.hold import take_allocation

            extra["slurm"]["alloc_id"] = take_allocation(self, spec, opts, cluster, slurm, root)
        self.store.update_cluster(cluster.id, extra=extra)
        cluster.extra = extra
        for k in range(spec.num_nodes):
            self.store.upsert_node(cluster.id, k, status="up", address=opts.partition or "default",
                                   instance_id=f"slurm:{opts.partition or 'default'}/node-{k}", meta={"root": root})
        self.report.info(f"slurm cluster recorded: jobs live in {root}")

    @staticmethod
    def login_info(opts: SlurmOptions, root: str) -> dict[str, Any]:
        """What the cluster's record keeps of its slurm section (how the login side is reached; no secret)."""
        return login_info(opts, root)

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        from gtrain.providers.slurm.adopt import find_by_name

        return find_by_name(self, spec)

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        from gtrain.providers.slurm.adopt import adopt

        adopt(self, spec, cluster)

    def check_cluster(self, spec: ClusterSpec, opts: SlurmOptions, slurm: Slurm) -> None:
        """sinfo answers, the partition exists and has num_nodes usable nodes with the GPUs asked."""
        nodes = slurm.partition_nodes(opts.partition)
        if opts.partition and not nodes:
            known = sorted({n["partition"].rstrip("*") for n in slurm.partition_nodes(None)})
            raise ConfigError(f"slurm.partition: {opts.partition!r} is not a partition of this cluster, nothing "
                              "was submitted", hint=f"partitions: {', '.join(known) or '(none)'}",
                              field="slurm.partition")
        if not opts.partition:
            default = [n for n in nodes if n["partition"].endswith("*")]
            nodes = default or nodes
        gpus = spec.resources.gpus_per_node if spec.resources.accelerators else 0
        want = (spec.resources.gpu_name or "").lower()
        usable = [n for n in nodes if not any(n["state"].lower().startswith(s) for s in _DOWN_STATES)]
        fit = [n for n in usable if not gpus or (gres_gpus(n["gres"])[1] >= gpus
                                                 and (not gres_gpus(n["gres"])[0] or not want
                                                      or gres_gpus(n["gres"])[0] == want))]
        names = len({n["name"] for n in fit})
        if names < spec.num_nodes:
            where = opts.partition or "the default partition"
            if gpus and names < len({n["name"] for n in usable}):
                raise ConfigError(
                    f"resources.accelerators: {spec.resources.accelerators} — only {names} node(s) of {where} have "
                    f"{gpus} such GPU(s), num_nodes is {spec.num_nodes}", field="resources.accelerators",
                    hint="`sinfo -N -o '%N %G'` lists each node's GPUs")
            raise ConfigError(f"num_nodes: {spec.num_nodes} — {where} has {names} usable node(s)",
                              hint="ask for fewer nodes, or another slurm.partition", field="num_nodes")

    # ---- describe / terminate ----------------------------------------------------------------------

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        """Each node slot, from the newest job's squeue row that the job's refresh just fetched (no second
        squeue call: `gtrain status` makes one); the partition otherwise."""
        job = self.store.latest_job(cluster.id)
        sid = str(job.info.get("slurm_job_id")) if job and job.info.get("slurm_job_id") else None
        hit = self._rows.get(sid) if sid else None
        part = self._login(cluster).get("partition") or "default"
        out = []
        for n in self.store.nodes(cluster.id):
            detail = f"partition {part}"
            if hit and hit[1] is not None:
                detail += f"; slurm job {sid} {hit[1].state} on {hit[1].nodelist or '-'}"
            out.append(NodeStatus(n.rank, "running" if n.status == "up" else n.status, n.address, detail))
        return out

    def terminate(self, cluster: Cluster) -> None:
        info = self._login(cluster)
        if not info.get("root"):
            for res in self.store.resources(cluster.id, live_only=True):
                self.store.mark_resource(res.id, "deleted")
            return
        slurm = self.slurm(cluster)
        ids = {str(j.info["slurm_job_id"]) for j in self.store.jobs(cluster.id) if j.info.get("slurm_job_id")}
        ids |= {str(info["alloc_id"])} if info.get("alloc_id") else set()  # slurm.hold: released here
        live = set(slurm.jobs_with_comment(f"gtrain:{cluster.id}"))
        rows = slurm.squeue(sorted(ids)) or {}
        from gtrain.providers.slurm.states import SLURM_STATES

        live |= {s for s, r in rows.items() if not SLURM_STATES.get(r.state, SLURM_STATES["RUNNING"]).terminal}
        if live:
            self.report.info(f"scancel {' '.join(sorted(live))}")
            slurm.scancel(sorted(live))
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                rows = slurm.squeue(sorted(live)) or {}
                if all(SLURM_STATES.get(r.state, SLURM_STATES["RUNNING"]).terminal for r in rows.values()):
                    break
                time.sleep(0.2)
        for res in self.store.resources(cluster.id, live_only=True):
            # kept files keep no attach record: `gtrain attach` must not adopt a cluster that is down
            gone = str(info["root"]) if not info.get("keep_files") else f"{info['root']}/gtrain-record.json"
            self.login_runner(cluster).run(f"rm -rf {shlex.quote(gone)}", check=False)
            self.store.mark_resource(res.id, "deleted")

    def runners(self, cluster: Cluster) -> list[Runner]:
        """One runner per node slot, each on the login side (the nodes share ``shared_dir``) for files (pull);
        commands (exec) run on node K of the running job or held allocation (``srun --overlap``), else on
        the login side."""
        from gtrain.providers.slurm.runners import AllocationRunner, ExecTarget

        info = self._login(cluster)
        target = ExecTarget(self, cluster)
        return [AllocationRunner(self._runner_for(info, info["root"], f"node {n.rank} (login side)"), target,
                                 n.rank) for n in self.store.nodes(cluster.id)]

    def running_slurm_job(self, cluster: Cluster, max_age: float | None = None) -> str | None:
        """The Slurm job whose nodes commands go to: the held allocation, else the newest job while RUNNING."""
        info = self._login(cluster)
        job = self.store.latest_job(cluster.id)
        sid = info.get("alloc_id") or (job.info.get("slurm_job_id") if job else None)
        if not sid:
            return None
        row = self.squeue_row(cluster, str(sid), max_age)
        return str(sid) if row is not None and row.state == "RUNNING" else None

    def node_records(self, cluster: Cluster) -> list[NodeRecord]:
        return self.store.node_records(cluster.id)

    def job_backend(self, cluster: Cluster) -> JobBackend:
        from gtrain.providers.slurm.backend import SlurmBackend

        return SlurmBackend(self, cluster)

    def interactive_argv(self, cluster: Cluster, node: NodeRecord) -> tuple[list[str], str | None]:
        """A shell on node ``node.rank`` of the running job (``srun --overlap --pty``), else on the login side."""
        info = self._login(cluster)
        sid = self.running_slurm_job(cluster)
        inner = (["srun", f"--jobid={sid}", "--overlap", "--pty", "-N1", "-n1", f"--relative={node.rank}", "bash", "-l"]
                 if sid else ["bash", "-l"])
        if info.get("conf"):
            inner = ["env", f"SLURM_CONF={info['conf']}", *inner]
        if not info.get("login"):
            return inner, str(info.get("root"))
        user, host, port = SlurmOptions(login=info["login"]).login_parts()
        ident = ["-i", str(info["login_identity_file"])] if info.get("login_identity_file") else []
        return ["ssh", "-t", "-p", str(port), *ident, f"{user}@{host}" if user else host,
                " ".join(shlex.quote(a) for a in inner)], None

    # ---- cost --------------------------------------------------------------------------------------

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        from gtrain.providers.slurm.cost import job_gpu_seconds

        res = cluster.spec.get("resources") or {}
        from gtrain.spec import Resources

        gpus = Resources.model_validate(res).gpus_per_node if res.get("accelerators") else 0
        rate = float((cluster.spec.get("slurm") or {}).get("rate_per_gpu_hour") or 0.0)
        seconds, source = job_gpu_seconds(self, cluster, interval)
        gpu_h = seconds * gpus / 3600
        return IntervalCost(round(gpu_h * rate, 6), estimate=source != "sacct",
                            note=f"{seconds / 3600:.4f} job-hour(s) x {gpus} GPU(s) = {gpu_h:.4f} GPU-hour(s) "
                                 f"x ${rate}/GPU-hour, times from {source}")
