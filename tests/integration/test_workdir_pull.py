"""Nodes pull the workdir (issue 38, item 2) on real sshd hosts in network namespaces (tests/fixtures/sshd.py):
the bundle leaves this machine once -- into the run's store (moto's S3 on the hosts' bridge) or onto node 0,
which serves it to the others -- and every node ends with the same files, checked by sha256. A node that
cannot reach node 0 is pushed the files from here (one warning line) and its job still runs; a corrupt copy
in the store is refused by the nodes and sent again. The checkpoint tool and job.data's sync engine are sent
to a node only when it lacks them.

The counts are real: every bundle upload (to the store, or to node 0 through ``put_files``) and every push
goes through the functions wrapped here."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.jobs import workdir as wd
from gtrain.remote import ssh as sshmod
from gtrain.remote.ssh.runner import SSHRunner

CHECK = """import hashlib, os, sys
root = os.environ["GTRAIN_WORKDIR"]
for d, _, fs in sorted(os.walk(root)):
    for f in sorted(fs):
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        if not rel.startswith(("ckpt", "data")):
            print("sha", rel, hashlib.sha256(open(p, "rb").read()).hexdigest())
"""


class Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)

    warn = info

    def node(self, rank: int, msg: str) -> None:
        self.lines.append(f"node {rank}: {msg}")

    def line(self, node: int, rank: int | None, text: str) -> None:
        self.lines.append(text)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every bundle upload to the store and every ``put_files`` from this machine, with what it sent."""
    seen: dict[str, list[Any]] = {"store": [], "put": [], "tool": [], "engine": []}
    real_store, real_put, real_write = wd._store_put, SSHRunner.put_files, SSHRunner.write_file

    def store_put(url: str, b: wd.Bundle, force: bool) -> tuple[str, bool]:
        key, sent = real_store(url, b, force)
        if sent:
            seen["store"].append(b.size)
        return key, sent

    def put(self: SSHRunner, local_root: Path, files: Any, remote_dir: str) -> int:
        moved = real_put(self, local_root, files, remote_dir)
        seen["put"].append((self.target.host, list(files), sum((Path(local_root) / f).stat().st_size for f in files)))
        return moved

    def write(self: SSHRunner, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        if remote_path.endswith(("/gtrain-ckpt.pyz", "/gtrain-sync.pyz")):  # the checkpoint tool, the sync engine
            seen["tool" if remote_path.endswith("ckpt.pyz") else "engine"].append(self.target.host)
        real_write(self, remote_path, data, mode)

    monkeypatch.setattr(wd, "_store_put", store_put)
    monkeypatch.setattr(SSHRunner, "write_file", write)
    monkeypatch.setattr(SSHRunner, "put_files", put)
    monkeypatch.setenv("GTRAIN_WORKDIR_PULL_MIN_NODES", "2")  # three nodes pull (the default pulls from 4)
    return seen


@pytest.fixture(autouse=True)
def fresh_pool() -> None:
    sshmod.close_all()


def _spec(tmp_path: Path, hosts: list[Any], name: str, **job: Any) -> tuple[Path, Path]:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True, exist_ok=True)
    (work / "check.py").write_text(CHECK)
    (work / "pkg" / "weights.bin").write_bytes(os.urandom(3_000_000))
    (work / "pkg" / "conf.txt").write_text("lr: 0.1\n")
    (work / ".gtrainignore").write_text("*.big\n")
    (work / "local.big").write_text("never leaves")
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "ssh", "num_nodes": len(hosts),
        "ssh": {"user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
                "hosts": [f"{h.address}:{h.port}" for h in hosts],
                "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts}},
        "job": {"workdir": str(work), "run": "check.py", "launcher": "python", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "python": sys.executable, **job}}))
    return spec, work


def _local_shas(work: Path) -> dict[str, str]:
    from gtrain.sync.workdir import list_workdir

    return {rel: hashlib.sha256((work / rel).read_bytes()).hexdigest() for rel in list_workdir(work)}


def _run(spec: Path, name: str, notes: Notes) -> dict[int, dict[str, str]]:
    """Launch, wait, and each node's files as its job saw them (sha256 each)."""
    job = gtrain.launch(spec, report=notes)
    lines: list[Any] = []
    final = gtrain.wait(name, job_id=job.job_id, on_line=lines.append, report=notes)
    assert (final.status, final.exit_code) == ("succeeded", 0), ([x.text for x in lines][-20:], notes.lines[-20:])
    out: dict[int, dict[str, str]] = {}
    for x in lines:
        if x.text.startswith("sha "):
            _, rel, sha = x.text.split(" ")
            out.setdefault(x.node, {})[rel] = sha
    return out


def _same_everywhere(seen: dict[int, dict[str, str]], work: Path, n: int) -> None:
    want = _local_shas(work)
    assert "local.big" not in want and len(want) == 4
    assert sorted(seen) == list(range(n))
    for node, files in seen.items():
        assert files == want, (node, files)


