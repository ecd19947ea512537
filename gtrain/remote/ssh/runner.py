"""The runner: :class:`SSHRunner`, one node over a pooled SSH connection (commands, detached jobs, uploads by
rsync or sftp, file writes and streamed fetches).

paramiko is imported inside functions only."""

from __future__ import annotations

import contextlib
import os
import posixpath
import select
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from gtrain.errors import ConfigError, RemoteCommandError, RemoteError, SyncError
from gtrain.remote.base import CommandResult, Runner
from gtrain.remote.ssh.connect import (
    _POOL,
    CONNECT_RETRY_S,
    CONNECT_TIMEOUT_S,
    KEEPALIVE_S,
    MAX_PACKET,
    WINDOW_SIZE,
    ConnectOptions,
)
from gtrain.remote.ssh.hostkeys import HostKeyCallback, known_hosts_path, ssh_dir
from gtrain.state.sshtarget import SSHTarget, _cfg_value, ssh_config_block

if TYPE_CHECKING:
    import paramiko

_READ = 1 << 18


class SSHRunner(Runner):
    """A node over SSH. ``root`` defaults to ``~/gtrain/<cluster>`` resolved once via the node's $HOME."""

    def __init__(
        self,
        target: SSHTarget,
        *,
        cluster: str | None = None,
        root: str | None = None,
        label: str | None = None,
        address: str | None = None,
        python: str = "python3",
        tofu: bool = False,
        on_new_host_key: HostKeyCallback | None = None,
        connect_retry_s: float = CONNECT_RETRY_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        keepalive_s: int = KEEPALIVE_S,
        use_rsync: bool | None = None,
    ) -> None:
        if root is None and cluster is None:
            raise ConfigError("SSHRunner needs a cluster name or a root directory")
        self.target = target
        self.label = label or f"{target.host}"
        self.address = address or target.host
        self.python = python
        self._root_spec = root if root is not None else f"~/gtrain/{cluster}"
        self._root: str | None = self._root_spec if self._root_spec.startswith("/") else None
        self._opts = ConnectOptions(tofu, on_new_host_key, connect_retry_s, connect_timeout_s, keepalive_s)
        self._use_rsync = use_rsync
        self._remote_rsync: bool | None = None
        self._lock = threading.Lock()

    # ---- connection ----

    @property
    def root(self) -> str:
        if self._root is None:
            with self._lock:
                if self._root is None:
                    home = self._exec_collect('printf %s "$HOME"', cwd=False, timeout=60)[1].decode().strip()
                    if not home.startswith("/"):
                        raise RemoteError(f"{self.label}: cannot resolve $HOME on {self.target.display}")
                    spec = self._root_spec
                    rest = spec[1:].lstrip("/") if spec.startswith("~") else spec
                    self._root = posixpath.join(home, rest) if rest else home
        return self._root

    @root.setter
    def root(self, value: str) -> None:
        self._root = value

    def connect(self) -> None:
        """Open (or reuse) the pooled connection now; raises RemoteError with the cause."""
        self._client()

    def _client(self) -> paramiko.SSHClient:
        return _POOL.get(self.target, self._opts)

    def _transport(self) -> paramiko.Transport:
        t = self._client().get_transport()
        assert t is not None
        return t

    def _lost(self, e: BaseException, what: str) -> RemoteError:
        _POOL.drop((self.target.host, self.target.port, self.target.user))
        return RemoteError(f"{self.label}: connection to {self.target.display} lost during {what}: {e or type(e)}")

    def _open_session(self) -> Any:
        import paramiko

        for attempt in (1, 2):
            t = self._transport()
            try:
                chan = t.open_session(timeout=self._opts.timeout_s)
                _POOL.count_channel()
                return chan
            except (paramiko.SSHException, EOFError, OSError) as e:
                # a pooled transport can die between the liveness check and the open: reconnect once
                _POOL.drop((self.target.host, self.target.port, self.target.user))
                if attempt == 2:
                    raise self._lost(e, "channel open") from None
        raise AssertionError("unreachable")

    def _wrap(self, cmd: str, cwd: bool) -> str:
        if not cwd:
            return f"bash -c {shlex.quote(cmd)}"
        r = shlex.quote(self.root)
        inner = f"{{ cd {r} 2>/dev/null || {{ mkdir -p {r} && cd {r}; }}; }} || exit 125\n{cmd}"
        return f"bash -c {shlex.quote(inner)}"

    def _exec(
        self, cmd: str, *, stdin: bytes | None, timeout: float | None, on_out: Callable[[bytes], None],
        on_err: Callable[[bytes], None] | None, cwd: bool = True, agent_sock: str | None = None,
    ) -> int:
        """Run ``cmd``; feed its stdout (and stderr, merged when on_err is None) to the callbacks.
        ``agent_sock``: forward the SSH agent listening there to this one session (a relay's own ``ssh``)."""
        import paramiko

        full = self._wrap(cmd, cwd)
        chan = self._open_session()
        deadline = time.monotonic() + timeout if timeout else None
        feeder: threading.Thread | None = None
        try:
            if agent_sock is not None:
                chan.request_forward_agent(lambda ch: _forward_agent(ch, agent_sock))
            if on_err is None:
                chan.set_combine_stderr(True)
            chan.exec_command(full)
            if stdin:
                feeder = threading.Thread(target=_send_all, args=(chan, stdin), daemon=True)
                feeder.start()
            else:
                chan.shutdown_write()
            while True:
                wait = 1.0
                if deadline is not None:
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        raise RemoteError(f"{self.label}: command timed out after {timeout}s: {cmd[:120]}")
                    wait = min(wait, 1.0)
                _wait_readable([chan], wait)
                while chan.recv_ready():
                    on_out(chan.recv(_READ))
                while on_err is not None and chan.recv_stderr_ready():
                    on_err(chan.recv_stderr(_READ))
                if chan.eof_received or chan.closed:
                    while chan.recv_ready():
                        on_out(chan.recv(_READ))
                    while on_err is not None and chan.recv_stderr_ready():
                        on_err(chan.recv_stderr(_READ))
                    break
                if not chan.get_transport().is_active():
                    raise self._lost(EOFError("transport closed"), "a command")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not chan.status_event.wait(left if left is not None else 3600 * 24 * 365):
                raise RemoteError(f"{self.label}: command timed out after {timeout}s: {cmd[:120]}")
            if chan.exit_status == -1 and not chan.get_transport().is_active():
                raise self._lost(EOFError("transport closed"), "a command")
            return int(chan.recv_exit_status())
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise self._lost(e, "a command") from None
        finally:
            chan.close()

    def _exec_collect(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None,
                      cwd: bool = True) -> tuple[int, bytes, bytes]:
        out: list[bytes] = []
        err: list[bytes] = []
        rc = self._exec(cmd, stdin=stdin, timeout=timeout, on_out=out.append, on_err=err.append, cwd=cwd)
        return rc, b"".join(out), b"".join(err)

    # ---- Runner ----

    def run(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        rc, out, err = self._exec_collect(cmd, stdin=stdin, timeout=timeout)
        res = CommandResult(rc, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and res.rc != 0:
            raise RemoteCommandError(self.label, cmd, res.rc, res.stderr[-2000:])
        return res

    def stream(self, cmd: str, on_line: Callable[[str], None], *, stdin: bytes | None = None,
               timeout: float | None = None) -> int:
        buf = bytearray()

        def on_out(data: bytes) -> None:
            buf.extend(data)
            while True:
                i = buf.find(b"\n")
                if i < 0:
                    return
                line = bytes(buf[:i])
                del buf[: i + 1]
                on_line(line.decode(errors="replace"))

        rc = self._exec(cmd, stdin=stdin, timeout=timeout, on_out=on_out, on_err=None)
        if buf:
            on_line(bytes(buf).decode(errors="replace"))
        return rc

    def relay(self, cmd: str, on_line: Callable[[str], None], *, stdin: bytes, agent_sock: str | None,
              timeout: float | None = None) -> int:
        """Run a relay (:mod:`gtrain.remote.tree`): ``stream`` with stdout only, and this machine's SSH agent
        at ``agent_sock`` forwarded to the session so the relay's ``ssh`` can reach its share of the nodes."""
        buf = bytearray()

        def on_out(data: bytes) -> None:
            buf.extend(data)
            while (i := buf.find(b"\n")) >= 0:
                line = bytes(buf[:i])
                del buf[: i + 1]
                on_line(line.decode(errors="replace"))

        err: list[bytes] = []
        rc = self._exec(cmd, stdin=stdin, timeout=timeout, on_out=on_out, on_err=err.append, cwd=False,
                        agent_sock=agent_sock)
        if buf:
            on_line(bytes(buf).decode(errors="replace"))
        return rc

    def start_detached(self, cmd: str, *, stdin: bytes | None = None) -> None:
        # setsid -f: own session, re-parented at once. Its stdout/stderr go to /dev/null so the channel sees
        # EOF at once (cmd redirects its own output). With stdin, `cat` copies the channel's stdin into a pipe
        # the job holds, and the channel stays open until all of it is in that pipe: sshd drops stdin that
        # arrives after the session's shell has exited.
        q = shlex.quote(cmd)
        if stdin is None:
            launcher = f"setsid -f bash -c {q} </dev/null >/dev/null 2>&1"
        else:
            launcher = f"cat | setsid -f bash -c {q} >/dev/null 2>&1"
        rc, _, err = self._exec_collect(launcher, stdin=stdin if stdin is not None else None, timeout=60)
        if rc != 0:
            raise RemoteCommandError(self.label, cmd, rc, err.decode(errors="replace"))

    def _sftp(self) -> paramiko.SFTPClient:
        import paramiko

        t = self._transport()
        try:
            chan = t.open_session(window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET, timeout=self._opts.timeout_s)
            _POOL.count_channel()
            chan.invoke_subsystem("sftp")
            return paramiko.SFTPClient(chan)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise self._lost(e, "sftp open") from None

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.root, path)

    def rsync_available(self, mkdir: str | None = None) -> bool:
        """Whether rsync is here and on the node (asked once); ``mkdir``: make that folder in the same round
        trip (put_files needs both before its rsync)."""
        if self._use_rsync is False or shutil.which("rsync") is None:
            return False  # sftp makes its folders itself
        if self._remote_rsync is None or mkdir is not None:
            pre = f"mkdir -p {shlex.quote(mkdir)} || exit 3; " if mkdir is not None else ""
            rc = self.run(f"{pre}command -v rsync >/dev/null", check=False, timeout=60).rc
            if rc == 3:
                raise SyncError(f"{self.label}: cannot make {self.target.display}:{mkdir}")
            self._remote_rsync = rc == 0
        return self._remote_rsync

    def put_files(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        if not files:
            return 0
        remote_dir = self._abs(remote_dir)
        if self.rsync_available(mkdir=remote_dir):  # one session: rsync's check and the folder
            return self._put_rsync(Path(local_root), files, remote_dir)
        if self._use_rsync is True:
            raise SyncError(f"{self.label}: rsync is not available here or on {self.target.display}")
        return self._put_sftp(Path(local_root), files, remote_dir)

    def rsync_ssh_command(self) -> str:
        """The ``ssh`` command line (for ``rsync -e``) that reaches this node with gtrain's pinned keys."""
        cfg = ssh_dir() / f"rsync-{self.target.host}-{self.target.port}-{self.target.user}.config"
        text = ssh_config_block("gtrain-node", self.target, known_hosts_path())
        text += ("Host *\n"
                 f"  UserKnownHostsFile {_cfg_value(str(known_hosts_path()))}\n"
                 "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
                 "  ServerAliveInterval 15\n  LogLevel ERROR\n")
        if self.target.identity_file:
            text += f"  IdentityFile {_cfg_value(self.target.identity_file)}\n  IdentitiesOnly yes\n"
        if _read_text(cfg) != text:
            fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        return f"ssh -F {shlex.quote(str(cfg))}"

    def _put_rsync(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        ssh = self.rsync_ssh_command()
        argv = ["rsync", "-a", "--protect-args", "--itemize-changes", "--files-from=-", "-e", ssh, f"{local_root}/",
                f"gtrain-node:{remote_dir}/"]
        with _POOL._lock:
            _POOL.external += 1
        p = subprocess.run(argv, check=False, input="\n".join(files).encode() + b"\n", capture_output=True)
        if p.returncode != 0:
            raise SyncError(f"{self.label}: rsync to {self.target.display}:{remote_dir} failed "
                            f"(exit {p.returncode}): {p.stderr.decode(errors='replace').strip()[-1500:]}")
        return sum(1 for ln in p.stdout.decode(errors="replace").splitlines() if ln[:2] in ("<f", ">f"))

    def _put_sftp(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        moved = 0
        made: set[str] = set()
        sftp = self._sftp()
        try:
            for rel in files:
                src = local_root / rel
                st = src.stat()
                dst = posixpath.join(remote_dir, rel)
                with contextlib.suppress(OSError):
                    rs = sftp.stat(dst)
                    if rs.st_size == st.st_size and int(rs.st_mtime or -1) == int(st.st_mtime):
                        continue
                _sftp_makedirs(sftp, posixpath.dirname(dst), made)
                tmp = posixpath.join(posixpath.dirname(dst), f".{posixpath.basename(dst)}.gtrain-tmp")
                with open(src, "rb") as f:
                    sftp.putfo(f, tmp, file_size=st.st_size, confirm=True)
                sftp.chmod(tmp, st.st_mode & 0o777)
                sftp.utime(tmp, (int(st.st_atime), int(st.st_mtime)))
                sftp.posix_rename(tmp, dst)
                moved += 1
        except OSError as e:
            raise SyncError(f"{self.label}: sftp upload to {self.target.display}:{remote_dir} failed: {e}") from None
        finally:
            sftp.close()
        return moved

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        """One exec session (the bytes on its stdin): a round trip, where sftp's init, open, write, close and
        rename were several. ``umask 077`` first, so the file is never world-readable before its chmod."""
        path = self._abs(remote_path)
        parent = posixpath.dirname(path)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.gtrain-tmp")
        q, qt = shlex.quote(path), shlex.quote(tmp)
        cmd = (f"umask 077 && mkdir -p -- {shlex.quote(parent)} && cat > {qt} && chmod {mode & 0o7777:o} -- {qt} "
               f"&& mv -f -- {qt} {q}")
        rc, _, err = self._exec_collect(cmd, stdin=data if data else None, timeout=max(60.0, len(data) / 1e6),
                                        cwd=False)
        if rc != 0:
            raise SyncError(f"{self.label}: cannot write {self.target.display}:{path}: "
                            f"{err.decode(errors='replace').strip()[-500:]}")

    def fetch(self, remote_path: str, dest: BinaryIO, offset: int = 0,
              on_bytes: Callable[[int], None] | None = None) -> int:
        """Stream the file from ``offset`` over an exec channel (``tail -c``): one flow of big packets with
        no per-request round trips, which keeps pace with rsync where sftp's 32 KiB requests cannot."""
        path = self._abs(remote_path)
        n = 0

        def on_out(data: bytes) -> None:
            nonlocal n
            dest.write(data)
            n += len(data)
            if on_bytes:
                on_bytes(len(data))

        import paramiko

        err: list[bytes] = []
        cmd = f"exec tail -c +{int(offset) + 1} -- {shlex.quote(path)}"
        chan = self._open_session()
        try:
            chan.exec_command(self._wrap(cmd, cwd=False))
            chan.shutdown_write()
            # blocking reads of up to 1 MiB: one wake-up per burst, not per packet (stderr is tiny here)
            while data := chan.recv(1 << 20):
                on_out(data)
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(_READ))
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(_READ))
            chan.status_event.wait()
            if chan.exit_status == -1 and not chan.get_transport().is_active():
                raise self._lost(EOFError("transport closed"), "fetch")
            rc = chan.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise self._lost(e, "fetch") from None
        finally:
            chan.close()
        if rc != 0:
            raise SyncError(f"{self.label}: cannot read {self.target.display}:{path}: "
                            f"{b''.join(err).decode(errors='replace').strip()}")
        return n

    def close(self) -> None:
        """The connection is pooled and shared; ``close_all()`` closes it. Nothing per runner to release."""


def _wait_readable(objs: list[Any], timeout: float) -> list[Any]:
    """Which of ``objs`` (sockets, paramiko channels) are readable within ``timeout`` seconds. poll, not
    select: with 1,000 nodes' connections open, descriptors pass select's limit of 1,024."""
    p = select.poll()
    by_fd = {o.fileno(): o for o in objs}
    for fd in by_fd:
        p.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return [by_fd[fd] for fd, _ev in p.poll(max(0, int(timeout * 1000)))]


def _forward_agent(chan: Any, agent_sock: str) -> None:
    """The server opened an agent channel (a relay's ``ssh`` asks for a signature): pipe it to the local
    agent's socket in a thread of its own until either side closes."""
    import socket

    def pump() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(agent_sock)
            while True:
                r = _wait_readable([s, chan], 30)
                if chan in r:
                    data = chan.recv(1 << 16)
                    if not data:
                        return
                    s.sendall(data)
                if s in r:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    chan.sendall(data)
                if not r and chan.closed:
                    return
        except OSError:
            return
        finally:
            s.close()
            with contextlib.suppress(Exception):
                chan.close()

    threading.Thread(target=pump, daemon=True, name="gtrain-agent").start()


def _send_all(chan: Any, data: bytes) -> None:
    with contextlib.suppress(Exception):  # the reader side reports a broken connection
        chan.sendall(data)
        chan.shutdown_write()


def _sftp_makedirs(sftp: Any, path: str, made: set[str]) -> None:
    if not path or path in made or path == "/":
        return
    try:
        sftp.stat(path)
    except OSError:
        _sftp_makedirs(sftp, posixpath.dirname(path), made)
        with contextlib.suppress(OSError):
            sftp.mkdir(path)
    made.add(path)


def _read_text(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None
