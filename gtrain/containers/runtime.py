"""The container around a node's launcher (VM providers: local, ssh, aws, gcp), as argv built here and rendered
into ``launch.sh`` through the node-script seam (``templates/_launcher.sh.j2``).

One container per node, named by cluster, job and node and labelled ``gtrain.cluster`` / ``gtrain.job``, so
``cancel``/``down`` find and remove it whatever happened to the launcher that started it. It shares the host's
network, IPC and PID namespace (c10d names a rendezvous participant by host name and pid: two containers on one
host would otherwise both be pid 7 of the same host name), gets every GPU when the node has some, unlimited
memlock and InfiniBand devices where the node has them, a large ``/dev/shm``, and the node's workdir and job
folder at the same paths, so every path in the scripts means the same inside and out. Secrets never reach its
argv or ``docker inspect``: they go to the container on stdin (see ``templates/_launcher.sh.j2``).
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError
from gtrain.spec.containers import refuse_option

if TYPE_CHECKING:
    from gtrain.spec import Job
    from gtrain.spec.containers import ContainerOptions

SHM_SIZE = "16g"
LABEL_CLUSTER = "gtrain.cluster"
LABEL_JOB = "gtrain.job"
VM_RUNTIMES = ("docker", "podman")


def check_options(opts: ContainerOptions) -> None:
    """Exit 2 naming the option, before anything is touched, for a flag gtrain owns (the spec's model refuses
    them as it reads the spec: this holds for options set after it)."""
    for o in opts.options:
        refuse_option(o)


def vm_runtime(job: Job) -> str:
    """The runtime command on a VM node: ``auto`` is docker (podman takes the same flags: name it)."""
    rt = job.container.runtime if job.container else "auto"
    if rt == "auto":
        return "docker"
    if rt not in VM_RUNTIMES:
        raise ConfigError(f"job.container.runtime: {rt!r} runs only on Slurm (pyxis/enroot/apptainer)",
                          hint="on VM providers use docker or podman (or auto)", field="job.container.runtime")
    return rt


def container_name(cluster: str, job_id: str, node_rank: int) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"gtrain-{cluster}-{job_id}-n{node_rank}")
    return safe[:200]


def run_argv(job: Job, *, cluster: str, job_id: str, node_rank: int, gpus: bool, mounts: list[str],
             workdir: str, suffix: str = "") -> list[str]:
    """``docker run ... IMAGE`` for one node; the command to run inside follows it."""
    assert job.image is not None
    rt = vm_runtime(job)
    # podman refuses --init with the host's PID namespace and --shm-size with the host's IPC (where /dev/shm is
    # the host's anyway); docker takes both
    argv = [rt, "run", "--rm", "-i", *(["--init"] if rt == "docker" else []),
            "--name", container_name(cluster, job_id, node_rank) + suffix,
            "--label", f"{LABEL_CLUSTER}={cluster}", "--label", f"{LABEL_JOB}={job_id}",
            "--network", "host", "--ipc", "host", "--pid", "host", "--ulimit", "stack=67108864",
            *(["--shm-size", SHM_SIZE] if rt == "docker" else [])]
    if gpus:
        argv += ["--gpus", "all"]
    seen: set[str] = set()
    for m in mounts:
        if m not in seen:
            seen.add(m)
            argv += ["-v", f"{m}:{m}"]
    for extra in job.container.mounts if job.container else []:
        argv += ["-v", f"{extra.host}:{extra.path}" + (":ro" if extra.read_only else "")]
    argv += ["-w", workdir]
    argv += list(job.container.options) if job.container else []
    argv.append(job.image)
    return argv


# What launch.sh adds on the node, where the node allows it: unlimited memlock (RDMA/NCCL pinned memory) when the
# hard limit there is unlimited (runc cannot raise it past that without CAP_SYS_RESOURCE), and the InfiniBand
# devices (EFA/IB) when the node has them.
NODE_FLAGS = ('__gtrain_dev=(); [ "$(ulimit -H -l)" = unlimited ] && __gtrain_dev+=(--ulimit memlock=-1)\n'
              '[ -d /dev/infiniband ] && __gtrain_dev+=(--device /dev/infiniband --cap-add IPC_LOCK)\n'
              '[ "$(ulimit -H -l)" = unlimited ] || echo "[gtrain] warning: memlock is limited to $(ulimit -H -l) KB '
              'on this node; the container keeps that limit"')


def cleanup_command(job_dir: str) -> str:
    """Remove the job's container on this node (the ``container`` file ``launch.sh`` wrote names it)."""
    f = shlex.quote(f"{job_dir}/container")
    return (f'if [ -f {f} ]; then read -r __rt __name < {f}; '
            f'"$__rt" rm -f "$__name" >/dev/null 2>&1; '
            f'__ids=$("$__rt" ps -aq --filter "label={LABEL_JOB}=$(basename {shlex.quote(job_dir)})"); '
            f'[ -n "$__ids" ] && "$__rt" rm -f $__ids >/dev/null 2>&1; fi; true')


def cluster_cleanup_command(cluster: str) -> str:
    """Remove every container of ``cluster`` on this node, found by its label (``down``: even when the job's
    records or folder are gone). Both VM runtimes are asked, where installed."""
    label = shlex.quote(f"label={LABEL_CLUSTER}={cluster}")
    return (f'for __rt in docker podman; do command -v "$__rt" >/dev/null 2>&1 || continue; '
            f'__ids=$("$__rt" ps -aq --filter {label} 2>/dev/null); '
            f'[ -n "$__ids" ] && "$__rt" rm -f $__ids >/dev/null 2>&1; done; true')
