"""The runner interface: how gtrain reaches one node.

Every provider ends in a list of runners, one per node. The local provider's runner is a subprocess on
this machine; the SSH runner (paramiko) is used by ssh, aws and gcp. Everything above this layer (launch,
logs, pull, down) is written once against :class:`Runner` and works the same on every provider.

Commands are bash command lines. Callers quote every value with :func:`shlex.quote` (templates use the
``q`` filter); a runner never interpolates anything into a command itself.
"""

from __future__ import annotations

import json
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gtrain.errors import RemoteCommandError


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str


class Runner(ABC):
    """One node. ``root`` is the node's gtrain directory, an absolute path on the node."""

    #: short label used in messages, e.g. ``node 1 (10.0.0.6)``
    label: str
    #: the address the other nodes of the cluster reach this node on
    address: str
    #: absolute path of the node's gtrain directory (workdir/, jobs/ live under it)
    root: str
    #: python interpreter on the node (it must be able to import torch for training)
    python: str = "python3"

    @abstractmethod
    def run(
        self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None, check: bool = True
    ) -> CommandResult:
        """Run ``bash -c cmd`` to completion. ``check`` raises RemoteCommandError on a non-zero exit."""

    @abstractmethod
    def stream(
        self, cmd: str, on_line: Callable[[str], None], *, stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> int:
        """Run ``bash -c cmd``, calling ``on_line`` for each line of stdout (and stderr) as it arrives.
        Returns the exit code."""

    @abstractmethod
    def start_detached(self, cmd: str, *, stdin: bytes | None = None) -> None:
        """Start ``bash -c cmd`` in a new session that outlives this process and connection.
        ``stdin`` is written to the command's standard input, which is then closed; this is how secrets
        reach a job without touching the node's disk. Output must be redirected by ``cmd`` itself."""

    @abstractmethod
    def put_files(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        """Copy ``files`` (paths relative to ``local_root``) into ``remote_dir`` keeping their relative
        paths and mtimes, skipping those whose size and mtime already match. Returns how many moved."""

    @abstractmethod
    def write_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` to ``remote_path`` atomically (parent directories are created)."""

    @abstractmethod
    def fetch(
        self, remote_path: str, dest: BinaryIO, offset: int = 0, on_bytes: Callable[[int], None] | None = None
    ) -> int:
        """Append the bytes of ``remote_path`` from ``offset`` on to ``dest``. Returns bytes copied."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call more than once."""

    # ---- helpers built on the primitives -------------------------------------------------------

    def write_files(self, files: dict[str, bytes], mode: int = 0o644, folders: Sequence[str] = ()) -> None:
        """Make ``folders`` and write each of ``files`` (path: bytes) as :meth:`write_file` does (``umask 077``,
        written beside, ``chmod``, renamed over), all in ONE command: a round trip per node, where a session per
        file was one each (docs/scale.md). The files go as quoted here-documents of a ``sh -s`` script on
        stdin, so a file must be text that ends with a newline; any other is written by :meth:`write_file`."""
        import os

        mark = f"GTRAIN_EOF_{os.urandom(8).hex()}"
        lines = ["set -e", "umask 077"]
        if folders:
            lines.append("mkdir -p -- " + " ".join(shlex.quote(d) for d in folders))
        rest = {}
        for path, data in files.items():
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = ""
            if not text.endswith("\n") or "\x00" in text or mark in text:
                rest[path] = data
                continue
            tmp = shlex.quote(str(Path(path).with_name(f".{Path(path).name}.gtrain-tmp")))
            lines += [f"mkdir -p -- {shlex.quote(str(Path(path).parent))}", f"cat > {tmp} <<'{mark}'",
                      text + mark, f"chmod {mode & 0o7777:o} -- {tmp}", f"mv -f -- {tmp} {shlex.quote(path)}"]
        self.run("exec sh -s", stdin=("\n".join(lines) + "\n").encode(),
                 timeout=max(60.0, sum(map(len, files.values())) / 1e6))
        for path, data in rest.items():
            self.write_file(path, data, mode)

    def check(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None) -> str:
        return self.run(cmd, stdin=stdin, timeout=timeout, check=True).stdout

    def run_python(self, script: str, args: Sequence[str] = (), *, timeout: float | None = None,
                   check: bool = True) -> CommandResult:
        """Run a python script on the node, fed through stdin (nothing written to the node's disk)."""
        cmd = " ".join([shlex.quote(self.python), "-", *map(shlex.quote, args)])
        res = self.run(cmd, stdin=script.encode(), timeout=timeout, check=False)
        if check and res.rc != 0:
            raise RemoteCommandError(self.label, f"{self.python} - {' '.join(args)}", res.rc, res.stderr)
        return res

    def call(self, func: str, *args: str, timeout: float | None = 120) -> Any:
        """Run ``gtrain.remote.nodeside.<func>(*args)`` on the node and return its JSON result."""
        res = self.run_python(nodeside_source(), [func, *args], timeout=timeout)
        return json.loads(res.stdout)

    def follow_command(self, job_dir: str, *, follow: bool, tail: int | None) -> tuple[str, bytes]:
        """The command (and its stdin) that streams a job's log lines on this node; see nodeside.follow."""
        args = ["follow", job_dir, "1" if follow else "0", str(-1 if tail is None else tail)]
        cmd = " ".join([shlex.quote(self.python), "-u", "-", *map(shlex.quote, args)])
        return cmd, nodeside_source().encode()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def nodeside_source() -> str:
    from gtrain.remote import nodeside

    with open(nodeside.__file__, encoding="utf-8") as f:
        return f.read()
