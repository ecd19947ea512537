"""The ssh provider on real sshd hosts (tests/fixtures/sshd.py): network namespaces with their own
addresses, hostnames and homes. Real paramiko, real rsync, real torchrun DDP across two hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.events import Reporter
from gtrain.remote import ssh as sshmod

JOBS = Path(__file__).parent / "jobs"
INJECT = '"; rm -rf ~ #'


@pytest.fixture(autouse=True)
def fresh_pool() -> None:
    # each test has its own GTRAIN_HOME (its own known_hosts): don't reuse connections across them
    sshmod.close_all()


def spec_for(tmp_path: Path, hosts: list, name: str, run: str = "probe.py", *, pin: bool = True,  # type: ignore[type-arg]
             num_nodes: int | None = None) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "probe.py").write_text((JOBS / "probe.py").read_text())
    (work / ".gtrainignore").write_text("*.big\n")
    (work / "ignored.big").write_text("x")
    section = {
        "user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
        "hosts": [f"{h.address}:{h.port}" for h in hosts],
        "host_keys": {f"{hosts[0].address}:{hosts[0].port}": hosts[0].host_key_line} if pin else {},
    }
    job = {"workdir": str(work), "run": run, "nproc_per_node": 2, "checkpoint_dir": "ckpt",
           "env": {"INJECT": INJECT, "OMP_NUM_THREADS": "1"}}
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps({"name": name, "provider": "ssh", "num_nodes": num_nodes or len(hosts),
                             "ssh": section, "job": job}))
    return p


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_two_hosts_train_pull_exec_and_down(ssh_hosts, tmp_path: Path, gtrain_home: Path) -> None:  # type: ignore[no-untyped-def]
    hosts = [ssh_hosts[0], ssh_hosts[1]]
    spec = spec_for(tmp_path, hosts, "lab")
    res = gtrain.up(spec)
    assert res.created and res.cluster is not None
    # host keys: node 0 pinned from the spec, node 1 trusted on first use and recorded
    kh = (gtrain_home / "ssh" / "known_hosts").read_text()
    assert hosts[1].host_key_line.split()[1] in kh
    assert oct((gtrain_home / "ssh" / "known_hosts").stat().st_mode & 0o777) == "0o600"
    cfg = (gtrain_home / "ssh" / "config").read_text()
    assert "Host lab-0" in cfg and "Host lab-1" in cfg and "StrictHostKeyChecking yes" in cfg

    job = gtrain.launch(spec)
    lines = []
    final = gtrain.wait("lab", job_id=job.job_id, on_line=lines.append)
    assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-30:]
    hello = {(ln.node, ln.rank) for ln in lines if ln.text.startswith("hello from rank")}
    assert sorted(r for _n, r in hello) == [0, 1, 2, 3] and sorted(n for n, _r in hello) == [0, 0, 1, 1]
    # each node trained in its own home; the .gtrainignore'd file never left
    for h in hosts:
        wd = h.home / "gtrain" / "lab" / "workdir"
        assert (wd / "probe.py").is_file() and not (wd / "ignored.big").exists()

    pulled = gtrain.pull("lab", to=tmp_path / "ck")
    env = json.loads((tmp_path / "ck" / "env.json").read_text())
    assert env["INJECT"] == INJECT
    assert env["GTRAIN_NODE_IPS"] == f"{hosts[0].address},{hosts[1].address}"
    assert env["GTRAIN_MASTER_ADDR"] == hosts[0].address
    assert sorted(pulled.transferred) == ["env.json", "sub/model.bin"]
    assert gtrain.pull("lab", to=tmp_path / "ck").transferred == []

    r = cli("exec", "lab", "--", "hostname; exit 4")
    assert r.returncode == 4
    assert {ln.split("] ", 1)[1] for ln in r.stdout.splitlines()} == {h.name for h in hosts}
    out = cli("logs", "lab", "--tail", "2").stdout
    assert "[node 0" in out and "[node 1" in out

    d = gtrain.down("lab")
    assert not d.already_down
    for h in hosts:
        left = sorted(str(p.relative_to(h.home)) for p in (h.home / "gtrain" / "lab").rglob("*"))
        assert not (h.home / "gtrain" / "lab").exists(), left  # gtrain's files gone; the machine stays
    assert "Host lab-0" not in (gtrain_home / "ssh" / "config").read_text()


def test_host_down_at_up_names_it_and_creates_nothing(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good, bad = ssh_hosts[0], ssh_hosts[2]
    bad.kill_sshd()
    try:
        spec = spec_for(tmp_path, [good, bad], "down-at-up")
        r = cli("up", str(spec))
        assert r.returncode == 1
        assert f"node 1 ({bad.user}@{bad.address}:{bad.port})" in r.stderr and "nothing was created" in r.stderr
        assert "Traceback" not in r.stderr
        assert json.loads(cli("status", "--json").stdout) == {"clusters": []}
        assert not (good.home / "gtrain" / "down-at-up").exists()
    finally:
        bad.start_sshd()


def test_changed_host_key_is_refused(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    h = ssh_hosts[3]
    spec = spec_for(tmp_path, [h], "rekeyed", pin=False)
    gtrain.up(spec)
    h.restart_sshd(new_host_key=True)
    sshmod.close_all()
    r = cli("exec", "rekeyed", "--", "true")
    assert r.returncode != 0
    assert "changed" in (r.stderr + r.stdout).lower()
    warnings: list[str] = []

    class Rep(Reporter):
        def warn(self, msg: str) -> None:
            warnings.append(msg)

    assert gtrain.exec_command("rekeyed", "true", report=Rep()) == {0: 255}
    assert any("changed" in w.lower() and f"{h.address}:{h.port}" in w for w in warnings), warnings
    node = gtrain.status("rekeyed")[0]["nodes"][0]
    assert node["status"] == "unreachable" and "changed" in node["detail"].lower()
    sshmod.forget_host(h.address, h.port)
    gtrain.down("rekeyed")  # down still works (its file removal may warn, but resources are accounted)


def test_host_killed_mid_job_is_failed_and_down_still_works(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = ssh_hosts[0], ssh_hosts[1]
    spec = spec_for(tmp_path, [a, b], "killed", run="probe.py --sleep 120")
    gtrain.up(spec)
    job = gtrain.launch(spec)
    logs = b.home / "gtrain" / "killed" / "jobs" / job.job_id / "logs"
    deadline = time.monotonic() + 90
    while len(list(logs.glob("rank-*.log"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    # the host dies: sshd and everything gtrain started there
    b.kill_sshd()
    anchor = b.anchor.pid if b.anchor is not None else -1
    for pid in b.processes():
        if pid != anchor:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    sshmod.close_all()
    try:
        t0 = time.monotonic()
        final = gtrain.wait("killed", job_id=job.job_id)
        assert final.status == "failed" and final.exit_code != 0
        assert time.monotonic() - t0 < 120
        r = cli("down", "killed")
        assert r.returncode == 0, r.stderr
    finally:
        b.start_sshd()


def test_a_root_gtrain_did_not_make_is_refused_and_down_keeps_what_is_not_its_own(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    h = ssh_hosts[0]
    theirs = h.home / "thesis-work"
    (theirs / "important").mkdir(parents=True, exist_ok=True)
    (theirs / "important" / "thesis.txt").write_text("years")
    spec = spec_for(tmp_path, [h], "foreign-root")
    doc = json.loads(spec.read_text())
    doc["ssh"]["root"] = "~/thesis-work"
    spec.write_text(json.dumps(doc))
    r = cli("up", str(spec))
    assert r.returncode == 1 and "ssh.root" in r.stderr and "gtrain did not make" in r.stderr, r.stderr
    assert json.loads(cli("status", "--json").stdout) == {"clusters": []}
    doc["ssh"]["root"] = "~/gtrain-own"
    spec.write_text(json.dumps(doc))
    assert cli("up", str(spec)).returncode == 0
    own = h.home / "gtrain-own"
    assert (own / ".gtrain-root").read_text() == "foreign-root\n" and (own / "workdir").is_dir()
    (own / "notes.txt").write_text("mine")  # the user's, put there later
    assert cli("down", "foreign-root").returncode == 0
    assert sorted(p.name for p in own.iterdir()) == ["notes.txt"]
    assert (theirs / "important" / "thesis.txt").read_text() == "years"
