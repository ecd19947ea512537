"""Host keys pinned in ``$GTRAIN_HOME/ssh/known_hosts``: pinning, forgetting, fingerprints, and the
paramiko missing-host-key policy (trust on first use only when allowed, else refuse).

paramiko is imported inside functions only."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.state import gtrain_home
from gtrain.state.sshtarget import _hostport

if TYPE_CHECKING:
    import paramiko

HostKeyCallback = Callable[[str, int, str, str], None]
"""Called as ``(host, port, keytype, fingerprint)`` when a new host key is pinned on first use."""

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


def unpin_host(host: str, port: int = 22) -> int:
    """Drop every pinned key of ``host:port``; returns how many lines went. (:func:`.connect.forget_host` also
    closes the host's pooled connection.)"""
    name = known_hosts_name(host, port)
    with _known_hosts_locked() as path:
        lines = _read_lines(path)
        keep = [ln for ln in lines if name not in _line_hosts(ln)]
        if len(keep) != len(lines):
            _write_lines(path, keep)
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


_map_cache: tuple[tuple[str, int, int, int], dict[str, list[tuple[str, str]]]] | None = None


def pinned_map() -> dict[str, list[tuple[str, str]]]:
    """Every pinned key by known_hosts name (``host`` or ``[host]:port``): the file parsed once per change
    (same path, inode, size and mtime), not once per connection -- 1,000 connections each parsing a
    1,000-line file were 10^6 key parses and most of `up`'s CPU at 1,000 nodes (docs/scale.md)."""
    global _map_cache
    path = known_hosts_path()
    try:
        st = path.stat()
        stamp = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        return {}
    cached = _map_cache
    if cached is not None and cached[0] == stamp:
        return cached[1]
    out: dict[str, list[tuple[str, str]]] = {}
    for ln in _read_lines(path):
        parts = ln.split()
        if len(parts) >= 3 and not ln.startswith(("#", "@")):
            for name in _line_hosts(ln):
                out.setdefault(name, []).append((parts[1], parts[2]))
    _map_cache = (stamp, out)
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
