"""Tree fan-out (gtrain/remote/tree.py + the node-side relay) on 6 real sshd hosts in network namespaces, the
threshold lowered to 2: 3 relays (nodes 0, 2, 4) each reaching one other node over the hosts' own network
with their own OpenSSH client and this process's forwarded agent."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtrain.remote import ssh as sshmod
from gtrain.remote import tree
from gtrain.remote.ssh import SSHRunner, pin_host_key
from tests.fixtures.sshd import SSHHosts

N = 6


@pytest.fixture(scope="module")
def hosts6() -> Iterator[SSHHosts]:
    hosts = SSHHosts(N)
    try:
        hosts.start()
        yield hosts
    finally:
        sshmod.close_all()
        hosts.close()


@pytest.fixture
def runners(hosts6: SSHHosts, gtrain_home: Path) -> list[SSHRunner]:
    sshmod.close_all()
    for h in hosts6:
        pin_host_key(h.address, h.port, h.host_key_line)
    return [SSHRunner(h.target(), root=str(h.home / "tree-test"), label=f"node {i}", connect_retry_s=1)
            for i, h in enumerate(hosts6)]


def _cmds(tag: str) -> list[str]:
    # each node: its hostname, what came on stdin, an exit code of its own, a line on stderr
    return [f"echo {tag} $(hostname) $(cat); echo err-{i} >&2; exit {i % 3}" for i in range(N)]


def test_tree_results_are_the_flat_ones_and_only_relays_are_connected(hosts6: SSHHosts,
                                                                      runners: list[SSHRunner]) -> None:
    stdin = [f"in{i}".encode() if i % 2 else None for i in range(N)]
    flat = tree.run_on_nodes(runners, _cmds("x"), stdin=stdin, timeout=60, threshold=100)
    assert [r.via for r in flat] == ["direct"] * N
    sshmod.close_all()
    before = sshmod.pool_stats()["connects"]
    deep = tree.run_on_nodes(runners, _cmds("x"), stdin=stdin, timeout=60, threshold=2)
    assert [(r.rc, r.stdout, r.stderr, r.error) for r in deep] == [(r.rc, r.stdout, r.stderr, r.error) for r in flat]
    assert [r.stdout.split()[1] for r in deep] == [h.name for h in hosts6]  # each node's own hostname
    assert [r.rc for r in deep] == [0, 1, 2, 0, 1, 2]
    assert [r.via for r in deep] == ["direct", "relay node 0", "direct", "relay node 2", "direct", "relay node 4"]
    assert sshmod.pool_stats()["connects"] - before == 3  # this process reached the 3 relays only


def test_a_relay_killed_mid_command_its_nodes_run_once_directly(hosts6: SSHHosts, runners: list[SSHRunner]) -> None:
    count = [f"{h.home}/tree-test/ran" for h in hosts6]
    for p in count:
        Path(p).unlink(missing_ok=True)
    cmds = ["sleep 1.5; echo ran >> ran; echo ok" for _ in range(N)]
    marker = [f"{h.home}/tree-test/once-{time.time_ns()}" for h in hosts6]
    relay_host = hosts6[2]  # relays block [2, 3]
    killed: list[int] = []

    def kill_relay() -> None:
        end = time.monotonic() + 20
        while time.monotonic() < end and not killed:
            for pid in relay_host.processes():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"gtrain-relay" in cmdline and b"python" in cmdline.split(b"\0")[0]:
                    time.sleep(0.3)  # its ssh to node 3 is under way
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.02)

    t = threading.Thread(target=kill_relay)
    t.start()
    res = tree.run_on_nodes(runners, cmds, timeout=60, once=marker, threshold=2)
    t.join()
    assert killed, "the relay process was never seen"
    assert [r.error for r in res] == [None] * N and [r.rc for r in res] == [0] * N
    assert res[3].via.startswith("direct (relay node 2 ended")  # reached from here, not skipped
    assert res[1].via == "relay node 0" and res[5].via == "relay node 4"
    time.sleep(1.6)  # the dead relay's orphaned ssh to node 3 finishes its run
    assert [Path(p).read_text() for p in count] == ["ran\n"] * N  # every node ran it exactly once


def test_a_node_nobody_reaches_is_reported_not_skipped(hosts6: SSHHosts, runners: list[SSHRunner]) -> None:
    hosts6[5].kill_sshd()
    try:
        res = tree.run_on_nodes(runners, ["echo up" for _ in range(N)], timeout=30, threshold=2)
    finally:
        hosts6[5].start_sshd()
    assert [r.stdout for r in res[:5]] == ["up\n"] * 5
    bad = res[5]
    assert bad.rc is None and bad.error is not None
    assert "relay node 4 could not reach it" in bad.error and "connection refused" in bad.error.lower()


def test_status_probe_through_relays_is_the_direct_call(runners: list[SSHRunner]) -> None:
    # what `status` asks of every node (nodeside.job_state), through relays and directly: the same documents
    jdirs = [[f"{r.root}/jobs/none-{i}"] for i, r in enumerate(runners)]
    direct = [r.call("job_state", *a, timeout=60) for r, a in zip(runners, jdirs, strict=True)]
    relayed = tree.call_all(runners, "job_state", jdirs, timeout=60, threshold=2)
    assert relayed == direct and all(isinstance(d, dict) and "state" in d for d in relayed)


def test_a_job_launched_and_exec_through_relays_as_through_the_flat_fan_out(
        hosts6: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import sys

    import gtrain

    sshmod.close_all()
    work = tmp_path / "work"
    work.mkdir()
    (work / "hi.py").write_text("import os\nprint('rank', os.environ['GTRAIN_NODE_RANK'])\n")
    spec = tmp_path / "tree.yaml"
    spec.write_text(json.dumps({
        "name": "tree", "provider": "ssh", "num_nodes": N,
        "ssh": {"user": hosts6[0].user, "identity_file": hosts6[0].identity_file, "python": sys.executable,
                "check_torch": False, "hosts": [f"{h.address}:{h.port}" for h in hosts6],
                "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts6}},
        "job": {"workdir": str(work), "run": "hi.py", "launcher": "python", "nproc_per_node": 1}}))
    gtrain.up(spec)
    try:
        monkeypatch.setenv(tree.ENV_THRESHOLD, "2")  # start, status probe and exec go through 3 relays
        relayed = sshmod.pool_stats()["relayed"]
        job = gtrain.launch(spec)
        lines = []
        final = gtrain.wait("tree", job_id=job.job_id, on_line=lines.append)
        assert (final.status, final.exit_code) == ("succeeded", 0)
        assert sorted(ln.text for ln in lines if ln.text.startswith("rank")) == [f"rank {i}" for i in range(N)]
        assert sshmod.pool_stats()["relayed"] - relayed >= 3  # the 3 non-relay nodes' starts came back via relays
        deep: list[tuple[int, str]] = []
        codes = gtrain.exec_command("tree", "hostname; echo $GTRAIN_NODE_RANK; exit $((GTRAIN_NODE_RANK % 2))",
                                    on_line=lambda ln: deep.append((ln.node, ln.text)))
        monkeypatch.setenv(tree.ENV_THRESHOLD, "100")
        flat: list[tuple[int, str]] = []
        assert gtrain.exec_command("tree", "hostname; echo $GTRAIN_NODE_RANK; exit $((GTRAIN_NODE_RANK % 2))",
                                   on_line=lambda ln: flat.append((ln.node, ln.text))) == codes
        assert codes == {i: i % 2 for i in range(N)}
        assert sorted(deep) == sorted(flat) == sorted([(i, h.name) for i, h in enumerate(hosts6)]
                                                      + [(i, str(i)) for i in range(N)])
    finally:
        gtrain.down("tree")
