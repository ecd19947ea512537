"""The local runner: a node that is a directory on this machine, commands run as subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from gtrain.errors import RemoteCommandError, RemoteError
from gtrain.remote.base import CommandResult, Runner

_CHUNK = 1 << 20


class LocalRunner(Runner):
    def __init__(self, root: str | os.PathLike[str], *, label: str = "local", address: str = "127.0.0.1",
                 python: str | None = None) -> None:
        self.root = str(Path(root).resolve())
        self.label = label
        self.address = address
        self.python = python or sys.executable

    def _cwd(self) -> str:
        os.makedirs(self.root, exist_ok=True)
        return self.root

    def run(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        try:
            p = subprocess.run(
                ["bash", "-c", cmd], input=stdin if stdin is not None else b"", capture_output=True,
                cwd=self._cwd(), timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{self.label}: command timed out after {timeout}s: {cmd[:120]}") from None
        res = CommandResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
        if check and res.rc != 0:
            raise RemoteCommandError(self.label, cmd, res.rc, res.stderr[-2000:])
        return res

    def stream(self, cmd: str, on_line: Callable[[str], None], *, stdin: bytes | None = None,
               timeout: float | None = None) -> int:
        p = subprocess.Popen(
            ["bash", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=self._cwd(),
        )
        assert p.stdin is not None and p.stdout is not None
        if stdin:
            threading.Thread(target=_feed, args=(p.stdin, stdin), daemon=True).start()
        else:
            p.stdin.close()
        timer = threading.Timer(timeout, p.kill) if timeout else None
        if timer:
            timer.start()
        done = False
        try:
            for raw in p.stdout:
                on_line(raw.decode(errors="replace").rstrip("\n"))
            # End of output is not the end of the process: it may still be exiting (or run on with its
            # output closed). Wait for it; only the timer (or an error here) kills it.
            p.wait()
            done = True
        finally:
            if timer:
                timer.cancel()
            if not done and p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
        return p.returncode

    def start_detached(self, cmd: str, *, stdin: bytes | None = None) -> None:
        # setsid -f: the job gets its own session and is re-parented at once, so nothing of ours has to
        # reap it (a zombie would look alive to `kill -0`).
        p = subprocess.Popen(
            ["setsid", "-f", "bash", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, cwd=self._cwd(), close_fds=True,
        )
        _, err = p.communicate(stdin or b"", timeout=60)
        if p.returncode != 0:
            raise RemoteCommandError(self.label, cmd, p.returncode, err.decode(errors="replace"))

    def call(self, func: str, *args: str, timeout: float | None = 120) -> Any:
        # Same functions as on a remote node, called in-process: no interpreter start per call.
        import json

        from gtrain.remote import nodeside

        return json.loads(json.dumps(nodeside.FUNCS[func](*args)))  # type: ignore[operator]

    def put_files(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        moved = 0
        dst_root = Path(remote_dir)
        for rel in files:
            src = local_root / rel
            dst = dst_root / rel
            st = src.stat()
            try:
                dt = dst.stat()
                if dt.st_size == st.st_size and int(dt.st_mtime) == int(st.st_mtime):
                    continue
            except FileNotFoundError:
                pass
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.gtrain-tmp")
            shutil.copyfile(src, tmp)
            os.chmod(tmp, st.st_mode & 0o777)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, dst)
            moved += 1
        return moved

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        p = Path(remote_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.gtrain-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, p)

    def write_files(self, files: dict[str, bytes], mode: int = 0o644, folders: Sequence[str] = ()) -> None:
        for d in folders:  # this machine's folders: in-process, as write_file
            Path(d).mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            self.write_file(path, data, mode)

    def fetch(self, remote_path: str, dest: BinaryIO, offset: int = 0,
              on_bytes: Callable[[int], None] | None = None) -> int:
        n = 0
        with open(remote_path, "rb") as f:
            f.seek(offset)
            while chunk := f.read(_CHUNK):
                dest.write(chunk)
                n += len(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
        return n


def _feed(pipe: BinaryIO, data: bytes) -> None:
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass
