"""The Slurm provider's node runners. Files (pull, writes) are the login side's: every node sees
``shared_dir``. Commands (``gtrain exec``) go to node K of the cluster's running Slurm job or held allocation
through ``srun --jobid=ID --overlap -N1 -n1 --relative=K`` (beside the job's own step, on its resources);
with nothing running they run on the login side. Which of the two is said once per command."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gtrain.remote.base import CommandResult, Runner

if TYPE_CHECKING:
    from gtrain.providers.slurm.login import SlurmHost
    from gtrain.state import Cluster


class ExecTarget:
    """Where the cluster's commands run, asked of Slurm once (one squeue call) and said once."""

    def __init__(self, provider: SlurmHost, cluster: Cluster) -> None:
        self.provider = provider
        self.cluster = cluster
        self._lock = threading.Lock()
        self._sid: str | None = None
        self._asked = False

    def slurm_job(self) -> str | None:
        with self._lock:
            if not self._asked:
                self._asked = True
                self._sid = self.provider.running_slurm_job(self.cluster, max_age=0)
                held = self.cluster.extra.get("slurm", {}).get("alloc_id")
                self.provider.report.info(
                    f"exec: inside {'the held allocation' if held else 'Slurm job'} {self._sid} on each node "
                    f"(srun --jobid={self._sid} --overlap)" if self._sid else
                    "exec: on the login side, in the shared workdir (no Slurm job of the cluster is running)")
            return self._sid


class AllocationRunner(Runner):
    def __init__(self, login: Runner, target: ExecTarget, node: int) -> None:
        self.login = login
        self.target = target
        self.node = node
        self.label = login.label
        self.address = login.address
        self.root = login.root
        self.python = login.python

    def _cmd(self, cmd: str, stdin: bytes | None) -> str:
        sid = self.target.slurm_job()
        if sid is None:
            return cmd
        slurm = self.target.provider.slurm(self.target.cluster)
        return slurm.shell_line(["srun", f"--jobid={sid}", "--overlap", "--quiet", "-N1", "-n1",
                                 f"--relative={self.node}", *([] if stdin else ["--input=none"]), "bash", "-c", cmd])

    def stream(self, cmd: str, on_line: Callable[[str], None], *, stdin: bytes | None = None,
               timeout: float | None = None) -> int:
        return self.login.stream(self._cmd(cmd, stdin), on_line, stdin=stdin, timeout=timeout)

    # ---- the login side's, unchanged ----

    def run(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        return self.login.run(cmd, stdin=stdin, timeout=timeout, check=check)

    def start_detached(self, cmd: str, *, stdin: bytes | None = None) -> None:
        self.login.start_detached(cmd, stdin=stdin)

    def put_files(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        return self.login.put_files(local_root, files, remote_dir)

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        self.login.write_file(remote_path, data, mode)

    def fetch(self, remote_path: str, dest: BinaryIO, offset: int = 0,
              on_bytes: Callable[[int], None] | None = None) -> int:
        return self.login.fetch(remote_path, dest, offset, on_bytes)

    def call(self, func: str, *args: str, timeout: float | None = 120) -> object:
        return self.login.call(func, *args, timeout=timeout)

    def close(self) -> None:
        self.login.close()
