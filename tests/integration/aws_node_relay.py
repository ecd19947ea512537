"""ProxyCommand for the AWS end-to-end test: plays the part of an EC2 instance's network and of cloud-init.

    python aws_node_relay.py DIR INSTANCE_ID

``DIR/hosts.json`` lists the sshd hosts (``{"hosts": [[addr, port], ...], "authorized_keys": path}``). The
first time an instance id is seen it is given the next free host (kept in ``DIR/map.json``), and — as
cloud-init does on a real instance — the public key of the instance's key pair (asked of EC2, i.e. moto) is
installed in the hosts' authorized_keys. Then bytes are relayed between stdin/stdout and that host's sshd.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import sys
from pathlib import Path


def assign(d: Path, iid: str) -> tuple[str, int]:
    conf = json.loads((d / "hosts.json").read_text())
    with open(d / "map.lock", "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        mp = d / "map.json"
        mapping = json.loads(mp.read_text()) if mp.exists() else {}
        if iid not in mapping:
            used = {tuple(v) for v in mapping.values()}
            free = [h for h in conf["hosts"] if tuple(h) not in used]
            if not free:
                sys.exit(f"relay: no sshd host left for {iid}")
            import boto3

            ec2 = boto3.client("ec2")
            inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
            kp = ec2.describe_key_pairs(KeyNames=[inst["KeyName"]], IncludePublicKey=True)["KeyPairs"][0]
            pub = kp["PublicKey"].strip()
            ak = Path(conf["authorized_keys"])
            if pub not in ak.read_text():
                with open(ak, "a") as f:
                    f.write(pub + "\n")
            mapping[iid] = free[0]
            mp.write_text(json.dumps(mapping))
        return mapping[iid][0], int(mapping[iid][1])


def main() -> None:
    d, iid = Path(sys.argv[1]), sys.argv[2]
    addr, port = assign(d, iid)
    s = socket.create_connection((addr, port), timeout=10)
    s.settimeout(None)
    fin, fout = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()
    while True:
        r, _, _ = select.select([fin, s], [], [])
        if fin in r:
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
        if fin == -1:
            while True:
                data = s.recv(65536)
                if not data:
                    return
                os.write(fout, data)


if __name__ == "__main__":
    main()
