from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtrain.errors import SyncError
from gtrain.remote import nodeside
from gtrain.sync.pull import safe_rel


def test_tail_offset(tmp_path: Path) -> None:
    p = tmp_path / "f.log"
    p.write_text("".join(f"line{i}\n" for i in range(10)))
    off = nodeside._tail_offset(str(p), 3)
    assert p.read_bytes()[off:] == b"line7\nline8\nline9\n"
    assert nodeside._tail_offset(str(p), 100) == 0


def test_job_state_dead_launcher_is_failed(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "state.json").write_text(json.dumps({"state": "running", "pid": 999999999}))
    (tmp_path / "logs" / "rank-1.exit").write_text("3 10.5\n")
    (tmp_path / "logs" / "rank-0.exit").write_text("143 11.0\n")
    st = nodeside.job_state(str(tmp_path))
    assert st["state"] == "failed" and st["lost"] is True
    assert st["exit_code"] == 3  # the first rank to fail, by time


def test_job_state_missing_and_pending(tmp_path: Path) -> None:
    assert nodeside.job_state(str(tmp_path / "nope"))["state"] == "missing"
    assert nodeside.job_state(str(tmp_path))["state"] == "pending"


def test_follow_over_stdin_like_a_remote_node(tmp_path: Path) -> None:
    """The same file runs on a node as `python3 - follow ...` with its source on stdin."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "node.log").write_text("agent up\n")
    (tmp_path / "logs" / "rank-0.log").write_text("hello\npartial")
    (tmp_path / "logs" / "rank-1.log").write_text("world\n")
    (tmp_path / "state.json").write_text(json.dumps({"state": "succeeded", "agent_rc": 0}))
    src = Path(nodeside.__file__).read_bytes()
    p = subprocess.run([sys.executable, "-", "follow", str(tmp_path), "0", "-1"], input=src,
                       capture_output=True, timeout=30)
    lines = p.stdout.decode().splitlines()
    assert lines[:4] == ["-\tagent up", "0\thello", "0\tpartial", "1\tworld"]
    assert lines[-1].startswith("\x00END\t") and json.loads(lines[-1].split("\t", 1)[1])["state"] == "succeeded"


def test_cancel_kills_the_process_group(tmp_path: Path) -> None:
    p = subprocess.Popen(["setsid", "bash", "-c", "sleep 60 & sleep 60; wait"])
    for _ in range(50):
        try:
            if os.getpgid(p.pid) == p.pid:
                break
        except ProcessLookupError:
            pass
        time.sleep(0.02)
    (tmp_path / "pid").write_text(str(p.pid))
    (tmp_path / "state.json").write_text(json.dumps({"state": "running", "pid": p.pid}))
    t0 = time.monotonic()
    st = nodeside.cancel(str(tmp_path), "5")
    p.wait(5)
    assert st["state"] == "cancelled" and time.monotonic() - t0 < 5
    assert not nodeside._group_alive(p.pid)


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "/etc/passwd", ".."])
def test_pull_refuses_names_outside_destination(bad: str) -> None:
    with pytest.raises(SyncError, match="outside the destination"):
        safe_rel(bad)


def test_manifest(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.pt").write_bytes(b"abc")
    (tmp_path / ".y.gtrain-tmp").write_bytes(b"partial")
    m = nodeside.manifest(str(tmp_path))
    assert [e["path"] for e in m] == ["a/x.pt"]
    assert m[0]["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def _has_job_env(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"GTRAIN_JOB_ID=" in f.read()
    except OSError:
        return False


def test_idle_watch_waits_for_jobs_to_end_then_runs_its_command_once(tmp_path: Path) -> None:
    """``policies.idle_minutes`` on a node: the watcher runs its command only after ``idle_s`` with no process
    of a gtrain job; a second watcher on the same node exits at once."""
    from gtrain.remote import nodeside

    marker, pidfile = tmp_path / "powered-off", tmp_path / "watch.pid"
    release = tmp_path / "release"  # the job runs until the test lets it end: no race with a loaded machine
    cluster = f"idle-test-{os.getpid()}"
    job = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                            "while not os.path.exists(sys.argv[1]): time.sleep(0.05)", str(release)],
                           env={**os.environ, "GTRAIN_JOB_ID": "idle-test", "GTRAIN_CLUSTER": cluster})
    # the watcher counts its own cluster's jobs only (as `up` starts it), so a job another test left running on
    # this machine cannot hold it busy
    watch = subprocess.Popen([sys.executable, nodeside.__file__, "idle_watch", "2", "0.2", str(pidfile),
                              "touch", str(marker)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "GTRAIN_IDLE_CLUSTER": cluster})
    try:
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = subprocess.run([sys.executable, nodeside.__file__, "idle_watch", "2", "0.2", str(pidfile),
                                 "touch", str(tmp_path / "second")], timeout=10)
        assert second.returncode == 0 and not (tmp_path / "second").exists()  # one watcher per node
        time.sleep(3)
        assert job.poll() is None and not marker.exists()  # 3 s in: the job still runs, the node is busy
        release.touch()
        job.wait(timeout=10)
        try:
            assert watch.wait(timeout=30) == 0  # then 2 s idle: the command ran, the watcher is done
        except subprocess.TimeoutExpired:
            others = [d for d in os.listdir("/proc") if d.isdigit() and _has_job_env(d)]
            pytest.fail(f"the watcher did not fire; processes with a gtrain job's environment here: {others}")
        assert marker.exists()
        out = watch.stdout.read() if watch.stdout else ""
        assert "idle for" in out and "touch" in out
    finally:
        for p in (job, watch):
            if p.poll() is None:
                p.kill()
            p.wait()
        if watch.stdout:
            watch.stdout.close()


def test_root_problem_refuses_slash_home_and_foreign_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert nodeside.root_problem("/")
    assert nodeside.root_problem("~")
    assert nodeside.root_problem(str(tmp_path))  # holds the home
    theirs = home / "project"
    (theirs / "important").mkdir(parents=True)
    (theirs / "important" / "thesis.txt").write_text("years")
    assert "gtrain did not make" in str(nodeside.root_problem(str(theirs)))
    assert nodeside.root_problem(str(home / "gtrain" / "c1")) is None  # new
    (home / "empty").mkdir()
    assert nodeside.root_problem(str(home / "empty")) is None
    (theirs / nodeside.ROOT_MARKER).write_text("c1\n")
    assert nodeside.root_problem(str(theirs)) is None  # gtrain's own


def test_remove_tree_removes_only_what_gtrain_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "home" / "r"
    (root / "workdir" / "sub").mkdir(parents=True)
    (root / "jobs").mkdir()
    (root / "gtrain-ckpt.pyz").write_text("x")
    (root / "gtrain-record.json").write_text("{}")  # what `launch` leaves on node 0 for `gtrain attach`
    (root / nodeside.ROOT_MARKER).write_text("c\n")
    (root / "important").mkdir()
    (root / "important" / "thesis.txt").write_text("years")
    assert nodeside.remove_tree(str(root))
    assert sorted(os.listdir(root)) == ["important"]
    assert (root / "important" / "thesis.txt").read_text() == "years"
    (root / "important" / "thesis.txt").unlink()
    (root / "important").rmdir()
    (root / "jobs").mkdir()
    nodeside.remove_tree(str(root))
    assert not root.exists()  # left empty: gone
    assert not nodeside.remove_tree(str(tmp_path / "home"))  # a home is never touched
    assert (tmp_path / "home").is_dir()


def test_two_removals_of_one_root_at_once_both_succeed(tmp_path: Path) -> None:
    """`down` removes each recorded root in parallel; two records of one root raced (FileNotFoundError made the
    ssh contract test's down report the root 'unreachable')."""
    import threading

    for i in range(60):
        d = tmp_path / f"root-{i}"
        for n in ("workdir/a/b", "jobs/x"):
            (d / n).mkdir(parents=True)
        for f in ("gtrain-sync.pyz", nodeside.ROOT_MARKER):
            (d / f).write_text("")
        errs: list[BaseException] = []

        def go(d: Path = d, errs: list[BaseException] = errs) -> None:
            try:
                nodeside.remove_tree(str(d))
            except Exception as e:  # noqa: BLE001 - the test collects what a removal raised
                errs.append(e)

        threads = [threading.Thread(target=go) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errs and not d.exists(), errs
