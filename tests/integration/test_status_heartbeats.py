"""Status from heartbeats on the local provider (issue 38, item 3; docs/scale.md, "Status from heartbeats"): a
4-node sleeping job; `status` reads node 0's aggregate once and shows every node running, with the same number
of node requests whatever N; node 1's heartbeat sender killed, after the stale timeout `status` shows node 1
`unreachable` (not running) while the job's state, asked of node 1 itself, stays running."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gtrain

N = 4
SLEEPER = "import time\ntime.sleep(120)\n"


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Every request to a node this process makes: a runner's commands (in-process calls included), node 0's
    aggregate read, a node's progress scan (the local runner does the last two in-process)."""
    from gtrain.remote import nodebeat
    from gtrain.remote.local import LocalRunner
    from gtrain.state import progress

    seen: Counter[str] = Counter()

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            seen[name] += 1
            return fn(*a, **kw)
        return wrapper

    for meth in ("run", "run_python", "call", "stream", "start_detached"):
        monkeypatch.setattr(LocalRunner, meth, counted(meth, getattr(LocalRunner, meth)))
    monkeypatch.setattr(nodebeat, "read", counted("nodes.json", nodebeat.read))
    monkeypatch.setattr(progress, "scan", counted("scan", progress.scan))
    yield seen


def _until(cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := cond():
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_status_reads_node_0s_heartbeats_once_and_calls_a_silent_node_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requests: Counter[str]) -> None:
    from gtrain.jobs import nodescript

    monkeypatch.setenv("GTRAIN_HEARTBEAT_S", "0.3")
    monkeypatch.setenv("GTRAIN_HEARTBEAT_STALE_S", "2")
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    spec = tmp_path / "hb.yaml"
    spec.write_text(json.dumps({"name": "hb", "provider": "local", "num_nodes": N, "job": {
        "workdir": str(tmp_path), "run": "sleeper.py", "launcher": "python", "nproc_per_node": 1}}))
    gtrain.up(spec)
    try:
        job = gtrain.launch(cluster="hb").job_id
        jdirs = [gtrain_home_node(i) / "jobs" / job for i in range(N)]

        def all_heard() -> bool:
            try:
                doc = json.loads((jdirs[0] / "nodes.json").read_text())
            except (OSError, ValueError):
                return False
            return sorted(doc["nodes"]) == [str(i) for i in range(N)] and all(
                n["agent"] == "alive" for n in doc["nodes"].values())

        _until(all_heard)
        requests.clear()
        nodescript._beat_reads.clear()  # what an earlier read in this process kept (a CLI starts without it)
        row = gtrain.status("hb")[0]
        assert [n["status"] for n in row["nodes"]] == ["running"] * N
        assert all(n["heartbeat"]["word"] == "running" for n in row["nodes"])
        assert row["jobs"][-1]["status"] == "running"
        # O(1) in N: node 0's aggregate (the job's state and the node rows) and node 0's progress, nothing else
        assert dict(requests) == {"nodes.json": 1, "scan": 1}, requests

        beat_pid = int((jdirs[1] / "beat.pid").read_text())
        os.kill(beat_pid, signal.SIGKILL)  # node 1 goes silent; its job goes on
        time.sleep(2.5)
        requests.clear()
        nodescript._beat_reads.clear()  # what an earlier read in this process kept (a CLI starts without it)
        row = gtrain.status("hb")[0]
        words = [n["status"] for n in row["nodes"]]
        assert words == ["running", "unreachable", "running", "running"], row["nodes"]
        assert "no heartbeat for" in row["nodes"][1]["detail"]
        # the job's state stands on node 1's own word, asked of it alone (it still runs)
        assert row["jobs"][-1]["status"] == "running"
        assert dict(requests) == {"nodes.json": 1, "call": 1, "scan": 1}, requests
    finally:
        gtrain.down("hb", yes=True)


def gtrain_home_node(i: int) -> Path:
    """Node ``i``'s root on the local provider (its runner's)."""
    from gtrain.context import Context

    ctx = Context()
    try:
        return Path(ctx.runners(ctx.cluster("hb"))[i].root)
    finally:
        ctx.store.close()


