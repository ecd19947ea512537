"""The login side of a Slurm cluster, below :mod:`.provider` and its helpers (:mod:`.adopt`, :mod:`.backend`,
:mod:`.cost`, :mod:`.hold`, :mod:`.runners`), which import it and never the provider: the runner that reaches
the login side (this machine, or a login node over SSH), what a cluster's record keeps of it, the ``#SBATCH``
options of a job, and :class:`SlurmHost`, what those helpers use of the provider that hands them work
(:class:`~gtrain.providers.slurm.provider.SlurmProvider` is one)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

from gtrain.errors import ConfigError
from gtrain.providers.slurm.options import SlurmOptions

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.slurm.commands import Slurm, SqueueRow
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, StateStore


class SlurmHost(Protocol):
    """What the slurm helpers use of their provider: its state store and reporter, the cluster's node runners
    (a :class:`~gtrain.jobs.backend.NodeProvider`), and the login side's ``slurm`` commands, one-shot calls,
    cached squeue rows and running job."""

    store: StateStore
    report: Reporter

    def runners(self, cluster: Cluster) -> list[Runner]: ...

    def login_runner(self, cluster: Cluster) -> Runner: ...

    def slurm(self, cluster: Cluster) -> Slurm: ...

    def login_call(self, cluster: Cluster, func: str, *args: str) -> Any: ...

    def squeue_row(self, cluster: Cluster, sid: str, max_age: float | None) -> SqueueRow | None: ...

    def running_slurm_job(self, cluster: Cluster, max_age: float | None = None) -> str | None: ...


def runner_for(opts: dict[str, Any], root: str, label: str, report: Reporter, *, tofu: bool = False) -> Runner:
    """A runner on the login side that ``opts`` (a cluster's slurm record, or the spec's options) names: this
    machine when no ``login``, else the login node over SSH (its host key trusted on first use when ``tofu``)."""
    if not opts.get("login"):
        from gtrain.remote.local import LocalRunner

        return LocalRunner(root, label=label, address="127.0.0.1", python=opts.get("python") or "python3")
    from gtrain.remote.ssh import SSHRunner, SSHTarget, pin_host_key

    user, host, port = SlurmOptions(login=opts["login"]).login_parts()
    if opts.get("login_host_key") and tofu:
        pin_host_key(host, port, str(opts["login_host_key"]))
    ident = opts.get("login_identity_file")

    target = SSHTarget(host=host, port=port, user=user or "root",
                       identity_file=os.path.expanduser(ident) if ident else None)
    return SSHRunner(target, root=root, label=label, address=host, python=opts.get("python") or "python3",
                     tofu=tofu, on_new_host_key=lambda h, p, kt, fp: report.info(
                         f"trusting login node {h}:{p} on first use: {kt} {fp}"))


def login_info(opts: SlurmOptions, root: str) -> dict[str, Any]:
    """What the cluster's record keeps of its slurm section (how the login side is reached; no secret)."""
    return {"root": root, "login": opts.login, "conf": opts.conf, "python": opts.python,
            "login_identity_file": opts.login_identity_file, "partition": opts.partition,
            "keep_files": bool(opts.keep_files)}


def sbatch_lines(spec: ClusterSpec, opts: SlurmOptions, cluster: Cluster | None, job_id: str,
                 root: str) -> list[str]:
    """The #SBATCH options of a job of this spec (what `up --dry-run` shows, what sbatch gets)."""
    lines = [f"--job-name={job_id}", f"--nodes={spec.num_nodes}", "--ntasks-per-node=1",
             f"--output={root}/jobs/{job_id}/batch.log", "--open-mode=append"]
    for flag, value in (("partition", opts.partition), ("account", opts.account), ("qos", opts.qos),
                        ("time", opts.time_limit(spec.policies.max_hours)), ("constraint", opts.constraint)):
        if value:
            if any(c.isspace() for c in value):
                raise ConfigError(f"slurm.{flag}: {value!r} has white space", field=f"slurm.{flag}")
            lines.append(f"--{flag}={value}")
    from gtrain.spec.queue import job_gpus

    gpus = job_gpus(spec, spec.job)  # job.gpus_per_node: Slurm packs jobs on a node's GPUs itself
    if gpus:
        gpu = (spec.resources.gpu_name or "").lower()
        lines.append(f"--gres=gpu:{gpu}:{gpus}" if opts.gres_style == "gres" and gpu else f"--gpus-per-node={gpus}")
    if opts.exclusive:
        lines.append("--exclusive")
    lines.append("--requeue" if opts.requeue else "--no-requeue")
    lines.append(f"--signal={opts.signal}")
    if cluster is not None:
        lines.append(f"--comment=gtrain:{cluster.id}")
    lines += [ln.strip().removeprefix("#SBATCH").strip() for ln in opts.extra_sbatch]
    return lines