def test_three_nodes_with_a_store_upload_the_bundle_once(ssh_hosts: Any, moto_bridge: str, tmp_path: Path,
                                                         gtrain_home: Path, counted: dict[str, list[Any]]) -> None:
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="wdpull-a")
    s3.put_object(Bucket="wdpull-a", Key="ds/part-0.txt", Body=b"row 0\n")
    hosts = [ssh_hosts[0], ssh_hosts[1], ssh_hosts[2]]
    spec, work = _spec(tmp_path, hosts, "wdpa", checkpoint_store="s3://wdpull-a/runs",
                       data=[{"src": "s3://wdpull-a/ds", "dst": "data"}],
                       env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_bridge})
    notes = Notes()
    assert gtrain.up(spec, report=notes).created
    try:
        _same_everywhere(_run(spec, "wdpa", notes), work, 3)
        b = wd.build_bundle(work, sorted(_local_shas(work)), tmp_path / "b")
        assert counted["store"] == [b.size], counted  # once, not three times
        assert counted["put"] == [], counted  # nothing pushed to any node
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="wdpull-a")["Contents"]]
        assert f"runs/gtrain-workdir/{b.sha256}.tar" in keys
        said = [x for x in notes.lines if x.startswith("workdir: bundle")]
        assert said and "uploaded once to s3://wdpull-a/runs/gtrain-workdir/" in said[-1], notes.lines
        assert "3 node(s) fetched it, 0 had it, 0 pushed" in said[-1]
        assert sorted(counted["tool"]) == sorted(h.address for h in hosts), counted  # by the store's probe
        assert sorted(counted["engine"]) == sorted(h.address for h in hosts), counted  # job.data's engine
        # the same workdir again: the store and the nodes hold it already, nothing is sent
        notes.lines.clear()
        _same_everywhere(_run(spec, "wdpa", notes), work, 3)
        assert counted["store"] == [b.size] and counted["put"] == [], counted
        assert len(counted["tool"]) == 3 and len(counted["engine"]) == 3, counted  # the nodes hold both already
        said = [x for x in notes.lines if x.startswith("workdir: bundle")]
        assert said and "already in" in said[-1] and "0 node(s) fetched it, 3 had it" in said[-1], said
    finally:
        gtrain.down("wdpa", yes=True)


def test_without_a_store_node0_serves_and_a_blocked_node_is_pushed(ssh_hosts: Any, tmp_path: Path,
                                                                   gtrain_home: Path,
                                                                   counted: dict[str, list[Any]]) -> None:
    if ssh_hosts.mode != "netns":
        pytest.fail("needs the netns hosts (root, iproute2): a node's traffic to node 0 is blocked in its netns")
    hosts = [ssh_hosts[0], ssh_hosts[1], ssh_hosts[2]]
    spec, work = _spec(tmp_path, hosts, "wdpb")
    notes = Notes()
    assert gtrain.up(spec, report=notes).created
    try:
        seen = _run(spec, "wdpb", notes)
        _same_everywhere(seen, work, 3)
        b = wd.build_bundle(work, sorted(_local_shas(work)), tmp_path / "b")
        # one upload from here: the bundle, to node 0 only
        assert [(h, f) for h, f, _n in counted["put"]] == [(hosts[0].address, ["upload.tar"])], counted
        assert counted["put"][0][2] == b.size and counted["store"] == []
        said = [x for x in notes.lines if x.startswith("workdir: bundle")]
        assert said and "sent once to node 0; 2 node(s) fetched it" in said[-1], notes.lines

        # (c) node 2 cannot reach node 0: it is pushed the files from here, says so, and its job runs
        (work / "pkg" / "conf.txt").write_text("lr: 0.2\n")  # a new bundle
        counted["put"].clear()
        notes.lines.clear()
        rule = ["OUTPUT", "-d", hosts[0].address, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"]
        subprocess.run(hosts[2].in_host("iptables", "-A", *rule), check=True)
        try:
            seen = _run(spec, "wdpb", notes)
        finally:
            subprocess.run(hosts[2].in_host("iptables", "-D", *rule), check=True)
        _same_everywhere(seen, work, 3)
        warned = [x for x in notes.lines if "could not fetch the workdir bundle" in x]
        assert len(warned) == 1 and warned[0].startswith("node 2: ") and hosts[0].address in warned[0], notes.lines
        assert "pushing the workdir from this machine instead" in warned[0]
        hosts_put = [h for h, _f, _n in counted["put"]]
        assert hosts_put == [hosts[0].address, hosts[2].address], counted  # the bundle to node 0, files to node 2
        assert sorted(counted["put"][1][1]) == sorted(_local_shas(work))
    finally:
        gtrain.down("wdpb", yes=True)


def test_a_corrupt_bundle_in_the_store_is_refused_and_sent_again(ssh_hosts: Any, moto_bridge: str, tmp_path: Path,
                                                                 gtrain_home: Path,
                                                                 counted: dict[str, list[Any]]) -> None:
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="wdpull-d")
    hosts = [ssh_hosts[0], ssh_hosts[1], ssh_hosts[2]]
    spec, work = _spec(tmp_path, hosts, "wdpd", checkpoint_store="s3://wdpull-d/runs",
                       env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_bridge})
    b = wd.build_bundle(work, sorted(_local_shas(work)), tmp_path / "b")
    bad = bytearray(b.path.read_bytes())
    bad[len(bad) // 2] ^= 0xFF  # same size, one byte flipped: the laptop's HEAD takes it for the bundle
    key = f"runs/gtrain-workdir/{b.sha256}.tar"
    s3.put_object(Bucket="wdpull-d", Key=key, Body=bytes(bad))
    notes = Notes()
    assert gtrain.up(spec, report=notes).created
    try:
        _same_everywhere(_run(spec, "wdpd", notes), work, 3)
        warned = [x for x in notes.lines if "corrupt (sha256 mismatch)" in x]
        assert len(warned) == 1 and "sending it there again" in warned[0], notes.lines
        assert counted["store"] == [b.size] and counted["put"] == [], counted  # re-sent once, nobody pushed
        body = s3.get_object(Bucket="wdpull-d", Key=key)["Body"].read()
        assert hashlib.sha256(body).hexdigest() == b.sha256
    finally:
        gtrain.down("wdpd", yes=True)
