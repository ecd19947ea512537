"""The nodes' pinned SSH host keys travel with the cluster's shared object (they are public keys, not secrets),
so a machine that did not run ``up`` checks the nodes' keys instead of trusting them on first use.

Lines are read from and written to ``$GTRAIN_HOME/ssh/known_hosts`` in OpenSSH's format, under the lock
``gtrain.remote.ssh.hostkeys`` takes (``known_hosts.lock``, flock), without paramiko (``status`` imports none).
A host that already has a pinned key of a type keeps it: a key from the store never replaces one seen here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^[^\s#]+ (ssh-[a-z0-9-]+|ecdsa-sha2-nistp\d+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+$")


def _name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _hosts(nodes: list[dict[str, Any]]) -> set[str]:
    out: set[str] = set()
    for n in nodes:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            ssh = json.loads(n.get("meta_json") or "{}").get("ssh") or {}
            if ssh.get("host"):
                out.add(_name(str(ssh["host"]), int(ssh.get("port") or 22)))
    return out


def lines_for(home: Path, nodes: list[dict[str, Any]]) -> list[str]:
    """The pinned known_hosts lines of the nodes' SSH hosts."""
    hosts = _hosts(nodes)
    if not hosts:
        return []
    try:
        text = (home / "ssh" / "known_hosts").read_text()
    except OSError:
        return []
    return sorted({ln.strip() for ln in text.splitlines()
                   if _LINE.match(ln.strip()) and set(ln.split()[0].split(",")) & hosts})


def pin(home: Path, lines: Any) -> None:
    """Add the lines whose host has no key of that type pinned here yet."""
    if not isinstance(lines, list):
        return
    new = [str(x).strip() for x in lines if isinstance(x, str) and _LINE.match(x.strip())]
    if not new:
        return
    d = home / "ssh"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / "known_hosts"
    with open(d / "known_hosts.lock", "a+") as lk:
        os.chmod(lk.name, 0o600)
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            try:
                have = path.read_text().splitlines()
            except FileNotFoundError:
                have = []
            known = {(ln.split()[0], ln.split()[1]) for ln in have if len(ln.split()) >= 3}
            add = [ln for ln in new if (ln.split()[0], ln.split()[1]) not in known]
            if add:
                tmp = path.with_name(".known_hosts.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write("".join(ln + "\n" for ln in [*have, *add]))
                os.replace(tmp, path)
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)
