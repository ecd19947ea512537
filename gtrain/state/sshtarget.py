"""Where a node is: :class:`SSHTarget` (host, port, user, key, bastion or proxy command) and what OpenSSH
needs to reach it the same way (``ProxyJump`` parsing, ``ProxyCommand`` expansion, a ``Host`` block)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gtrain.errors import ConfigError


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
