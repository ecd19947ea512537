"""The SSH runner: one node reached over SSH with paramiko (used by the ssh, aws and gcp providers).

* One paramiko Transport per ``(host, port, user)``, pooled at module level and shared by every runner and
  thread (a Transport multiplexes channels safely); ``close_all()`` drops them all.
* Host keys are pinned in ``$GTRAIN_HOME/ssh/known_hosts``. An unknown key is trusted on first use only by
  a runner made with ``tofu=True`` (``gtrain up``), which records it and reports its fingerprint; otherwise
  it is refused. A changed key is always refused. The same file is given to ``ssh``/``rsync``.
* paramiko is imported inside functions only: importing this module costs nothing at CLI start-up.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import posixpath
import select
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from gtrain.errors import ConfigError, RemoteCommandError, RemoteError, SyncError
from gtrain.remote.base import CommandResult, Runner
from gtrain.state import gtrain_home

if TYPE_CHECKING:
    import paramiko

#: keepalive interval of every pooled transport, seconds
KEEPALIVE_S = 15
#: default bound on the time spent retrying a connection (refused / timed out / banner not yet sent)
CONNECT_RETRY_S = 30.0
#: per-attempt TCP/banner/auth timeout
CONNECT_TIMEOUT_S = 10.0
#: flow-control window and largest packet we accept (OpenSSH sends up to 256 KiB packets when allowed;
#: fewer, bigger packets is most of paramiko's bulk-transfer speed)
WINDOW_SIZE = 64 << 20
MAX_PACKET = 256 << 10
#: ciphers we prefer: AES-GCM is one pass through OpenSSL per packet (no separate HMAC)
_CIPHER_PREFERENCE = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_READ = 1 << 18

HostKeyCallback = Callable[[str, int, str, str], None]


# ---- targets and ssh config ------------------------------------------------------------------------


@dataclass(frozen=True)
class SSHTarget:
    host: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    #: ``[user@]host[:port]`` of a bastion; the bastion's key is pinned like any other host's
    proxy_jump: str | None = None
    #: an OpenSSH ProxyCommand; ``%h``, ``%p``, ``%r`` and ``%%`` are expanded
    proxy_command: str | None = None

    @property
    def display(self) -> str:
        return f"{self.user}@{_hostport(self.host, self.port)}"

    def jump_target(self) -> SSHTarget | None:
        if not self.proxy_jump:
            return None
        user, host, port = parse_jump(self.proxy_jump, self.user)
        return SSHTarget(host=host, port=port, user=user, identity_file=self.identity_file)


def parse_jump(spec: str, default_user: str) -> tuple[str, str, int]:
    """``[user@]host[:port]`` (``[v6addr]:port`` too) -> (user, host, port)."""
    s = spec.strip()
    if "," in s:
        raise ConfigError(f"proxy_jump {spec!r}: only one jump host is supported", field="proxy_jump")
    user = default_user
    if "@" in s:
        user, s = s.rsplit("@", 1)
    port = 22
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        if rest.startswith(":"):
            port = _port(rest[1:], spec)
    elif s.count(":") == 1:
        host, p = s.split(":")
        port = _port(p, spec)
    else:
        host = s
    if not host or not user:
        raise ConfigError(f"proxy_jump {spec!r}: expected [user@]host[:port]", field="proxy_jump")
    return user, host, port


def _port(text: str, spec: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise ConfigError(f"proxy_jump {spec!r}: bad port {text!r}", field="proxy_jump")
    return port


def expand_proxy_command(command: str, host: str, port: int, user: str) -> str:
    """Expand OpenSSH's ``%h`` (host), ``%p`` (port), ``%r`` (user) and ``%%`` in a ProxyCommand."""
    out: list[str] = []
    i = 0
    while i < len(command):
        c = command[i]
        if c == "%" and i + 1 < len(command):
            nxt = command[i + 1]
            rep = {"h": host, "p": str(port), "r": user, "%": "%"}.get(nxt)
            if rep is None:
                raise ConfigError(f"proxy_command: unsupported token %{nxt} (use %h, %p, %r or %%)",
                                  field="proxy_command")
            out.append(rep)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def ssh_config_block(alias: str, target: SSHTarget, known_hosts_path: str | os.PathLike[str]) -> str:
    """An OpenSSH ``Host`` block for ``target`` that checks host keys against gtrain's pinned file."""
    kh = _cfg_value(str(known_hosts_path))
    lines = [
        f"Host {alias}",
        f"  HostName {target.host}",
        f"  Port {target.port}",
        f"  User {target.user}",
    ]
    if target.identity_file:
        lines += [f"  IdentityFile {_cfg_value(str(target.identity_file))}", "  IdentitiesOnly yes"]
    lines += [
        f"  UserKnownHostsFile {kh}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  HashKnownHosts no",
    ]
    if target.proxy_command:
        lines.append(f"  ProxyCommand {target.proxy_command}")
    elif target.proxy_jump:
        lines.append(f"  ProxyJump {target.proxy_jump}")
    return "\n".join(lines) + "\n"


