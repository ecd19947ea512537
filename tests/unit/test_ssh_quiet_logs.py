"""paramiko's own logging (``Error reading SSH protocol banner`` and its traceback, while ``up`` waits for a
booting sshd) goes to gtrain's debug log, never to stderr, unless GTRAIN_DEBUG=1.

The connect runs in a child process, as in the CLI: under pytest the root logger has pytest's handlers, which
would hide a log record that a real run prints through logging's last-resort handler."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

CONNECT = """
import sys
from gtrain.errors import RemoteError
from gtrain.remote.ssh import SSHRunner, SSHTarget
r = SSHRunner(SSHTarget(host="127.0.0.1", port=int(sys.argv[1]), user="nobody"), cluster="c",
              connect_retry_s=1.5, connect_timeout_s=1.0)
try:
    r.connect()
except RemoteError as e:
    print("refused:", e.message)
"""


@pytest.fixture()
def closing_port() -> Iterator[int]:
    """A TCP port that accepts every connection and closes it at once (an sshd not up yet)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    srv.close()


def _connect(port: int, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "GTRAIN_HOME": str(tmp_path), **env}
    full.pop("GTRAIN_DEBUG", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", CONNECT, str(port)], capture_output=True, text=True, env=full,
                          timeout=60, check=False)


def test_banner_errors_stay_off_stderr(closing_port: int, tmp_path: Path) -> None:
    res = _connect(closing_port, tmp_path)
    assert "refused: cannot connect" in res.stdout  # the failure itself is gtrain's error, reported once
    assert res.stderr == ""


def test_gtrain_debug_shows_them(closing_port: int, tmp_path: Path) -> None:
    res = _connect(closing_port, tmp_path, GTRAIN_DEBUG="1")
    assert "refused: cannot connect" in res.stdout
    assert "paramiko" in res.stderr and "banner" in res.stderr.lower()
