"""``job.image`` on Slurm: pyxis (``srun --container-image``), else enroot, else apptainer -- detected on the
cluster, never guessed; ``job.container.runtime`` picks one (``enroot`` means pyxis where the site has it).

Detection (:func:`detect`): pyxis is a SPANK plugin of ``srun``, so ``srun --help`` lists ``--container-image``
where it is installed (github.com/NVIDIA/pyxis, "Usage"); enroot and apptainer (or singularity) are programs on
the compute nodes, looked up with ``command -v`` on one node through ``srun``.

What each runtime renders (:func:`plan`):

- pyxis: the batch script's ``srun`` takes ``--container-image`` / ``--container-mounts`` /
  ``--container-workdir``; node.sh, setup and the launcher run inside the image on every node. Registry logins go
  through enroot's credentials file (netrc format, ``$ENROOT_CONFIG_PATH/.credentials``); its password field is
  ``$NAME`` of the secret, which enroot substitutes from the environment (github.com/NVIDIA/enroot,
  doc/cmd/import.md), so the file holds no secret.
- enroot: node.sh imports the image once into the shared folder (``enroot import -o X.sqsh docker://...``) and
  runs setup and the launcher with ``enroot start`` of that image, the job's environment passed by name
  (``--env NAME``), the workdir and job folder mounted.
- apptainer: node.sh runs setup and the launcher with ``apptainer exec --nv`` of ``docker://IMAGE`` (apptainer
  caches the converted image), the folders bound; the registry login goes in ``APPTAINER_DOCKER_USERNAME`` /
  ``APPTAINER_DOCKER_PASSWORD`` (environment only; apptainer.org/docs/user/main/docker_and_oci.html).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.spec.containers import IMAGE_RE, _is_host, image_registry

if TYPE_CHECKING:
    from gtrain.spec import Job

SLURM_RUNTIMES = ("pyxis", "enroot", "apptainer")
PROBE = "for c in enroot apptainer singularity; do command -v \"$c\" >/dev/null 2>&1 && echo \"have $c\"; done; true"


@dataclass
class Found:
    """What the cluster has: pyxis in srun, enroot / apptainer (or singularity) on a compute node."""

    pyxis: bool = False
    enroot: bool = False
    apptainer: str = ""  # the command: apptainer or singularity
    node: str = ""  # where the programs were looked up

    def words(self) -> str:
        have = [w for w, ok in (("pyxis", self.pyxis), ("enroot", self.enroot), (self.apptainer, self.apptainer))
                if ok]
        return ", ".join(have) or "none"


def detect(slurm: Any, alloc: str | None) -> Found:
    """Ask the cluster: ``srun --help`` on the login side, ``command -v`` on one compute node."""
    found = Found()
    res = slurm.runner.run(slurm.shell_line(["srun", "--help"]), timeout=60, check=False)
    found.pyxis = "--container-image" in res.stdout + res.stderr
    where = ["--jobid", alloc, "--overlap"] if alloc else ["--time=5"]
    res = slurm.runner.run(slurm.shell_line(["srun", *where, "-N1", "-n1", "--quiet", "bash", "-c",
                                             f"hostname; {PROBE}"]), timeout=300, check=False)
    lines = res.stdout.split("\n")
    found.node = lines[0].strip() if res.rc == 0 else "(srun failed: " + (res.stderr.strip()[-300:] or "?") + ")"
    have = {ln.split(" ", 1)[1].strip() for ln in lines if ln.startswith("have ")}
    found.enroot = "enroot" in have
    found.apptainer = "apptainer" if "apptainer" in have else ("singularity" if "singularity" in have else "")
    return found


def choose(job: Job, found: Found) -> str:
    """The runtime this job uses on this cluster, or exit 2 naming what is missing."""
    want = job.container.runtime if job.container else "auto"
    missing = (f"this Slurm cluster has no container runtime for job.image: srun has no --container-image (pyxis), "
               f"and neither enroot nor apptainer/singularity is on the compute node {found.node}")
    if want in ("docker", "podman"):
        raise ConfigError(f"job.container.runtime: {want!r} runs only on VM providers (local, ssh, aws, gcp)",
                          hint="on Slurm use auto, enroot (pyxis where the site has it) or apptainer",
                          field="job.container.runtime")
    if want == "auto":
        if found.pyxis:
            return "pyxis"
        if found.enroot:
            return "enroot"
        if found.apptainer:
            return "apptainer"
        raise ConfigError(missing, hint="ask the site for pyxis+enroot or apptainer, or remove job.image",
                          field="job.image")
    if want == "enroot":
        if found.pyxis or found.enroot:
            return "pyxis" if found.pyxis else "enroot"
        raise ConfigError(f"job.container.runtime: enroot is not on this cluster (srun has no --container-image, "
                          f"no enroot on {found.node}; found: {found.words()})",
                          hint="use runtime: auto, or ask the site for pyxis/enroot", field="job.container.runtime")
    if not found.apptainer:
        raise ConfigError(f"job.container.runtime: apptainer is not on this cluster (neither apptainer nor "
                          f"singularity on {found.node}; found: {found.words()})",
                          hint="use runtime: auto, or ask the site for apptainer", field="job.container.runtime")
    return "apptainer"


def enroot_uri(image: str) -> str:
    """enroot's reference: ``docker://[REGISTRY#]IMAGE[:TAG]`` (the registry before ``#``); pyxis takes it
    without ``docker://`` (``--container-image=[USER@][REGISTRY#]IMAGE[:TAG]``, github.com/NVIDIA/pyxis)."""
    m = IMAGE_RE.match(image)
    domain = m.group("domain") if m else None
    if domain and _is_host(domain):
        return f"docker://{domain}#{image[len(domain) + 1:]}"
    return f"docker://{image}"


@dataclass
class SlurmContainer:
    """What render_job puts in batch.sh (``srun_flags``, ``batch_env``) and node.sh (``prelude``, ``wrap``)."""

    runtime: str
    srun_flags: list[str] = field(default_factory=list)
    batch_env: list[str] = field(default_factory=list)  # shell lines in batch.sh before srun
    prelude: list[str] = field(default_factory=list)  # shell lines in node.sh before setup
    wrap: str = ""  # node.sh runs `$wrap bash SCRIPT` for setup and the launcher


def plan(job: Job, runtime: str, *, root: str, job_root: str, workdir: str, gpus: bool) -> SlurmContainer:
    assert job.image is not None
    extra = job.container.mounts if job.container else []
    opts = list(job.container.options) if job.container else []
    binds = [(workdir, workdir, False), (job_root, job_root, False)] + [(m.host, m.path, m.read_only) for m in extra]
    creds = job.image_credentials
    out = SlurmContainer(runtime)
    if runtime in ("pyxis", "enroot") and creds is not None:
        conf = f"{job_root}/enroot"
        line = f"machine {image_registry(job.image)} login {creds.username} password ${creds.password_secret}"
        out.batch_env = [f"mkdir -p {shlex.quote(conf)} && printf '%s\\n' {shlex.quote(line)} > "
                         f"{shlex.quote(conf + '/.credentials')}  # the secret's NAME: enroot substitutes it",
                         f"export ENROOT_CONFIG_PATH={shlex.quote(conf)}"]
    if runtime == "pyxis":
        mounts = ",".join(f"{h}:{p}" + (":ro" if ro else "") for h, p, ro in binds)
        ref = enroot_uri(job.image).removeprefix("docker://")
        out.srun_flags = [f"--container-image={ref}", f"--container-mounts={mounts}",
                          f"--container-workdir={workdir}", *opts]
        return out
    if runtime == "enroot":
        sq = f"{root}/images/{re.sub(r'[^A-Za-z0-9_.-]', '_', job.image)}.sqsh"
        q = shlex.quote(sq)
        out.prelude = [f"mkdir -p {shlex.quote(root + '/images')}",
                       f"if [ ! -f {q} ]; then enroot import -o {q}.$K.tmp {shlex.quote(enroot_uri(job.image))} "
                       f"&& mv -f {q}.$K.tmp {q} || {{ echo \"[gtrain] node $K: enroot import of "
                       f"{job.image} failed\"; exit 4; }}; fi",
                       '__envs=(); while IFS= read -r __v; do case "$__v" in PATH|HOME|PWD|OLDPWD|SHLVL|_|LD_*) ;; '
                       '*) __envs+=(--env "$__v") ;; esac; done < <(compgen -e)  # the job\'s env, by NAME']
        parts = ["enroot", "start"]
        for h, p, ro in binds:
            parts += ["--mount", shlex.quote(f"{h}:{p}" + (":ro" if ro else ""))]
        out.wrap = " ".join([*parts, '"${__envs[@]}"', *map(shlex.quote, opts), q])
        return out
    # apptainer (or singularity): the same flags
    if creds is not None:
        out.prelude = [f"export APPTAINER_DOCKER_USERNAME={shlex.quote(creds.username)} "
                       f'APPTAINER_DOCKER_PASSWORD="${{{creds.password_secret}}}"',
                       'export SINGULARITY_DOCKER_USERNAME="$APPTAINER_DOCKER_USERNAME" '
                       'SINGULARITY_DOCKER_PASSWORD="$APPTAINER_DOCKER_PASSWORD"']
    binds_s = ",".join(f"{h}:{p}" + (":ro" if ro else "") for h, p, ro in binds)
    parts = ["${GTRAIN_APPTAINER:-apptainer}", "exec", *(["--nv"] if gpus else []), "--bind", shlex.quote(binds_s),
             "--pwd", shlex.quote(workdir), *map(shlex.quote, opts), shlex.quote(f"docker://{job.image}")]
    out.prelude.append("command -v apptainer >/dev/null || GTRAIN_APPTAINER=singularity")
    out.wrap = " ".join(parts)
    return out


def dry_run_lines(c: SlurmContainer) -> str:
    """The container command per node, for ``launch --dry-run``."""
    if c.runtime == "pyxis":
        return "srun " + " ".join(shlex.quote(f) for f in c.srun_flags) + " bash node.sh"
    return f"{c.wrap} bash launch.sh"
