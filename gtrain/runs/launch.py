"""Launching a job: check what can be checked before anything is touched, then hand the job to the
cluster's backend -- dry run (the materialised plan) or submit (exactly that plan)."""

from __future__ import annotations

import os
import secrets as _secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, GtrainError, JobConflict
from gtrain.jobs.backend import JobRequest, JobState
from gtrain.jobs.status import active_job, cancel_job
from gtrain.runs.ship import prepare as prepare_checkpoints
from gtrain.state import Cluster

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec import ClusterSpec, Job

DRY_RUN_ID = "<job-id>"


def new_job_id(cluster: str) -> str:
    return f"{cluster}-{time.strftime('%Y%m%d-%H%M%S')}-{_secrets.token_hex(2)}"


def check_job(spec: ClusterSpec, *, dry_run: bool = False) -> tuple[Job, str]:
    """Validate what can be checked before anything is touched: workdir, script, secrets. A dry run needs the
    secrets' names only (nothing is sent): their values are not asked for."""
    if spec.job is None:
        raise ConfigError("the spec has no job section", hint="add `job: {run: train.py}`", field="job")
    job = spec.job
    workdir = spec.workdir_path()
    if not workdir.is_dir():
        raise ConfigError(f"job.workdir: {str(workdir)!r} is not a directory",
                          hint="point job.workdir at the folder holding your training script", field="job.workdir")
    argv = job.argv
    if not argv:
        raise ConfigError("job.run: no script given", hint="e.g. run: train.py --steps 50", field="job.run")
    script = argv[0]
    if not script.startswith("-") and ".." in script.split("/"):
        raise ConfigError(f"job.run: script {script!r} is outside the workdir ('..')",
                          hint="only job.workdir is copied to the nodes: move the script into it", field="job.run")
    if not script.startswith("-") and not os.path.isabs(script) and not (workdir / script).is_file():
        raise ConfigError(
            f"job.run: script {script!r} not found in workdir {str(workdir)!r}",
            hint="job.run starts with a path relative to job.workdir, e.g. train.py", field="job.run",
        )
    ckpt = workdir / job.checkpoint_dir
    if ckpt.exists() and not ckpt.is_dir():
        raise ConfigError(f"job.checkpoint_dir: {job.checkpoint_dir!r} is a file in the workdir, not a folder",
                          hint="name a folder (default: checkpoints)", field="job.checkpoint_dir")
    from gtrain.jobs.nodescript import launcher_of

    launcher_of(spec, job)  # the launcher's own checks (its config file): `run` makes them before `up`
    missing = [] if dry_run else [n for n in job.secrets if n not in os.environ]
    if missing:
        raise ConfigError(f"job.secrets: {', '.join(missing)} not set in this environment",
                          hint="export them before launching; their values go to the nodes, never to disk",
                          field="job.secrets")
    if job.image:  # job.container.options gtrain owns, the registry password's variable (exit 2, nothing made)
        from gtrain.containers.pull import check_credentials
        from gtrain.containers.runtime import check_options

        if job.container is not None:
            check_options(job.container)
        if not dry_run:
            check_credentials(job)
    from gtrain.redact import register_secrets
    from gtrain.tracking import secret_names

    register_secrets([*job.secrets, *secret_names(job),
                      *([job.image_credentials.password_secret] if job.image_credentials else [])])
    # from here on, their values are masked in all gtrain stores or prints
    return job, str(workdir)


@dataclass
class LaunchResult:
    job_id: str
    cluster: str
    status: str
    scripts: dict[int, dict[str, str]] = field(default_factory=dict)
    master: str = ""
    backend: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "cluster": self.cluster, "status": self.status, "master": self.master,
                "backend": self.backend}


