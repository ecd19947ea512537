"""The Slurm job backend: one batch script per job, ``srun`` starting gtrain's launcher on every node.

``dryrun`` renders the batch script (``#SBATCH`` lines from the spec), the per-node wrapper ``node.sh`` and,
per node K, the shared templates' ``launch.sh``/``rank.sh``/``setup.sh`` writing under ``node-K/`` -- with
the rendezvous address, port and node addresses left to run time (the first host of
``scontrol show hostnames $SLURM_JOB_NODELIST``, a port from the Slurm job id). ``submit`` syncs the workdir
once to the shared folder and runs ``sbatch --parsable``. ``describe`` is ONE squeue call (plus one read of
the job's files); Slurm's state decides, the nodes' files give rank detail. See docs/providers/slurm.md.
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError
from gtrain.events import SILENT, Reporter
from gtrain.jobs.backend import (
    JobBackend,
    JobDescription,
    JobPlan,
    JobRequest,
    JobState,
    LogLine,
    NodeEnded,
    NodeJobStatus,
    RankStatus,
)
from gtrain.jobs.render import NodeContext
from gtrain.providers.slurm.states import SLURM_STATES, STATE_EXIT, STATE_REASON, render

if TYPE_CHECKING:
    from gtrain.providers.slurm.commands import SqueueRow
    from gtrain.providers.slurm.login import SlurmHost
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

_TOKEN_NAMES = ("HEAD", "PORT", "SELF", "IPS")
_RUNTIME = {"HEAD": "GTRAIN_HEAD_ADDR", "PORT": "GTRAIN_RDZV_PORT", "SELF": "GTRAIN_SELF_ADDR",
            "IPS": "GTRAIN_NODE_IPS_RT"}


def render_job(request: JobRequest, root: str, python: str, sbatch: list[str],
               runtime: str | None = None) -> dict[int, dict[str, str]]:
    """The job's files, by node: node 0 holds batch.sh and node.sh (job folder), every node K its
    ``node-K/`` scripts from the shared templates, with run-time values filled in by the shell. ``runtime``
    (job.image: pyxis, enroot or apptainer, see .containers) runs node K's setup and launcher in the image."""
    job = request.spec.job
    assert job is not None
    n = request.cluster.num_nodes
    job_root = f"{root}/jobs/{request.job_id}"
    workdir = f"{root}/workdir"
    salt = _secrets.token_hex(6)
    tokens = {k: f"GTRAINRT{salt}{k}" for k in _TOKEN_NAMES}
    common: dict[str, Any] = {"job_id": request.job_id, "cluster": request.cluster.name, "num_nodes": n,
                              "job_root": job_root, "ctr_runtime": "", "ctr_batch_env": [], "ctr_srun_flags": [],
                              "ctr_prelude": [], "ctr_wrap": ""}
    ctr = None
    if job.image and runtime:
        from gtrain.providers.slurm.containers import plan

        ctr = plan(job, runtime, root=root, job_root=job_root, workdir=workdir,
                   gpus=request.spec.resources.gpus_per_node > 0)
        common.update(ctr_runtime=ctr.runtime, ctr_batch_env=ctr.batch_env, ctr_srun_flags=ctr.srun_flags,
                      ctr_prelude=ctr.prelude, ctr_wrap=ctr.wrap)
    files: dict[int, dict[str, str]] = {0: {
        "batch.sh": render("slurm/batch.sh.j2", {**common, "sbatch": sbatch}),
        "node.sh": render("slurm/node.sh.j2", common),
    }}
    from gtrain.jobs.nodescript import launcher_of
    from gtrain.jobs.render import render_all

    launcher, nproc, options, notes = launcher_of(request.spec, job)
    for k in range(n):
        # the rendezvous host, port and the nodes' addresses are known only once Slurm has placed the job:
        # render with shell-safe tokens, then swap them for the batch shell's variables
        ctx = NodeContext(
            job_id=request.job_id, cluster=request.cluster.name, node_rank=k, num_nodes=n,
            node_ips=[tokens["IPS"]], node_addr=tokens["SELF"], master_addr=tokens["HEAD"],
            master_port=tokens["PORT"],  # type: ignore[arg-type]  # a token until run time
            nproc_per_node=nproc, job_dir=f"{job_root}/node-{k}", workdir=workdir,
            checkpoint_dir=f"{workdir}/{job.checkpoint_dir}", argv=job.argv,
            python=job.python or ("python3" if job.image else python),
            env=dict(job.env), secret_names=list(job.secrets), setup=job.setup, max_restarts=job.max_restarts,
            launcher=launcher, launcher_options=options, launcher_notes=notes)
        out = files.setdefault(k, {})
        for name, text in render_all(ctx).items():
            for key, tok in tokens.items():  # tokens are shell-safe words: never inside quotes
                text = text.replace(tok, '"${' + _RUNTIME[key] + '}"')
            out[f"node-{k}/{name}"] = text
        if ctr is not None:  # `launch --dry-run`: the node's exact container command first
            from gtrain.providers.slurm.containers import dry_run_lines

            out["command"] = dry_run_lines(ctr).replace("node.sh", f"{job_root}/node.sh").replace(
                "launch.sh", f"{job_root}/node-{k}/launch.sh") + "\n"
    return files


