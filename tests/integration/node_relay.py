"""ProxyCommand for the cloud end-to-end tests: plays the part of a cloud instance's network and of its
guest agent (cloud-init on EC2, the guest environment on GCE).

    python node_relay.py aws|gcp|lambda|azure|tpu DIR INSTANCE

``DIR/hosts.json`` lists the sshd hosts (``{"hosts": [[addr, port], ...], "authorized_keys": path}``). The
first time an instance is seen it is given the next free host (kept in ``DIR/map.json``; on AWS, when none is
free, the hosts of terminated instances are given back: a replaced node's new instance gets one), and the public key
the cloud would install is put in the hosts' authorized_keys: on AWS the instance's key pair (asked of EC2,
i.e. moto), on GCP the instance's ``ssh-keys`` metadata (asked of the Compute Engine endpoint in
CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE, i.e. the fake), on Lambda the SSH key the instance at that IP was
launched with (asked of the Lambda API in LAMBDA_API_URL, i.e. tests/fixtures/fake_lambda.py), on Azure the
keys of the VM's ``osProfile.linuxConfiguration.ssh.publicKeys`` (asked of the fake ARM in
GTRAIN_AZURE_ARM_ENDPOINT, as the Azure Linux agent reads them at provisioning). Then bytes are relayed between
stdin/stdout and that host's sshd.

On AWS and Azure, a terminated instance (a deleted or evicted VM) is gone like a real one: a connection to it
is refused, and its host is freed for the next new instance (the spot-interruption test re-provisions a node
onto the host its interrupted instance had).
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


def setup(d: Path, hosts: list[Any]) -> Path:
    """Make ``d`` a relay folder over the sshd ``hosts`` (tests/fixtures/sshd.py); returns it."""
    d.mkdir(parents=True, exist_ok=True)
    auth = Path(hosts[0].identity_file).parent / "authorized_keys"
    (d / "hosts.json").write_text(json.dumps({"hosts": [[h.address, h.port] for h in hosts],
                                              "authorized_keys": str(auth)}))
    return d


def relay_hosts(ssh_hosts: Any, d: Path) -> list[Any]:
    """Two sshd hosts of the session (tests/fixtures/sshd.py; the last two when there are four, the ssh tests
    use the first), listed in ``d/hosts.json`` for the relay to hand to instances."""
    hosts = [ssh_hosts[2], ssh_hosts[3]] if len(ssh_hosts) >= 4 else [ssh_hosts[0], ssh_hosts[1]]
    setup(d, hosts)
    return hosts


def host_of(d: Path, iid: str, hosts: list[Any]) -> Any:
    """The sshd host the relay gave instance ``iid`` (it hands hosts out in the order instances are first
    reached, so rank 1 is not always the second host)."""
    addr, port = json.loads((d / "map.json").read_text())[iid]
    return next(h for h in hosts if (h.address, int(h.port)) == (addr, int(port)))


def aws_public_keys(iid: str) -> list[str]:
    import boto3

    ec2 = boto3.client("ec2")
    inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    kp = ec2.describe_key_pairs(KeyNames=[inst["KeyName"]], IncludePublicKey=True)["KeyPairs"][0]
    return [kp["PublicKey"].strip()]


def aws_gone(ids: list[str]) -> set[str]:
    """Which of ``ids`` EC2 (moto) says are terminated, shutting down, or unknown."""
    import boto3

    if not ids:
        return set()
    alive: set[str] = set()
    pages = boto3.client("ec2").get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-id", "Values": ids}])
    for page in pages:
        for res in page["Reservations"]:
            alive |= {i["InstanceId"] for i in res["Instances"]
                      if i["State"]["Name"] not in ("shutting-down", "terminated")}
    return set(ids) - alive


def gcp_public_keys(name: str) -> list[str]:
    endpoint = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"].rstrip("/")
    project = os.environ["GOOGLE_CLOUD_PROJECT"]
    req = urllib.request.Request(f"{endpoint}/projects/{project}/aggregated/instances",
                                 headers={"Authorization": f"Bearer {os.environ.get('GTRAIN_TEST_GOOGLE_TOKEN', '')}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        scopes = json.load(r).get("items", {})
    inst = next(i for s in scopes.values() for i in s.get("instances", []) if i["name"] == name)
    items = {i["key"]: i["value"] for i in inst.get("metadata", {}).get("items", [])}
    # "user:ssh-ed25519 AAAA... comment" lines: the guest agent makes the user and installs the key
    return [" ".join(line.split(":", 1)[1].split()[:2]) for line in items.get("ssh-keys", "").splitlines() if line]


def tpu_public_keys(worker: str) -> list[str]:
    """The ``ssh-keys`` metadata of the TPU node whose worker ``<node>-wN`` is %h, from the TPU API (the fake in
    CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU), as the TPU VM's guest environment installs it on every worker."""
    endpoint = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"].rstrip("/")
    req = urllib.request.Request(f"{endpoint}/v2/projects/{os.environ['GOOGLE_CLOUD_PROJECT']}/locations/-/nodes",
                                 headers={"Authorization": f"Bearer {os.environ.get('GTRAIN_TEST_GOOGLE_TOKEN', '')}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        nodes = json.load(r).get("nodes", [])
    node = next(n for n in nodes if n["name"].rsplit("/", 1)[-1] == worker.rsplit("-w", 1)[0])
    return [" ".join(line.split(":", 1)[1].split()[:2]) for line in node["metadata"]["ssh-keys"].splitlines() if line]


def lambda_public_keys(ip: str) -> list[str]:
    """The key of the instance at ``ip`` (%h), from Lambda's API (the fake in LAMBDA_API_URL), as Lambda installs it."""

    def get(path: str) -> object:
        req = urllib.request.Request(os.environ["LAMBDA_API_URL"] + path,
                                     headers={"Authorization": f"Bearer {os.environ['LAMBDA_API_KEY']}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)["data"]

    inst = next(i for i in get("/instances") if i["ip"] == ip)  # type: ignore[attr-defined]
    return [k["public_key"] for k in get("/ssh-keys") if k["name"] in inst["ssh_key_names"]]  # type: ignore[attr-defined]


def azure_vm(name: str) -> dict[str, Any] | None:
    """The VM ``name`` as ARM (the fake in GTRAIN_AZURE_ARM_ENDPOINT) has it; None when it is gone."""
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


def azure_public_keys(name: str) -> list[str]:
    vm = azure_vm(name) or {}
    keys = vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]
    return [" ".join(k["keyData"].split()[:2]) for k in keys]


def assign(cloud: str, d: Path, iid: str) -> tuple[str, int]:
    conf = json.loads((d / "hosts.json").read_text())
    with open(d / "map.lock", "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        mp = d / "map.json"
        mapping = json.loads(mp.read_text()) if mp.exists() else {}
        if cloud == "aws":
            gone = aws_gone([*mapping, iid])
            if iid in gone:  # (each refusal is noted: a test can tell who tried to reach a machine that is gone)
                with open(d / "refused.log", "a") as f:
                    f.write(f"{iid}\n")
                sys.exit(f"relay: {iid} is terminated")
            if gone:  # their hosts are free again (a real terminated instance's address is released)
                mapping = {k: v for k, v in mapping.items() if k not in gone}
                mp.write_text(json.dumps(mapping))
        if cloud == "azure" and azure_vm(iid) is None:  # deleted or evicted: refused, its host freed
            mapping.pop(iid, None)
            mp.write_text(json.dumps(mapping))
            sys.exit(f"relay: VM {iid} does not exist")
        if iid not in mapping:
            used = {tuple(v) for v in mapping.values()}
            free = [h for h in conf["hosts"] if tuple(h) not in used]
            if not free:
                sys.exit(f"relay: no sshd host left for {iid}")
            ak = Path(conf["authorized_keys"])
            keys_of = {"aws": aws_public_keys, "gcp": gcp_public_keys, "lambda": lambda_public_keys,
                       "azure": azure_public_keys, "tpu": tpu_public_keys}[cloud]
            for pub in keys_of(iid):
                if pub not in ak.read_text():
                    with open(ak, "a") as f:
                        f.write(pub + "\n")
            mapping[iid] = free[0]
            mp.write_text(json.dumps(mapping))
        return mapping[iid][0], int(mapping[iid][1])


def main() -> None:
    cloud, d, iid = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if cloud not in ("aws", "gcp", "lambda", "azure", "tpu"):
        sys.exit(f"relay: unknown cloud {cloud!r}")
    addr, port = assign(cloud, d, iid)
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
