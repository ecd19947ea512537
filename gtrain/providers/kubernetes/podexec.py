"""A runner per pod over the API server's exec subresource (``pods/exec``: a websocket of the
``v5.channel.k8s.io`` subprotocol, stdin on channel 0, stdout 1, stderr 2, the exit Status on 3, channel 255
closing stdin -- lightkube's ``Client.exec``). Node K's runner reaches the newest running pod of completion index
K that carries the cluster's label: `gtrain exec` and everything written against :class:`Runner` run there.
With no job running there is no pod: each call says so (a ProviderError, not a hang)."""

from __future__ import annotations

import io
import posixpath
import shlex
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from gtrain.errors import ProviderError, RemoteCommandError
from gtrain.providers.kubernetes import objects as ko
from gtrain.providers.kubernetes.api import edge
from gtrain.remote.base import CommandResult, Runner

if TYPE_CHECKING:
    from gtrain.providers.kubernetes.host import KubeHost
    from gtrain.state import Cluster


class _Lines(io.RawIOBase):
    """A binary sink that calls ``on_line`` per complete line (the rest at :meth:`flush_rest`)."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line, self.buf = on_line, b""

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.buf += bytes(b)
        *full, self.buf = self.buf.split(b"\n")
        for ln in full:
            self.on_line(ln.decode(errors="replace").rstrip("\r"))
        return len(b)

    def flush_rest(self) -> None:
        if self.buf:
            self.on_line(self.buf.decode(errors="replace"))
            self.buf = b""


class PodRunner(Runner):
    def __init__(self, provider: KubeHost, cluster: Cluster, rank: int) -> None:
        self.provider, self.cluster, self.rank = provider, cluster, rank
        self.label = f"node {rank} (pod {rank})"
        self.address = f"pod {rank}"
        self.root = ko.ROOT
        self.python = "python3"

    @property
    def namespace(self) -> str:
        return str((self.cluster.extra.get("kubernetes") or {}).get("namespace") or "default")

    def pod(self) -> str:
        """The name of node K's newest running pod of this cluster."""
        from lightkube.resources.core_v1 import Pod

        ns = self.namespace
        with edge(f"list the pods of cluster {self.cluster.name}", ns):
            pods = [p.to_dict() for p in self.provider.client(self.cluster).list(
                Pod, namespace=ns, labels={ko.LABEL_CLUSTER: self.cluster.id[:63]})]
        live = [p for p in pods if (p.get("status") or {}).get("phase") == "Running" and
                ((p["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
                 == str(self.rank))]
        if not live:
            raise ProviderError(f"kubernetes: node {self.rank} of {self.cluster.name} has no running pod (pods "
                                "exist only while a job runs)",
                                hint=f"`gtrain launch --cluster {self.cluster.name}` first")
        return str(max(live, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))["metadata"]["name"])

    def _exec(self, cmd: str, stdin: bytes | None, stdout: BinaryIO, stderr: BinaryIO,
              timeout: float | None) -> int:
        pod = self.pod()  # stdin b"": the command reads end-of-file, as over ssh without input
        with edge(f"exec in pod {pod}", self.namespace):
            got = self.provider.client(self.cluster).exec(
                pod, namespace=self.namespace, command=["bash", "-c", cmd], stdin=stdin or b"", stdout=stdout,
                stderr=stderr, decode=None, timeout=timeout)
        return int(got.exit_code)

    def run(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        out, err = io.BytesIO(), io.BytesIO()
        rc = self._exec(cmd, stdin, out, err, timeout)
        res = CommandResult(rc, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace"))
        if check and rc != 0:
            raise RemoteCommandError(self.label, cmd, rc, res.stderr)
        return res

    def stream(self, cmd: str, on_line: Callable[[str], None], *, stdin: bytes | None = None,
               timeout: float | None = None) -> int:
        sink = _Lines(on_line)
        try:
            return self._exec(cmd, stdin, sink, sink, timeout)  # type: ignore[arg-type]
        finally:
            sink.flush_rest()

    def start_detached(self, cmd: str, *, stdin: bytes | None = None) -> None:
        inner = f"setsid bash -c {shlex.quote(cmd)} <&0 >/dev/null 2>&1 &"
        self.run(inner if stdin is not None else inner.replace("<&0", "</dev/null"), stdin=stdin)

    def put_files(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel in files:
                tar.add(str(local_root / rel), arcname=rel, recursive=False)
        q = shlex.quote(remote_dir)
        self.run(f"mkdir -p {q} && tar -xf - -C {q}", stdin=buf.getvalue())
        return len(files)

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        q, tmp = shlex.quote(remote_path), shlex.quote(remote_path + ".gtrain-tmp")
        parent = shlex.quote(posixpath.dirname(remote_path) or "/")
        self.run(f"mkdir -p {parent} && cat > {tmp} && chmod {mode:o} {tmp} && mv -f {tmp} {q}", stdin=data)

    def fetch(self, remote_path: str, dest: BinaryIO, offset: int = 0,
              on_bytes: Callable[[int], None] | None = None) -> int:
        counted = _Counted(dest, on_bytes)
        err = io.BytesIO()
        rc = self._exec(f"tail -c +{int(offset) + 1} {shlex.quote(remote_path)}", None, counted, err,  # type: ignore[arg-type]
                        None)
        if rc != 0:
            raise RemoteCommandError(self.label, f"read {remote_path}", rc, err.getvalue().decode(errors="replace"))
        return counted.n


class _Counted(io.RawIOBase):
    def __init__(self, dest: BinaryIO, on_bytes: Callable[[int], None] | None) -> None:
        self.dest, self.on_bytes, self.n = dest, on_bytes, 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.dest.write(data)
        self.n += len(data)
        if self.on_bytes is not None:
            self.on_bytes(len(data))
        return len(data)
