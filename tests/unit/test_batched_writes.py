"""One command per node where there were several (docs/scale.md, "Fan-out that scales"): a node's folders and
scripts written in one ``sh -s`` session (Runner.write_files), and a followed job's end taken from what every
node's own stream said at its end (gtrain.runs.follow._from_ends) instead of asking every node again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gtrain.jobs.backend import JobState, NodeEnded
from gtrain.jobs.nodescript import node_status
from gtrain.remote.base import Runner
from gtrain.remote.local import LocalRunner
from gtrain.runs.follow import _from_ends
from gtrain.state import Job as JobRecord


class Counting(LocalRunner):
    """A local runner that counts its commands and takes the base class's one-command write_files."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.commands: list[str] = []

    def run(self, cmd, **kw):  # type: ignore[no-untyped-def]
        self.commands.append(cmd)
        return super().run(cmd, **kw)

    write_files = Runner.write_files


def test_write_files_is_one_command_and_writes_exactly(tmp_path):
    r = Counting(str(tmp_path))
    job = tmp_path / "jobs" / "j1"
    tricky = "#!/bin/bash\necho \"$HOME\" '$x' `date` \\\\n\nEOF\n__GTRAIN_BEAT__\n"
    files = {f"{job}/launch.sh": tricky.encode(), f"{job}/setup.sh": b"true\n",
             f"{job}/sub/env.json": b'{"a": 1}\n'}
    r.write_files(files, 0o700, folders=[str(tmp_path / "workdir"), f"{job}/logs"])
    assert r.commands == ["exec sh -s"]  # one round trip for every folder and file
    assert (job / "logs").is_dir() and (tmp_path / "workdir").is_dir()
    for path, data in files.items():
        assert Path(path).read_bytes() == data  # byte for byte: nothing expanded, no newline added
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert not [p for p in job.rglob("*gtrain-tmp*")]


def test_write_files_falls_back_for_what_a_here_document_cannot_carry(tmp_path):
    r = Counting(str(tmp_path))
    files = {f"{tmp_path}/no-newline": b"last line without one", f"{tmp_path}/binary": bytes(range(256)),
             f"{tmp_path}/text": b"ok\n"}
    r.write_files(files, 0o600)
    for path, data in files.items():
        assert Path(path).read_bytes() == data
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert r.commands == ["exec sh -s"]  # the two others went through write_file (in-process here)


def _job() -> JobRecord:
    return JobRecord(id="j1", cluster_id="c1", status="running", exit_code=None, created_at=0.0, ended_at=None, info={})


def _end(i: int, doc: dict | None) -> NodeEnded:
    word = (doc or {}).get("state", "unknown")
    return NodeEnded(i, JobState.parse(word), str(word), status=node_status(i, doc) if doc is not None else None)


def test_the_end_is_every_nodes_own_last_word():
    ok = {"state": "succeeded", "exit_code": 0, "ranks": {"0": [0, 1.0]}}
    bad = {"state": "failed", "exit_code": 3, "ranks": {"1": [3, 2.0]}}
    desc = _from_ends(_job(), {0: _end(0, ok), 1: _end(1, bad)}, 2, None)
    assert desc is not None and desc.state is JobState.FAILED and desc.exit_code == 3
    assert [n.detail for n in desc.nodes] == ["succeeded", "failed"]
    both = _from_ends(_job(), {0: _end(0, ok), 1: _end(1, ok)}, 2, None)
    assert both is not None and both.state is JobState.SUCCEEDED and both.exit_code == 0


def test_the_nodes_are_asked_when_any_did_not_say_its_end():
    ok = {"state": "succeeded", "exit_code": 0}
    assert _from_ends(_job(), {0: _end(0, ok)}, 2, None) is None  # node 1's stream never ended
    broken = NodeEnded(1, JobState.UNKNOWN, "unreachable", "connection lost")  # no document
    assert _from_ends(_job(), {0: _end(0, ok), 1: broken}, 2, None) is None
    running = _end(1, {"state": "running"})  # a stream cut before the end (not terminal)
    assert _from_ends(_job(), {0: _end(0, ok), 1: running}, 2, None) is None
    assert _from_ends(_job(), {0: _end(0, ok), 1: _end(1, ok)}, 2, [0, 1]) is None  # --node: a part followed


def test_the_nodes_runners_are_made_once_however_many_followers_ask_at_once():
    """`logs` of 1,000 nodes starts a follower thread per node, each asking the backend for its runner at once:
    each made all N runners from the state until the property took a lock (O(N^2): 35% of that command's CPU)."""
    import threading
    import time as _time

    from gtrain.jobs.nodescript import NodeScriptBackend

    made: list[int] = []

    class Provider:
        def runners(self, cluster):  # type: ignore[no-untyped-def]
            made.append(1)
            _time.sleep(0.05)  # reading the state: long enough for every thread to arrive meanwhile
            return [f"runner {i}" for i in range(64)]

    backend = NodeScriptBackend(Provider(), object())  # type: ignore[arg-type]
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(backend.runners[0])) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [1] and got == ["runner 0"] * 64


def test_a_followers_streams_connect_within_the_fan_out_window(monkeypatch):
    """`logs` of N nodes starts a stream thread per node at once; each opens its node's connection within the
    fan-out's window (at most GTRAIN_FANOUT_WINDOW at once), and a node that cannot be reached ends its own
    stream as unreachable without holding the others back."""
    import threading
    import time as _time

    from gtrain.errors import RemoteError
    from gtrain.jobs.nodescript import NodeScriptBackend

    live, most = [0], [0]
    lock = threading.Lock()

    class Runner:
        root = "/r"

        def __init__(self, i: int) -> None:
            self.i = i

        def connect(self) -> None:
            with lock:
                live[0] += 1
                most[0] = max(most[0], live[0])
            _time.sleep(0.01)
            with lock:
                live[0] -= 1
            if self.i == 3:
                raise RemoteError("node 3: connection refused")

        def follow_command(self, job_dir, *, follow, tail):  # type: ignore[no-untyped-def]
            return "follow", b""

        def stream(self, cmd, on_line, *, stdin=None):  # type: ignore[no-untyped-def]
            on_line('\x00END\t{"state": "succeeded", "exit_code": 0}')
            return 0

    class Provider:
        def runners(self, cluster):  # type: ignore[no-untyped-def]
            return [Runner(i) for i in range(40)]

    monkeypatch.setenv("GTRAIN_FANOUT_WINDOW", "8")
    backend = NodeScriptBackend(Provider(), object())  # type: ignore[arg-type]
    job = _job()
    ends: dict[int, str] = {}

    def one(i: int) -> None:
        for item in backend.log_iter(job, i, follow=True):
            ends[i] = item.detail  # type: ignore[union-attr]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 < most[0] <= 8
    assert ends[3] == "unreachable" and all(ends[i] == "succeeded" for i in range(40) if i != 3)
