"""Slurm's commands (sinfo, sbatch, squeue, scancel, scontrol, sacct) run on the login side through a runner,
and their errors translated at this one edge: what the spec asked wrongly is a ConfigError naming the field
(exit 2), a controller or munge that does not answer is a ProviderError (exit 1)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError, GtrainError, ProviderError

if TYPE_CHECKING:
    from gtrain.remote.base import CommandResult, Runner

#: sbatch's words for a request it refuses -> the spec field that asked it
REJECTIONS: list[tuple[str, str, str]] = [
    (r"invalid partition", "slurm.partition", "`sinfo -s` lists the partitions"),
    (r"invalid account", "slurm.account", "`sacctmgr show assoc user=$USER` lists your accounts"),
    (r"invalid qos", "slurm.qos", "`sacctmgr show qos` lists them"),
    (r"time limit", "slurm.time", "ask for less time than the partition's MaxTime (`sinfo -o '%P %l'`)"),
    (r"invalid feature", "slurm.constraint", "`sinfo -o '%N %f'` lists node features"),
    (r"gres|generic resource|gpu", "resources.accelerators", "`sinfo -o '%P %G'` lists the GPUs of each partition"),
    (r"node count|node configuration is not available|more processors than|nodes? available",
     "num_nodes", "ask for fewer nodes / GPUs per node than the partition has (`sinfo -N -p PARTITION`)"),
    (r"unrecognized option|invalid option|invalid argument|unknown option", "slurm.extra_sbatch",
     "check the option with `sbatch --help`"),
]
_DOWN = ("unable to contact slurm controller", "slurm_load_partitions", "connection refused", "connect failure",
         "socket timed out")
_MUNGE = ("munge", "invalid authentication credential", "authentication failure", "zero bytes were transmitted")


@dataclass
class SqueueRow:
    slurm_id: str
    state: str  # PENDING, RUNNING, COMPLETED, ... (Slurm's word, CANCELLED+ etc. trimmed to the word)
    reason: str
    nodelist: str
    restarts: int = 0


def translate(stderr: str, what: str, *, submitting: bool = False) -> GtrainError:
    """One clear error for a Slurm command's failure."""
    text = " ".join(stderr.split())[-600:] or "(no message)"
    low = text.lower()
    if any(w in low for w in _DOWN):
        return ProviderError(f"slurm: slurmctld is not answering ({what}: {text})",
                             hint="is slurmctld running, and does slurm.conf (SLURM_CONF / slurm.conf) point at it?")
    if any(w in low for w in _MUNGE):
        return ProviderError(f"slurm: munge authentication failed ({what}: {text})",
                             hint="is munged running on this side and on the controller, with the same key?")
    if "command not found" in low or "no such file" in low and what.split()[0] in low:
        return ProviderError(f"slurm: {what.split()[0]} not found on the login side ({text})",
                             hint="install the Slurm client commands there, or set slurm.login")
    if submitting:
        for pattern, field, hint in REJECTIONS:
            if re.search(pattern, low):
                return ConfigError(f"{field}: sbatch refused the request, nothing was submitted: {text}",
                                   hint=hint, field=field)
        return ConfigError(f"slurm: sbatch refused the request, nothing was submitted: {text}",
                           hint="check the slurm: section against `sinfo`", field="slurm")
    return ProviderError(f"slurm: {what} failed: {text}")