def test_over_ssh_status_is_two_requests_to_node_0_not_three_per_host(
        ssh_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ssh provider on real sshd hosts (tests/fixtures/sshd.py): with node 0's aggregate, one `status` runs
    two commands, both on node 0 (the aggregate, rank 0's progress); without it, three per host (reachable,
    the job's state, the progress)."""
    from gtrain.jobs import nodescript
    from gtrain.remote import ssh as sshmod
    from gtrain.remote.ssh.runner import SSHRunner

    sshmod.close_all()
    hosts = [ssh_hosts[0], ssh_hosts[1]]
    work = tmp_path / "work"
    work.mkdir()
    (work / "sleeper.py").write_text(SLEEPER)
    section = {"user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
               "hosts": [f"{h.address}:{h.port}" for h in hosts],
               "host_keys": {f"{hosts[0].address}:{hosts[0].port}": hosts[0].host_key_line}}
    spec = tmp_path / "hbs.yaml"
    spec.write_text(json.dumps({"name": "hbs", "provider": "ssh", "num_nodes": 2, "ssh": section, "job": {
        "workdir": str(work), "run": "sleeper.py", "launcher": "python", "nproc_per_node": 1}}))
    runs: list[str] = []
    real_run = SSHRunner.run

    def run(self: SSHRunner, cmd: str, **kw: Any) -> Any:
        runs.append(self.address)
        return real_run(self, cmd, **kw)

    gtrain.up(spec)
    try:
        job = gtrain.launch(cluster="hbs").job_id
        monkeypatch.setattr(SSHRunner, "run", run)

        def heard() -> bool:
            nodescript._beat_reads.clear()
            row = gtrain.status("hbs")[0]
            return all((n.get("heartbeat") or {}).get("word") == "running" for n in row["nodes"])

        _until(heard, timeout=15)
        runs.clear()
        nodescript._beat_reads.clear()
        row = gtrain.status("hbs")[0]
        assert [n["status"] for n in row["nodes"]] == ["running", "running"] and row["jobs"][-1]["id"] == job
        assert row["jobs"][-1]["status"] == "running"
        assert runs == [hosts[0].address] * 2, runs
        monkeypatch.setenv("GTRAIN_HEARTBEAT_STALE_S", "0")  # every node's beat too old: each host asked itself
        runs.clear()
        nodescript._beat_reads.clear()
        row = gtrain.status("hbs")[0]
        assert sorted(set(runs)) == sorted({h.address for h in hosts}) and len(runs) >= 2 * len(hosts), runs
    finally:
        monkeypatch.setattr(SSHRunner, "run", real_run)
        gtrain.down("hbs", yes=True)


def _pulses(key: str) -> dict[int, int]:
    """rank -> pid of every host's own beat of cluster ``key`` running on this machine (the netns hosts share its
    process table): ``python3 - pulse FOLDER KEY RANK ...``."""
    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pulse" in argv and key.encode() in argv:
            out[int(argv[argv.index(key.encode()) + 1])] = int(d.name)
    return out


def test_an_idle_cluster_s_status_asks_node_0_alone_and_down_ends_every_host_s_beat(
        ssh_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No job, so no job heartbeats: each host's own beat (gtrain.remote.nodebeat.pulse, started by `up`) tells
    node 0, and `status` is one command on node 0 whatever N. A host whose beat stopped is asked itself (and is
    reachable); `down` leaves no beat running on any host."""
    from gtrain.jobs import nodescript
    from gtrain.remote import ssh as sshmod
    from gtrain.remote.ssh.runner import SSHRunner

    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_HEARTBEAT_S", "0.5")
    hosts = [ssh_hosts[0], ssh_hosts[1], ssh_hosts[2]]
    section = {"user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
               "hosts": [f"{h.address}:{h.port}" for h in hosts],
               "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts}}
    spec = tmp_path / "idle.yaml"
    spec.write_text(json.dumps({"name": "idle", "provider": "ssh", "num_nodes": 3, "ssh": section}))
    runs: list[str] = []
    real_run = SSHRunner.run

    def run(self: SSHRunner, cmd: str, **kw: Any) -> Any:
        runs.append(self.address)
        return real_run(self, cmd, **kw)

    gtrain.up(spec)
    key = f"node:{gtrain.status('idle', refresh=False)[0]['id']}"
    try:
        assert sorted(_pulses(key)) == [0, 1, 2]
        monkeypatch.setattr(SSHRunner, "run", run)

        def once() -> list[str]:
            runs.clear()
            nodescript._beat_reads.clear()
            row = gtrain.status("idle")[0]
            assert [n["status"] for n in row["nodes"]] == ["running"] * 3
            return list(runs)

        _until(lambda: once() == [hosts[0].address], timeout=15)  # node 0's gathering read, nothing else
        os.kill(_pulses(key)[2], signal.SIGKILL)
        # two beats and a second later node 2 is late: asked itself (`true`), reachable, still "running"
        _until(lambda: hosts[2].address in once(), timeout=15)
        assert once().count(hosts[1].address) == 0  # node 1 still beats: not asked
    finally:
        monkeypatch.setattr(SSHRunner, "run", real_run)
        gtrain.down("idle", yes=True)
    _until(lambda: not _pulses(key), timeout=10)  # the folder went with the root: every beat ended by itself