def launch(cluster: Cluster, spec: ClusterSpec, ctx: Context, *, force: bool = False,
           dry_run: bool = False, replace_bad: bool = False, fresh: bool = False, queue: bool = False,
           priority: int | None = None) -> LaunchResult:
    _job, local_workdir = check_job(spec, dry_run=dry_run)
    queue = queue or _job.queue  # the cluster's queue: the job waits its turn (docs/queue.md)
    prio = _job.priority if priority is None else priority
    if cluster.status == "stopped" and not dry_run:
        raise ConfigError(f"cluster {cluster.name} is stopped: nothing can run on its nodes",
                          hint=f"`gtrain start {cluster.name}` brings them back", field="CLUSTER")
    if replace_bad and not ctx.provider(cluster.provider).can_replace_nodes:
        from gtrain.providers.base import cannot_replace

        raise cannot_replace(cluster.provider)
    backend = ctx.backend(cluster)
    from gtrain.spec.queue import problem as queue_problem

    # job.gpus_per_node: what a node can give (a scheduler packs jobs itself: only its request is mapped)
    if found := queue_problem(spec, _job, cluster.num_nodes, scheduler=backend.scheduler_packs):
        raise ConfigError(found[1], field=found[0])
    if queue:
        from gtrain.jobs.queue import check_queueable

        check_queueable(backend, _job)
    if dry_run:
        plan = backend.dryrun(JobRequest(cluster, spec, DRY_RUN_ID, local_workdir))
        return LaunchResult(DRY_RUN_ID, cluster.name, "dry-run", plan.files, str(plan.info.get("master", "")),
                            backend.name)

    from gtrain.locks import cluster_lock

    with cluster_lock(ctx.store.home, cluster.name, "launch"):  # one job start at a time per cluster
        if queue:
            return _enqueue(cluster, spec, ctx, backend, local_workdir, prio, fresh=fresh)
        active = active_job(cluster, ctx)
        if active is not None:
            if not force:
                raise JobConflict(f"job {active.id} is still {active.status} on {cluster.name}",
                                  hint=f"wait for it (`gtrain logs {cluster.name} -f`), "
                                       f"`gtrain cancel {cluster.name}`, or launch with --force to cancel it")
            ctx.report.info(f"cancelling {active.id} (--force)")
            cancel_job(cluster, active, ctx)
        from gtrain.runs.preflight import preflight

        if preflight(cluster, spec, ctx, replace_bad=replace_bad) is not None:  # a failed node: exit 1 here
            backend = ctx.backend(cluster)  # --replace-bad may have made new nodes: their runners, not the old

        job_id = new_job_id(cluster.name)
        from gtrain.tracking import start_mlflow_run

        if run_env := start_mlflow_run(_job, job_id):  # the job's parent run: kept in the job's recorded spec,
            spec = spec.model_copy(deep=True)  # so a recovery's ranks log to the same run
            assert spec.job is not None
            spec.job.env = {**spec.job.env, **run_env}
        request = backend.reserve(JobRequest(cluster, spec, job_id, local_workdir))
        plan = backend.dryrun(request)
        prepare_checkpoints(plan, backend, ctx.report, fresh=fresh)  # a store refusing writes stops here
        ctx.store.create_job(cluster.id, plan.job_id, dict(plan.info))
        try:
            backend.submit(plan, ctx.report)
        except BaseException as exc:
            reason = exc.message if isinstance(exc, GtrainError) else type(exc).__name__
            ctx.store.update_job(plan.job_id, status=JobState.FAILED.value, exit_code=1,
                                 info={**ctx.store.get_job(plan.job_id).info, "final": True, "error": reason})
            raise
    ctx.store.update_job(plan.job_id, status=JobState.RUNNING.value)
    ctx.event(cluster, "launch", job=plan.job_id, msg=str(plan.info.get("run", "")))
    from gtrain.runs.attach import write_record

    write_record(ctx, cluster)  # node 0 keeps the cluster's spec and jobs, for a `gtrain attach` elsewhere
    master = str(plan.info.get("master", ""))
    ctx.report.info(f"job {plan.job_id} started on {cluster.num_nodes} node(s), rendezvous {master}")
    return LaunchResult(plan.job_id, cluster.name, JobState.RUNNING.value, master=master, backend=backend.name)


def _enqueue(cluster: Cluster, spec: ClusterSpec, ctx: Context, backend: Any, local_workdir: str, priority: int,
             *, fresh: bool) -> LaunchResult:
    """``launch --queue``: the job shipped and put in the cluster's queue on its nodes, whatever runs there now
    (no preflight: the GPUs may be busy with the job before it); recorded ``pending`` with ``info.queued``."""
    from gtrain.jobs.queue import enqueue, reserve

    job_id = new_job_id(cluster.name)
    request = reserve(backend, JobRequest(cluster, spec, job_id, local_workdir))
    plan = backend.dryrun(request)
    prepare_checkpoints(plan, backend, ctx.report, fresh=fresh)
    ctx.store.create_job(cluster.id, plan.job_id, {**plan.info, "queued": True, "priority": priority})
    try:
        seq = enqueue(backend, plan, priority, ctx.report)
    except BaseException as exc:
        reason = exc.message if isinstance(exc, GtrainError) else type(exc).__name__
        ctx.store.update_job(plan.job_id, status=JobState.FAILED.value, exit_code=1,
                             info={**ctx.store.get_job(plan.job_id).info, "final": True, "error": reason})
        raise
    ctx.store.update_job(plan.job_id, status=JobState.PENDING.value,
                         info={**ctx.store.get_job(plan.job_id).info, "queued_at": seq})
    ctx.event(cluster, "launch", job=plan.job_id, msg=f"queued (priority {priority}): {plan.info.get('run', '')}")
    from gtrain.runs.attach import write_record

    write_record(ctx, cluster)
    ctx.report.info(f"job {plan.job_id} queued on {cluster.num_nodes} node(s), priority {priority}: the nodes "
                    f"start it when its turn comes (`gtrain queue {cluster.name}`)")
    return LaunchResult(plan.job_id, cluster.name, "queued", master=str(plan.info.get("master", "")),
                        backend=backend.name)
