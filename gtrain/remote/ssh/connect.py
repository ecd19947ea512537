"""Connections: one paramiko client per ``(host, port, user)`` in a module-level pool shared by every
runner and thread, the socket under it (direct TCP, a jump host's channel, or a proxy command), and
:func:`_connect` with its retries -- the one place where paramiko's errors become gtrain's.

paramiko is imported inside functions only."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, RemoteError
from gtrain.remote.ssh.hostkeys import (
    HostKeyCallback,
    _policy,
    _Refused,
    fingerprint_sha256,
    known_hosts_name,
    pinned_map,
    unpin_host,
)
from gtrain.remote.ssh.logs import route_paramiko_logs
from gtrain.state.sshtarget import SSHTarget, _hostport, expand_proxy_command

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
        self.channels = 0  # how many sessions (commands, sftp) were opened on them: round trips, for the bench
        self.external = 0  # connections made by another program (rsync's ssh), one session each
        self.relayed = 0  # nodes a relay reached for us (gtrain/remote/tree.py): no connection from here

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

    def count_channel(self) -> None:
        with self._lock:
            self.channels += 1

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

#: set to a file path, every process writes its :func:`pool_stats` there as JSON when it exits (the scale
#: bench counts round trips per command with it; docs/scale.md)
ENV_STATS = "GTRAIN_SSH_STATS"


def _write_stats() -> None:
    import json

    path = os.environ.get(ENV_STATS)
    if path:
        with contextlib.suppress(OSError), open(path, "w") as f:
            json.dump(pool_stats(), f)


if os.environ.get(ENV_STATS):
    import atexit

    atexit.register(_write_stats)


def close_all() -> None:
    """Close every pooled connection (processes started detached on the nodes keep running)."""
    _POOL.close_all()


def forget_host(host: str, port: int = 22) -> int:
    """Drop every pinned key of ``host:port``; returns how many lines went. Its pooled connection closes."""
    n = unpin_host(host, port)
    for key in [k for k in list(_POOL) if k[0] == host and k[1] == port]:
        _POOL.drop(key)
    return n


def pool_stats() -> dict[str, int]:
    return {"open": len(_POOL.transports()), "connects": _POOL.connects, "channels": _POOL.channels,
            "external": _POOL.external, "relayed": _POOL.relayed}


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


def _load_pinned(client: paramiko.SSHClient, target: SSHTarget) -> None:
    """Give the client the keys pinned for this host only (not the whole known_hosts file: each key line is a
    key object, and N clients each holding N of them is O(N^2) time and memory)."""
    import base64

    import paramiko

    name = known_hosts_name(target.host, target.port)
    keys = client.get_host_keys()
    for ktype, b64 in pinned_map().get(name, []):
        try:
            keys.add(name, ktype, paramiko.PKey.from_type_string(ktype, base64.b64decode(b64)))
        except (paramiko.SSHException, ValueError, TypeError):
            continue  # an unknown key type or a damaged line: as paramiko's own loader, skip it


def _connect(target: SSHTarget, opts: ConnectOptions) -> paramiko.SSHClient:
    import paramiko

    route_paramiko_logs()
    deadline = time.monotonic() + max(0.0, opts.retry_s)
    delay = 0.25
    attempts = 0
    while True:
        attempts += 1
        left = deadline - time.monotonic()
        timeout = max(0.5, min(opts.timeout_s, left)) if opts.retry_s > 0 else opts.timeout_s
        client = paramiko.SSHClient()
        _load_pinned(client, target)
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