def _cfg_value(value: str) -> str:
    return f'"{value}"' if any(c.isspace() for c in value) else value


def _hostport(host: str, port: int) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"{h}:{port}"


# ---- known hosts (pinning) -------------------------------------------------------------------------

_KH_LOCK = threading.Lock()


def ssh_dir() -> Path:
    d = gtrain_home() / "ssh"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        os.chmod(d, 0o700)
    return d


def known_hosts_path() -> Path:
    return ssh_dir() / "known_hosts"


def known_hosts_name(host: str, port: int) -> str:
    """How OpenSSH (and paramiko) name a host in known_hosts."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint_sha256(key_b64: str) -> str:
    """``SHA256:...`` as ``ssh-keygen -l`` prints it."""
    digest = hashlib.sha256(base64.b64decode(key_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@contextlib.contextmanager
def _known_hosts_locked() -> Iterator[Path]:
    path = known_hosts_path()
    with _KH_LOCK, open(path.with_name("known_hosts.lock"), "a+") as lk:
        os.chmod(lk.name, 0o600)
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _write_lines(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _line_hosts(line: str) -> list[str]:
    s = line.strip()
    if not s or s.startswith("#"):
        return []
    return s.split()[0].split(",")


def parse_key_line(key_line: str) -> tuple[str, str]:
    """``keytype base64 [comment]`` or a known_hosts line ``hosts keytype base64`` -> (keytype, base64).
    The key is checked by paramiko, so a typo fails here, not at connect time."""
    from paramiko import PKey, SSHException

    parts = key_line.split()
    for i in range(min(2, max(0, len(parts) - 1))):
        keytype, b64 = parts[i], parts[i + 1]
        try:
            key = PKey.from_type_string(keytype, base64.b64decode(b64, validate=True))
        except (SSHException, ValueError, TypeError):
            continue
        return key.get_name(), b64
    raise ConfigError(f"not an SSH public host key: {key_line[:80]!r}", hint="expected e.g. 'ssh-ed25519 AAAA...'",
                      field="host_keys")


def pin_host_key(host: str, port: int, key_line: str) -> None:
    """Pin ``key_line`` for ``host:port`` (replacing a pinned key of the same type)."""
    keytype, b64 = parse_key_line(key_line)
    name = known_hosts_name(host, port)
    with _known_hosts_locked() as path:
        lines = [ln for ln in _read_lines(path)
                 if not (name in _line_hosts(ln) and ln.split()[1:2] == [keytype])]
        lines.append(f"{name} {keytype} {b64}")
        _write_lines(path, lines)


def forget_host(host: str, port: int = 22) -> int:
    """Drop every pinned key of ``host:port``; returns how many lines went. Its pooled connection closes."""
    name = known_hosts_name(host, port)
    with _known_hosts_locked() as path:
        lines = _read_lines(path)
        keep = [ln for ln in lines if name not in _line_hosts(ln)]
        if len(keep) != len(lines):
            _write_lines(path, keep)
    for key in [k for k in list(_POOL) if k[0] == host and k[1] == port]:
        _POOL.drop(key)
    return len(lines) - len(keep)


def pinned_keys(host: str, port: int = 22) -> list[tuple[str, str]]:
    """(keytype, base64) pinned for ``host:port``."""
    name = known_hosts_name(host, port)
    out = []
    for ln in _read_lines(known_hosts_path()):
        parts = ln.split()
        if len(parts) >= 3 and name in _line_hosts(ln):
            out.append((parts[1], parts[2]))
    return out


class _Refused(Exception):
    """Raised from the host key policy; turned into a RemoteError by the connect code."""


_POLICY_CLS: Any = None


def _policy(tofu: bool, on_new: HostKeyCallback | None, port: int) -> paramiko.MissingHostKeyPolicy:
    global _POLICY_CLS
    if _POLICY_CLS is None:
        import paramiko

        class PinnedPolicy(paramiko.MissingHostKeyPolicy):
            """Unknown host key: record it (trust on first use) only when allowed, else refuse."""

            def __init__(self, tofu: bool, on_new: HostKeyCallback | None, port: int) -> None:
                self.tofu, self.on_new, self.port = tofu, on_new, port

            def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
                # paramiko passes "[host]:port" for non-22 ports; we want the bare host
                host = hostname
                if hostname.startswith("[") and "]:" in hostname:
                    host = hostname[1:].split("]:", 1)[0]
                fp = fingerprint_sha256(key.get_base64())
                if not self.tofu:
                    raise _Refused(f"host key of {_hostport(host, self.port)} is not known "
                                   f"({key.get_name()} {fp})")
                pin_host_key(host, self.port, f"{key.get_name()} {key.get_base64()}")
                if self.on_new:
                    self.on_new(host, self.port, key.get_name(), fp)

        _POLICY_CLS = PinnedPolicy
    return _POLICY_CLS(tofu, on_new, port)  # type: ignore[no-any-return]


# ---- the connection pool ---------------------------------------------------------------------------


@dataclass
class ConnectOptions:
    tofu: bool = False
    on_new_host_key: HostKeyCallback | None = None
    retry_s: float = CONNECT_RETRY_S
    timeout_s: float = CONNECT_TIMEOUT_S
    keepalive_s: int = KEEPALIVE_S


class _Pool:
    """One live SSHClient per (host, port, user). Connecting to different hosts happens in parallel;
    two threads asking for the same host wait for one connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, int, str], paramiko.SSHClient] = {}
        self._key_locks: dict[tuple[str, int, str], threading.Lock] = {}
        self.connects = 0  # how many connections were ever made (tests check reuse)

    def __iter__(self) -> Iterator[tuple[str, int, str]]:
        with self._lock:
            return iter(list(self._clients))

    def get(self, target: SSHTarget, opts: ConnectOptions) -> paramiko.SSHClient:
        key = (target.host, target.port, target.user)
        with self._lock:
            klock = self._key_locks.setdefault(key, threading.Lock())
        with klock:
            with self._lock:
                client = self._clients.get(key)
            if client is not None:
                t = client.get_transport()
                if t is not None and t.is_active():
                    return client
                with self._lock:
                    self._clients.pop(key, None)
                _close_client(client)
            client = _connect(target, opts)
            with self._lock:
                self._clients[key] = client
                self.connects += 1
            return client

    def drop(self, key: tuple[str, int, str]) -> None:
        with self._lock:
            client = self._clients.pop(key, None)
        if client is not None:
            _close_client(client)

    def transports(self) -> dict[tuple[str, int, str], Any]:
        with self._lock:
            return {k: c.get_transport() for k, c in self._clients.items()}

    def close_all(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for c in clients:
            _close_client(c)


_POOL = _Pool()


def close_all() -> None:
    """Close every pooled connection (processes started detached on the nodes keep running)."""
    _POOL.close_all()


def pool_stats() -> dict[str, int]:
    return {"open": len(_POOL.transports()), "connects": _POOL.connects}


def _close_client(client: paramiko.SSHClient) -> None:
    """Close a client and reap its proxy command, if any."""
    with contextlib.suppress(Exception):
        client.close()
    proxy = getattr(client, "_gtrain_proxy", None)
    if proxy is not None:
        proxy.close()


def _transport_factory(sock: Any, **kw: Any) -> paramiko.Transport:
    import paramiko

    t = paramiko.Transport(sock, default_window_size=WINDOW_SIZE, default_max_packet_size=MAX_PACKET, **kw)
    opts = t.get_security_options()
    pref = [c for c in _CIPHER_PREFERENCE if c in opts.ciphers]
    opts.ciphers = tuple(pref + [c for c in opts.ciphers if c not in pref])
    # Never start a rekey ourselves: a client-initiated rekey deadlocks paramiko's transport thread for 30 s
    # when the server's CHANNEL_CLOSE crosses our KEXINIT (paramiko#822), i.e. on pulls past 512 MiB. The
    # server still rekeys at its own RekeyLimit (OpenSSH: per cipher, ~64 GiB for AES), which paramiko handles.
    t.packetizer.REKEY_BYTES = t.packetizer.REKEY_PACKETS = 1 << 62
    return t


class _ProxyCommand:
    """An OpenSSH-style ProxyCommand (run by ``sh -c``) whose stdin/stdout are one end of a socketpair; the
    other end is a real socket for paramiko. Used instead of ``paramiko.ProxyCommand``, which never reaps or
    closes its child, spins on EOF and raises in the transport thread when the child is already gone."""

    def __init__(self, command: str) -> None:
        import tempfile

        self.command = command
        self.sock, theirs = socket.socketpair()
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(["/bin/sh", "-c", f"exec {command}"], stdin=theirs.fileno(),
                                         stdout=theirs.fileno(),
                                         stderr=self.stderr, start_new_session=True)
        except OSError:
            self.sock.close()
            self.stderr.close()
            raise
        finally:
            theirs.close()

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            self.stderr.seek(0)
            return self.stderr.read()[-500:].decode(errors="replace").strip()
        return ""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def _open_sock(target: SSHTarget, opts: ConnectOptions, timeout: float) -> Any:
    if target.proxy_command:
        return _ProxyCommand(expand_proxy_command(target.proxy_command, target.host, target.port, target.user))
    jump = target.jump_target()
    if jump is not None:
        bastion = _POOL.get(jump, ConnectOptions(opts.tofu, opts.on_new_host_key, opts.retry_s, opts.timeout_s,
                                                 opts.keepalive_s))
        t = bastion.get_transport()
        assert t is not None
        return t.open_channel("direct-tcpip", (target.host, target.port), ("127.0.0.1", 0), timeout=timeout)
    sock = socket.create_connection((target.host, target.port), timeout=timeout)
    # small requests (exec, window adjusts) must not wait for Nagle + delayed ACK (40 ms per command)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _connect(target: SSHTarget, opts: ConnectOptions) -> paramiko.SSHClient:
    import paramiko

    deadline = time.monotonic() + max(0.0, opts.retry_s)
    delay = 0.25
    attempts = 0
    while True:
        attempts += 1
        left = deadline - time.monotonic()
        timeout = max(0.5, min(opts.timeout_s, left)) if opts.retry_s > 0 else opts.timeout_s
        client = paramiko.SSHClient()
        kh = known_hosts_path()
        if kh.exists():
            client.load_system_host_keys(str(kh))
        client.set_missing_host_key_policy(_policy(opts.tofu, opts.on_new_host_key, target.port))
        retry_cause: str | None = None
        client._gtrain_proxy = None  # type: ignore[attr-defined]
        try:
            sock = _open_sock(target, opts, timeout)
            if isinstance(sock, _ProxyCommand):
                client._gtrain_proxy = sock  # type: ignore[attr-defined]
                sock = sock.sock
            client.connect(
                target.host, port=target.port, username=target.user, key_filename=target.identity_file,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                allow_agent=target.identity_file is None, look_for_keys=target.identity_file is None, sock=sock,
                transport_factory=_transport_factory,
            )
            t = client.get_transport()
            assert t is not None
            t.set_keepalive(opts.keepalive_s)
            return client
        except _Refused as e:
            _close_client(client)
            raise RemoteError(
                f"cannot connect to {target.display}: {e}; refusing an unpinned host key",
                hint="pin it in the spec (`host_keys:`) or let `gtrain up` record it on first connect",
            ) from None
        except paramiko.BadHostKeyException as e:
            _close_client(client)
            raise RemoteError(
                f"cannot connect to {target.display}: host key for {_hostport(target.host, target.port)} CHANGED "
                f"(pinned {e.expected_key.get_name()} {fingerprint_sha256(e.expected_key.get_base64())}, "
                f"offered {e.key.get_name()} {fingerprint_sha256(e.key.get_base64())}); refusing to connect",
                hint=f"if the host was rebuilt, run `gtrain ssh-forget {target.host} --port {target.port}` "
                     "and connect again; otherwise someone may be intercepting the connection",
            ) from None
        except paramiko.AuthenticationException as e:
            _close_client(client)
            raise RemoteError(
                f"cannot connect to {target.display}: authentication failed ({e})",
                hint=f"check the user and identity file ({target.identity_file or 'agent/default keys'})",
            ) from None
        except ConfigError:
            _close_client(client)
            raise
        except RemoteError:
            _close_client(client)
            raise
        except ConnectionRefusedError:
            retry_cause = "connection refused"
        except TimeoutError:
            retry_cause = f"timed out (after {timeout:.1f}s)"
        except socket.gaierror as e:
            retry_cause = f"cannot resolve host name ({e.strerror or e})"
        except OSError as e:
            retry_cause = f"{e.strerror or e}"
        except paramiko.ChannelException as e:
            retry_cause = f"the jump host could not open a channel ({e.text or e.code})"
        except paramiko.SSHException as e:
            retry_cause = f"ssh handshake failed ({e})"
        except EOFError:
            retry_cause = "connection closed during the handshake"
        proxy = getattr(client, "_gtrain_proxy", None)
        if proxy is not None and (tail := proxy.stderr_tail()):
            retry_cause = f"{retry_cause}; proxy command said: {tail}"
        _close_client(client)
        left = deadline - time.monotonic()
        if left <= 0:
            via = f" via {target.proxy_jump}" if target.proxy_jump else (" via proxy command"
                                                                        if target.proxy_command else "")
            raise RemoteError(
                f"cannot connect to {target.display}{via}: {retry_cause} "
                f"({attempts} attempt{'s' if attempts > 1 else ''} in {opts.retry_s:.0f}s)",
                hint="is the host up, its sshd running and port reachable from here?",
            )
        time.sleep(min(delay, left))
        delay = min(delay * 2, 5.0)


# ---- the runner ------------------------------------------------------------------------------------


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
                return t.open_session(timeout=self._opts.timeout_s)
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
        on_err: Callable[[bytes], None] | None, cwd: bool = True,
    ) -> int:
        """Run ``cmd``; feed its stdout (and stderr, merged when on_err is None) to the callbacks."""
        import paramiko

        full = self._wrap(cmd, cwd)
        chan = self._open_session()
        deadline = time.monotonic() + timeout if timeout else None
        feeder: threading.Thread | None = None
        try:
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
                select.select([chan], [], [], wait)
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
            chan.invoke_subsystem("sftp")
            return paramiko.SFTPClient(chan)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise self._lost(e, "sftp open") from None

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.root, path)

    def rsync_available(self) -> bool:
        if self._use_rsync is False or shutil.which("rsync") is None:
            return False
        if self._remote_rsync is None:
            self._remote_rsync = self.run("command -v rsync", check=False, timeout=60).rc == 0
        return self._remote_rsync

    def put_files(self, local_root: Path, files: Sequence[str], remote_dir: str) -> int:
        if not files:
            return 0
        remote_dir = self._abs(remote_dir)
        if self.rsync_available():
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
        self.run(f"mkdir -p {shlex.quote(remote_dir)}", timeout=60)
        ssh = self.rsync_ssh_command()
        argv = ["rsync", "-a", "--protect-args", "--itemize-changes", "--files-from=-", "-e", ssh, f"{local_root}/",
                f"gtrain-node:{remote_dir}/"]
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
        path = self._abs(remote_path)
        sftp = self._sftp()
        try:
            parent = posixpath.dirname(path)
            _sftp_makedirs(sftp, parent, set())
            tmp = posixpath.join(parent, f".{posixpath.basename(path)}.gtrain-tmp")
            with sftp.open(tmp, "wb") as f:
                f.chmod(mode)  # before any byte lands: secrets are never world-readable
                f.set_pipelined(True)
                f.write(data)
            sftp.posix_rename(tmp, path)
        except OSError as e:
            raise SyncError(f"{self.label}: cannot write {self.target.display}:{path}: {e}") from None
        finally:
            sftp.close()

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
