"""``slurm.hold: true``: `up` takes an allocation of ``num_nodes`` (``salloc --no-shell``: a job with no batch
step that owns its nodes until its time limit or ``scancel``) and every launch runs as a step inside it.

A launch writes the usual job files plus ``step.sh`` and starts ``step.sh`` detached on the login side: it sets
``SLURM_JOB_ID`` to the allocation (so ``srun`` there makes a step of it, not a new job), the node list and
CPUs per node from ``scontrol show job``, a rendezvous port of the launch's own, then runs the same
``batch.sh`` a submitted job runs and writes ``step.exit`` ("rc time"). The job's state comes from those
files and the allocation's squeue row (:func:`step_word`); cancel scancels the job's step (named after the
gtrain job id), not the allocation. `down` scancels the allocation (it carries the cluster's ``--comment``).
The cost counts the allocation's whole held time, not the steps'.

Missing on purpose: a held allocation that reaches its time limit is not renewed (the next launch fails
saying so: `down` and `up` again), and a step's srun lives on the login side, so a login node that reboots
ends the running step (the job then reads FAILED: the wrapper is gone without an exit file).
"""

from __future__ import annotations

import re
import shlex
import zlib
from typing import TYPE_CHECKING, Any

from gtrain.errors import ProviderError

if TYPE_CHECKING:
    from gtrain.providers.slurm.commands import Slurm
    from gtrain.providers.slurm.login import SlurmHost
    from gtrain.providers.slurm.options import SlurmOptions
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

#: sbatch-only options a salloc of the allocation does without (no batch script, no batch shell to signal)
_BATCH_ONLY = ("--output", "--open-mode", "--requeue", "--no-requeue", "--signal")
_GRANTED = re.compile(r"[Gg]ranted job allocation (\d+)")


def salloc_options(lines: list[str]) -> list[str]:
    out: list[str] = []
    for ln in lines:
        if not ln.startswith(_BATCH_ONLY):
            out += shlex.split(ln)
    return out


def take_allocation(provider: SlurmHost, spec: ClusterSpec, opts: SlurmOptions, cluster: Cluster,
                    slurm: Slurm, root: str) -> str:
    """``salloc --no-shell`` of the cluster's nodes (it waits while the allocation is pending, saying why);
    the allocation's id, recorded as a resource of the cluster so `down` releases it."""
    from gtrain.providers.slurm.commands import translate
    from gtrain.providers.slurm.login import sbatch_lines

    lines = sbatch_lines(spec, opts, cluster, f"gtrain-hold-{cluster.name}", root)
    rid = provider.store.record_resource(cluster.id, "slurm-alloc", f"{opts.login or 'local'}:salloc")
    said: list[str] = []

    def line(text: str) -> None:
        said.append(text)
        provider.report.info(text.strip())

    rc = slurm.runner.stream(slurm.shell_line(["salloc", "--no-shell", *salloc_options(lines)]), line, timeout=None)
    m = _GRANTED.search("\n".join(said))
    if rc != 0 or m is None:
        provider.store.mark_resource(rid, "not-created")
        raise translate("\n".join(said), "salloc", submitting=True)
    alloc = m.group(1)
    provider.store.mark_resource(rid, "created", ref=f"{opts.login or 'local'}:slurm-job-{alloc}")
    provider.report.info(f"holding Slurm allocation {alloc} ({spec.num_nodes} node(s)) until `gtrain down`")
    return alloc


def step_script(job_id: str, job_root: str, alloc: str, gpus: int) -> str:
    from gtrain.providers.slurm.states import render

    port = 20000 + (int(alloc) + zlib.crc32(job_id.encode())) % 20000
    return render("slurm/step.sh.j2", {"job_id": job_id, "job_root": job_root, "alloc": alloc, "gpus": gpus,
                                        "port": port})


def check_alive(slurm: Slurm, alloc: str) -> None:
    """The held allocation must still be RUNNING for a step to start in it."""
    rows = slurm.squeue([alloc]) or {}
    row = rows.get(alloc)
    if row is None or row.state != "RUNNING":
        word = row.state if row else "gone (slurmctld no longer knows it)"
        raise ProviderError(f"slurm: the held allocation {alloc} is {word}, nothing was launched",
                            hint="`gtrain down` then `gtrain up` takes a new one (slurm.hold)")


def step_word(alloc_word: str | None, reason: str, step: dict[str, Any]) -> tuple[str | None, str]:
    """The job's state in Slurm's words, from the allocation's squeue row and the step wrapper's files."""
    from gtrain.providers.slurm.states import SLURM_STATES

    done = step.get("exit")
    if done:
        rc = int(done[0])
        return ("COMPLETED" if rc == 0 else "CANCELLED" if step.get("cancelled") else "FAILED"), ""
    if alloc_word is None or SLURM_STATES.get(alloc_word) is None or SLURM_STATES[alloc_word].terminal:
        return alloc_word, f"the held allocation ended ({alloc_word or 'forgotten'})"
    if step.get("started") and not step.get("alive"):
        if step.get("cancelled"):
            return "CANCELLED", ""
        return "FAILED", "the step's srun on the login side is gone (no exit recorded)"
    if not step.get("started"):
        return "PENDING", "the step is starting"
    return "RUNNING", reason


def cancel_step(provider: SlurmHost, cluster: Cluster, slurm: Slurm, alloc: str, job_id: str,
                job_root: str) -> None:
    """Mark the job cancelled, scancel its step(s) in the allocation (not the allocation); the wrapper's
    process group too when no step has been made yet."""
    runner = provider.login_runner(cluster)
    runner.run(f"touch {shlex.quote(job_root)}/cancelled", check=False)
    res = slurm.run(["squeue", "-h", "-s", "-j", alloc, "-o", "%i|%j"], check=False)
    steps = [p[0] for p in (ln.strip().split("|", 1) for ln in res.stdout.splitlines()) if len(p) == 2
             and p[1] == job_id]
    if steps:
        slurm.scancel(steps)
    else:
        pid = f"$(cat {shlex.quote(job_root)}/step.pid 2>/dev/null)"
        runner.run(f'p={pid}; [ -n "$p" ] && kill -TERM -- -"$p" 2>/dev/null; true', check=False)
