"""Helpers for the session fixtures that start local services (moto, fake-gcs-server): a free port, waiting
for HTTP, stopping a process group, and putting the environment back. Not a pytest plugin itself."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    """Until ``url`` answers at all (an HTTP error status counts), or ``proc`` dies, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url}: server did not answer within {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """TERM the process group (the server was started with start_new_session), KILL after 5 s."""
    if proc.poll() is not None:
        return
    with_group = True
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        with_group = False
        proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        if with_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait(timeout=5)


@contextlib.contextmanager
def restored_env(names: Iterable[str]) -> Iterator[None]:
    """Whatever the block does to these environment variables is undone afterwards."""
    saved = {k: os.environ.get(k) for k in names}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