class Slurm:
    """Slurm's client commands on the login side (this machine, or the login node over SSH)."""

    def __init__(self, runner: Runner, conf: str | None = None) -> None:
        self.runner = runner
        self.conf = conf
        #: every Slurm command run, by name (``gtrain status`` must make one squeue call: tests read this)
        self.calls: dict[str, int] = {}

    def shell_line(self, argv: list[str]) -> str:
        pre = f"export SLURM_CONF={shlex.quote(self.conf)}; " if self.conf else ""
        return pre + " ".join(shlex.quote(a) for a in argv)

    def run(self, argv: list[str], *, stdin: bytes | None = None, check: bool = True, submitting: bool = False,
            timeout: float = 60) -> CommandResult:
        self.calls[argv[0]] = self.calls.get(argv[0], 0) + 1
        res = self.runner.run(self.shell_line(argv), stdin=stdin, timeout=timeout, check=False)
        if check and res.rc != 0:
            raise translate(res.stderr or res.stdout, " ".join(argv[:2]), submitting=submitting)
        return res

    # ---- the calls gtrain makes ------------------------------------------------------------------

    def partition_nodes(self, partition: str | None) -> list[dict[str, str]]:
        """The partition's nodes: name, gres, state, cpus (sinfo -N)."""
        argv = ["sinfo", "-h", "-N", "-o", "%N|%G|%T|%c|%P"]
        if partition:
            argv[2:2] = ["-p", partition]
        out = []
        for line in self.run(argv).stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 5:
                out.append(dict(zip(("name", "gres", "state", "cpus", "partition"), parts, strict=True)))
        return out

    def test_only(self, script_path: str) -> str:
        """``sbatch --test-only``: the request checked by the scheduler, nothing submitted."""
        res = self.run(["sbatch", "--test-only", script_path], submitting=True)
        return (res.stderr or res.stdout).strip()

    def sbatch(self, script_path: str, env_stdin: bytes | None = None) -> str:
        """Submit; the Slurm job id. Secrets arrive on stdin as NAME=VALUE NUL records and are exported into
        sbatch's environment (passed to the job by --export=ALL), never written to a file by gtrain."""
        self.calls["sbatch"] = self.calls.get("sbatch", 0) + 1
        read = "while IFS= read -r -d '' __kv; do export \"$__kv\"; done; unset __kv; " if env_stdin else ""
        cmd = read + self.shell_line(["sbatch", "--parsable", script_path])
        res = self.runner.run(cmd, stdin=env_stdin, timeout=120, check=False)
        if res.rc != 0:
            raise translate(res.stderr or res.stdout, "sbatch", submitting=True)
        sid = res.stdout.strip().splitlines()[-1].split(";")[0].strip() if res.stdout.strip() else ""
        if not sid.isdigit():
            raise ProviderError(f"slurm: sbatch answered {res.stdout.strip()!r}, not a job id")
        return sid

    def squeue(self, slurm_ids: list[str]) -> dict[str, SqueueRow] | None:
        """The jobs' rows in ONE squeue call (finished ones too, while slurmctld remembers them). None when
        slurmctld has forgotten every one of them (``Invalid job id``)."""
        if not slurm_ids:
            return {}
        res = self.run(["squeue", "-h", "--states=all", "-j", ",".join(slurm_ids), "-o", "%i|%T|%r|%N|%S"],
                       check=False)
        if res.rc != 0:
            if "invalid job id" in (res.stderr + res.stdout).lower():
                return None
            raise translate(res.stderr or res.stdout, "squeue")
        out: dict[str, SqueueRow] = {}
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 4 and parts[0]:
                out[parts[0]] = SqueueRow(parts[0], parts[1].split()[0].rstrip("+"), parts[2], parts[3])
        return out

    def show_job(self, slurm_id: str) -> dict[str, str]:
        """``scontrol show job -o``: every field (StartTime, EndTime, ExitCode, Restarts); {} once forgotten."""
        res = self.run(["scontrol", "show", "job", "-o", slurm_id], check=False)
        if res.rc != 0:
            return {}
        return dict(kv.split("=", 1) for kv in res.stdout.split() if "=" in kv)

    def sacct(self, slurm_ids: list[str]) -> dict[str, dict[str, str]] | None:
        """Accounting rows (State, ExitCode, ElapsedRaw, AllocTRES); None when accounting is off."""
        res = self.run(["sacct", "-X", "-n", "-P", "-j", ",".join(slurm_ids), "-o",
                        "JobIDRaw,State,ExitCode,ElapsedRaw,AllocTRES"], check=False)
        if res.rc != 0:
            return None
        out = {}
        for line in res.stdout.splitlines():
            p = line.split("|")
            if len(p) == 5:
                out[p[0]] = {"State": p[1].split()[0].rstrip("+"), "ExitCode": p[2], "ElapsedRaw": p[3],
                             "AllocTRES": p[4]}
        return out

    def scancel(self, slurm_ids: list[str], signal: str | None = None) -> None:
        if slurm_ids:
            argv = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), *slurm_ids]
            self.run(argv, check=False)

    def jobs_with_comment(self, comment: str) -> list[str]:
        """Live jobs of this user whose --comment is ``comment`` (how `down` finds every job of a cluster)."""
        res = self.run(["squeue", "-h", "--me", "-o", "%i|%k"], check=False)
        return [p[0] for p in (ln.split("|", 1) for ln in res.stdout.splitlines()) if len(p) == 2 and p[1] == comment]
