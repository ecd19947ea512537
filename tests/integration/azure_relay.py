"""ProxyCommand for the azure tests: plays the part of an Azure VM's network and of its provisioning agent.

    python azure_relay.py DIR VM_NAME

``DIR/hosts.json`` lists the sshd hosts (written by :func:`tests.integration.node_relay.setup`). The first time a
VM is reached it is given the next free host (``DIR/map.json``), and the SSH public key of the VM's
``osProfile.linuxConfiguration.ssh.publicKeys`` (read from the fake ARM in GTRAIN_AZURE_ARM_ENDPOINT, as the
Azure Linux agent reads it at provisioning) is put in the hosts' authorized_keys. A VM that ARM no longer has
(deleted, evicted) is refused, and its host freed. Then bytes are relayed between stdin/stdout and that sshd.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def _vm(name: str) -> dict[str, Any] | None:
    endpoint = os.environ["GTRAIN_AZURE_ARM_ENDPOINT"].rstrip("/")
    sub, token = os.environ["AZURE_SUBSCRIPTION_ID"], os.environ["GTRAIN_AZURE_ACCESS_TOKEN"]
    group = "gtrain-" + name.rsplit("-", 1)[0]
    url = (f"{endpoint}/subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/"
           f"{name}?api-version=2024-07-01")
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    for _ in range(20):  # the fake throttles now and then
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                doc: dict[str, Any] = json.load(r)
                return doc
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            if e.code != 429:
                raise
    raise SystemExit(f"relay: ARM kept throttling GET {name}")


def assign(d: Path, name: str) -> tuple[str, int]:
    conf = json.loads((d / "hosts.json").read_text())
    with open(d / "map.lock", "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        mp = d / "map.json"
        mapping = json.loads(mp.read_text()) if mp.exists() else {}
        vm = _vm(name)
        if vm is None:
            mapping.pop(name, None)
            mp.write_text(json.dumps(mapping))
            sys.exit(f"relay: VM {name} does not exist")
        if name not in mapping:
            used = {tuple(v) for v in mapping.values()}
            free = [h for h in conf["hosts"] if tuple(h) not in used]
            if not free:
                sys.exit(f"relay: no sshd host left for {name}")
            ak = Path(conf["authorized_keys"])
            keys = vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]
            for k in keys:
                pub = " ".join(k["keyData"].split()[:2])
                if pub not in ak.read_text():
                    with open(ak, "a") as f:
                        f.write(pub + "\n")
            mapping[name] = free[0]
            mp.write_text(json.dumps(mapping))
        return mapping[name][0], int(mapping[name][1])


def main() -> None:
    d, name = Path(sys.argv[1]), sys.argv[2]
    addr, port = assign(d, name)
    s = socket.create_connection((addr, port), timeout=10)
    s.settimeout(None)
    fin, fout = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()
    while True:
        r, _, _ = select.select([fin, s] if fin >= 0 else [s], [], [])
        if fin >= 0 and fin in r:
            data = os.read(fin, 65536)
            if not data:
                s.shutdown(socket.SHUT_WR)
                fin = -1
            else:
                s.sendall(data)
        if s in r:
            data = s.recv(65536)
            if not data:
                return
            os.write(fout, data)


if __name__ == "__main__":
    main()