class SlurmBackend(JobBackend):
    name = "slurm"
    scheduler_packs = True
    provider: SlurmHost

    def __init__(self, provider: SlurmHost, cluster: Cluster) -> None:
        super().__init__(provider, cluster)

    @property
    def slurm(self) -> Any:
        return self.provider.slurm(self.cluster)

    @property
    def root(self) -> str:
        """The cluster's folder in shared_dir; ``<root>`` in a dry run of a spec whose cluster is not up yet."""
        return str((self.cluster.extra.get("slurm") or {}).get("root") or "<root>")

    def job_root(self, job_id: str) -> str:
        return f"{self.root}/jobs/{job_id}"

    # ---- plan and submit -------------------------------------------------------------------------

    def dryrun(self, request: JobRequest) -> JobPlan:
        from gtrain.providers.slurm.login import sbatch_lines
        from gtrain.providers.slurm.options import parse_options

        opts = parse_options(request.spec)
        sbatch = sbatch_lines(request.spec, opts, self.cluster, request.job_id, self.root)
        files = render_job(request, self.root, opts.python, sbatch, self._runtime(request))
        job = request.spec.job
        assert job is not None
        nproc = job.nproc_per_node or job.gpus_per_node or request.spec.resources.gpus_per_node or 1
        info = {"run": job.run, "argv": job.argv, "nproc_per_node": nproc, "num_nodes": self.num_nodes,
                "master": "first node of the allocation (scontrol show hostnames)",
                "checkpoint_dir": job.checkpoint_dir, "workdir": request.workdir, "env_names": sorted(job.env),
                "secret_names": list(job.secrets), "backend": self.name, "job_root": self.job_root(request.job_id)}
        return JobPlan(request, files, info)

    def _runtime(self, request: JobRequest) -> str | None:
        """job.image: the container runtime detected on this cluster (exit 2 naming what is missing)."""
        job = request.spec.job
        if job is None or not job.image:
            return None
        from gtrain.providers.slurm.containers import Found, choose, detect

        if "slurm" not in self.cluster.extra:  # a dry run with no cluster: nothing to ask; auto shows pyxis
            return choose(job, Found(pyxis=True, enroot=True, apptainer="apptainer", node="<node>"))
        return choose(job, detect(self.slurm, self.alloc))

    def submit(self, plan: JobPlan, report: Reporter | None = None) -> str:
        from gtrain.jobs.nodescript import secret_stdin
        from gtrain.sync.workdir import list_workdir

        rep = report or SILENT
        job = plan.request.spec.job
        assert job is not None
        runner = self.provider.login_runner(self.cluster)
        jroot = self.job_root(plan.job_id)
        local = Path(plan.request.workdir)
        files = list_workdir(local)
        dirs = " ".join(shlex.quote(f"{jroot}/node-{k}/logs") for k in range(self.num_nodes))
        runner.run(f"mkdir -p {shlex.quote(self.root)}/workdir {dirs}")
        moved = runner.put_files(local, files, f"{self.root}/workdir")  # once: every node sees shared_dir
        rep.info(f"workdir synced to {self.root}/workdir ({moved} of {len(files)} files changed)")
        for node_files in plan.files.values():
            for name, text in node_files.items():
                if name == "command":  # (the dry-run's summary; the scripts hold it)
                    continue
                runner.write_file(f"{jroot}/{name}", text.encode(), 0o700)
        alloc = self.alloc
        creds = job.image_credentials if job.image else None  # the registry password: in the job's env only
        env_in = secret_stdin(job) + (f"{creds.password_secret}={os.environ[creds.password_secret]}".encode()
                                      + b"\x00" if creds is not None else b"")
        try:
            if alloc:
                sid = self._start_step(plan, runner, alloc, env_in)
            else:
                sid = self.slurm.sbatch(f"{jroot}/batch.sh", env_in or None)
        except GtrainError:
            runner.run(f"rm -rf {shlex.quote(jroot)}", check=False)  # nothing submitted: nothing left
            raise
        store = self.provider.store
        store.update_job(plan.job_id, status=JobState.PENDING.value,
                         info={**store.get_job(plan.job_id).info, "slurm_job_id": sid,
                               **({"slurm_hold": True} if alloc else {})})
        rep.info(f"job {plan.job_id} started as a step of the held Slurm allocation {sid}" if alloc
                 else f"job {plan.job_id} submitted as Slurm job {sid}")
        return plan.job_id

    @property
    def alloc(self) -> str | None:
        """The allocation `up` holds (slurm.hold), else None: each launch is its own sbatch job."""
        got = self.cluster.extra.get("slurm", {}).get("alloc_id")
        return str(got) if got else None

    def _start_step(self, plan: JobPlan, runner: Any, alloc: str, secrets: bytes) -> str:
        from gtrain.providers.slurm import hold

        hold.check_alive(self.slurm, alloc)
        gpus = plan.request.spec.resources.gpus_per_node if plan.request.spec.resources.accelerators else 0
        jroot = self.job_root(plan.job_id)
        runner.write_file(f"{jroot}/step.sh", hold.step_script(plan.job_id, jroot, alloc, gpus).encode(), 0o700)
        runner.start_detached(self.slurm.shell_line(["exec", "bash", f"{jroot}/step.sh"])
                              + f" >>{shlex.quote(jroot)}/step.log 2>&1", stdin=secrets)
        return alloc

    # ---- state -----------------------------------------------------------------------------------

    def _row(self, job: JobRecord, max_age: float | None = None,
             step: dict[str, Any] | None = None) -> tuple[str | None, str]:
        """(Slurm state word, pending reason) of the job: ONE squeue call, or the provider's copy of one made
        less than ``max_age`` seconds ago; sacct when slurmctld has forgotten the job. A step of a held
        allocation: the allocation's row and the step wrapper's files (``step``, from the same read)."""
        sid = job.info.get("slurm_job_id")
        if not sid:
            return None, "never submitted"
        row: SqueueRow | None = self.provider.squeue_row(self.cluster, str(sid), max_age)
        if job.info.get("slurm_hold"):
            from gtrain.providers.slurm.hold import step_word

            return step_word(row.state if row else None, row.reason if row else "", step or {})
        if row is not None:
            return row.state, row.reason
        acct = self.slurm.sacct([str(sid)]) or {}
        if str(sid) in acct:
            return acct[str(sid)]["State"], ""
        return None, "slurmctld no longer remembers the job (and accounting is off)"

    def _files(self, job: JobRecord) -> dict[str, Any]:
        return dict(self.provider.login_call(self.cluster, "snapshot", self.job_root(job.id), str(self.num_nodes)))

    def describe(self, job: JobRecord, nodes: list[int] | None = None) -> JobDescription:
        from gtrain.jobs.status import job_exit_code

        snap = self._files(job)
        word, reason = self._row(job, max_age=0, step=snap.get("step"))
        statuses = [self._node(k, word, snap["nodes"].get(str(k), {})) for k in range(self.num_nodes)]
        if word is None:  # forgotten by slurmctld, no accounting: the nodes' own files are all we have
            from gtrain.jobs.status import aggregate

            state, code = aggregate(statuses)
        else:
            state = SLURM_STATES.get(word, JobState.UNKNOWN)
            code = None
            if state is JobState.SUCCEEDED:
                code = 0
            elif state is JobState.FAILED:
                code = STATE_EXIT.get(word) or job_exit_code(statuses)
            elif state is JobState.CANCELLED:
                code = STATE_EXIT.get(word, 130)
            reason = STATE_REASON.get(word, f"{word}: {reason}" if reason and reason != "None" else word)
        picked = [s for s in statuses if nodes is None or s.node in nodes]
        return JobDescription(job.id, state, code, picked, reason)

    def _node(self, k: int, word: str | None, raw: dict[str, Any]) -> NodeJobStatus:
        got = raw.get("state")
        st: dict[str, Any] = got if isinstance(got, dict) else {}
        own = str(st.get("state")) if st.get("state") else None
        ranks = [RankStatus(int(r), JobState.SUCCEEDED if int(v[0]) == 0 else JobState.FAILED, int(v[0]), float(v[1]))
                 for r, v in sorted((raw.get("ranks") or {}).items(), key=lambda kv: int(kv[0]))]
        failed = sorted((r.ended_at or 0.0, r.exit_code) for r in ranks if r.exit_code)
        code = failed[0][1] if failed else (0 if own == "succeeded" else None)
        slurm_state = SLURM_STATES.get(word or "", JobState.UNKNOWN) if word else None
        if slurm_state is not None and slurm_state.terminal:
            detail = own if word in ("COMPLETED", "FAILED") and own else (word or "").lower()
            state = slurm_state if word != "FAILED" or own != "succeeded" else JobState.SUCCEEDED
        elif slurm_state is JobState.PENDING or (slurm_state is JobState.RUNNING and own is None):
            state, detail = JobState.PENDING, (word or "pending").lower() if own is None else "pending"
        elif own is not None:
            state, detail = JobState.parse(own), own
        else:
            state, detail = JobState.UNKNOWN, "unknown"
        return NodeJobStatus(k, state, code, detail, None, ranks, False, {"slurm": word, **raw})

    def cancel(self, job: JobRecord, nodes: list[int] | None = None, grace_s: float = 10) -> None:
        """scancel the whole job (Slurm cannot end part of an allocation's step), then wait until Slurm says it
        has ended, so no process of it is left when this returns."""
        sid = job.info.get("slurm_job_id")
        if not sid:
            return
        if job.info.get("slurm_hold"):  # the job's step only: the allocation stays held
            from gtrain.providers.slurm.hold import cancel_step

            cancel_step(self.provider, self.cluster, self.slurm, str(sid), job.id, self.job_root(job.id))
        else:
            self.slurm.scancel([str(sid)])
        deadline = time.monotonic() + grace_s + 60
        while time.monotonic() < deadline:
            step = self._files(job).get("step") if job.info.get("slurm_hold") else None
            word, _ = self._row(job, max_age=0, step=step)
            if word is None or SLURM_STATES.get(word, JobState.UNKNOWN).terminal:
                return
            time.sleep(0.2)

    # ---- output ----------------------------------------------------------------------------------

    def log_iter(self, job: JobRecord, node: int, rank: int | None = None, *, follow: bool = False,
                 tail: int | None = None, since: int = 0) -> Iterator[LogLine | NodeEnded]:
        ndir = f"{self.job_root(job.id)}/node-{node}"
        offsets: dict[str, int] = {}
        seen = 0
        said = ""
        first = True
        step = self._files(job).get("step") if follow and job.info.get("slurm_hold") else None
        while True:
            word, reason = self._row(job, max_age=1.0, step=step) if follow else (None, "")
            state = SLURM_STATES.get(word or "", JobState.UNKNOWN)
            done = not follow or state.terminal or word is None
            got = self.provider.login_call(self.cluster, "read", ndir, json.dumps(offsets),
                                           str(-1 if tail is None or not first else tail), "1" if done else "0")
            first = False
            offsets = dict(got["offsets"])
            step = got.get("step")
            for tag, text in got["lines"]:
                r = int(tag) if tag.isdigit() else None
                seen += 1
                if seen > since and (rank is None or r == rank):
                    yield LogLine(node, r, text)
            if follow and state is JobState.PENDING and node == 0 and said != reason:
                said = reason
                yield LogLine(node, None, f"[gtrain] Slurm job {job.info.get('slurm_job_id')} is {word} "
                                          f"(reason: {reason})")
            if done:
                if follow:
                    desc = self.describe(job, [node])
                    n = desc.nodes[0] if desc.nodes else None
                    why = desc.reason if word in STATE_REASON and word != "CANCELLED" else None
                    yield NodeEnded(node, n.state if n else desc.state, n.detail if n else desc.reason,
                                    why if node == 0 else None)
                return
            time.sleep(0.25)
