"""SSHRunner against real OpenSSH servers (tests/fixtures/sshd.py): real sshd, paramiko, rsync."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gtrain.errors import RemoteCommandError, RemoteError, SyncError
from gtrain.remote import ssh
from gtrain.remote.fanout import parallel
from gtrain.remote.ssh import SSHRunner
from tests.fixtures.sshd import SSHHost, SSHHosts

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_pool() -> Iterator[None]:
    ssh.close_all()
    yield
    ssh.close_all()


@pytest.fixture
def pinned(ssh_hosts: SSHHosts, gtrain_home: Path) -> SSHHosts:
    for h in ssh_hosts:
        ssh.pin_host_key(h.address, h.port, h.host_key_line)
    return ssh_hosts


@pytest.fixture
def make_runner() -> Callable[..., SSHRunner]:
    def make(h: SSHHost, **kw: object) -> SSHRunner:
        args: dict[str, object] = {"cluster": f"t-{h.name}-{uuid.uuid4().hex[:6]}", "label": h.name,
                                   "connect_retry_s": 2.0, "python": sys.executable}
        args.update(kw)
        return SSHRunner(h.target(), **args)  # type: ignore[arg-type]

    return make


def _local(h: SSHHost, remote_path: str) -> Path:
    """Where a path under the host's home is seen from the test process."""
    home = "/root" if h.user == "root" else os.path.expanduser(f"~{h.user}")
    assert remote_path.startswith(home + "/")
    return h.home / remote_path[len(home) + 1:]


def _wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


def test_import_does_not_load_paramiko() -> None:
    code = "import sys, gtrain.remote.ssh; assert 'paramiko' not in sys.modules, 'paramiko imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_run_rc_stdout_stderr_cwd(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    h = pinned[0]
    r = make_runner(h)
    assert r.root.endswith(f"/gtrain/{r.root.rsplit('/', 1)[1]}") and r.root.startswith("/")
    res = r.run("echo out; echo err >&2; pwd; exit 3", check=False)
    assert (res.rc, res.stdout, res.stderr) == (3, f"out\n{r.root}\n", "err\n")
    with pytest.raises(RemoteCommandError) as ei:
        r.run("echo boom >&2; exit 7")
    assert ei.value.rc == 7 and "boom" in str(ei.value) and ei.value.host == h.name
    assert r.run("cat; printf '%s|' \"a b\" 'c$d' \"$((1+2))\"", stdin=b"in\n").stdout == "in\na b|c$d|3|"
    assert r.run_python("import sys; print(sys.argv[1:])", ["x y"]).stdout == "['x y']\n"
    if pinned.mode == "netns":  # own hostname and home per host
        assert r.run("hostname").stdout.strip() == h.name
        assert _local(h, r.root).is_dir()
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="timed out"):
        r.run("sleep 5", timeout=0.5)
    assert time.monotonic() - t0 < 3


def test_stream_order_and_latency(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    r = make_runner(pinned[0])
    r.run("true")  # connect first: measure streaming, not the handshake
    got: list[tuple[float, str]] = []
    t0 = time.monotonic()
    rc = r.stream("for i in 1 2 3 4; do echo out$i; echo err$i >&2; sleep 0.3; done; printf tail; exit 5",
                  lambda line: got.append((time.monotonic() - t0, line)))
    assert rc == 5
    assert [line for _, line in got] == ["out1", "err1", "out2", "err2", "out3", "err3", "out4", "err4", "tail"]
    # lines arrive as they are printed, not all at once when the command ends (~1.2 s): the first well
    # before the end, and the stdout lines spread over the run (loose bounds: a loaded CI machine)
    assert got[0][0] < got[-1][0] - 0.5, got
    assert got[6][0] - got[0][0] > 0.5, got


def test_start_detached_returns_fast_and_survives(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    h = pinned[1]
    r = make_runner(h)
    r.run("true")
    t0 = time.monotonic()
    # no redirection of its own and a `&&` chain: must still not hold the channel open
    r.start_detached("echo started && echo $$ > job.pid && sleep 60; echo never")
    assert time.monotonic() - t0 < 2
    pidfile = f"{r.root}/job.pid"
    _wait_for(lambda: r.run(f"test -s {pidfile}", check=False).rc == 0)
    pid = r.run(f"cat {pidfile}").stdout.strip()
    ssh.close_all()  # the connection that started it is gone
    r2 = make_runner(h)
    res = r2.run(f"kill -0 {pid} && ps -o sid= -p {pid} && ps -o stat= -p {pid}", check=False)
    assert res.rc == 0, res
    sid, st = res.stdout.split()
    assert sid == pid and not st.startswith("Z")  # own session, alive
    r2.run(f"kill {pid}")


def test_detached_stdin_secret_never_on_disk(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    h = pinned[1]
    r = make_runner(h)
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    big = os.urandom(300_000)  # larger than a pipe buffer
    r.start_detached("read -r tok; printf %s \"$tok\" | sha256sum > tok.sum; sleep 0.2; mv tok.sum tok.done",
                     stdin=(secret + "\n").encode())
    r.start_detached("sha256sum > big.sum.tmp && mv big.sum.tmp big.sum", stdin=big)
    _wait_for(lambda: r.run("test -f tok.done && test -f big.sum", check=False).rc == 0)
    assert r.run("cat tok.done").stdout.split()[0] == hashlib.sha256(secret.encode()).hexdigest()
    assert r.run("cat big.sum").stdout.split()[0] == hashlib.sha256(big).hexdigest()
    assert r.run(f"grep -rl {secret} {r.root} 2>/dev/null", check=False).stdout == ""


def _tree(root: Path) -> list[str]:
    files = ["a.txt", "sub/b.bin", "sub/deep/c.py", "with space/d e.txt"]
    for i, rel in enumerate(files):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(1000 * (i + 1)) if rel.endswith(".bin") else f"file {rel}\n".encode())
        os.utime(p, (1_600_000_000 + i, 1_600_000_000 + i))
    os.chmod(root / "sub/deep/c.py", 0o755)
    return files


@pytest.mark.parametrize("use_rsync", [True, False], ids=["rsync", "sftp"])
def test_put_files(pinned: SSHHosts, make_runner: Callable[..., SSHRunner], tmp_path: Path,
                   use_rsync: bool) -> None:
    r = make_runner(pinned[2], use_rsync=use_rsync)
    src = tmp_path / "src"
    files = _tree(src)
    assert r.put_files(src, files, "work dir") == len(files)
    dest = f"{r.root}/work dir"
    listing = r.run(f"cd '{dest}' && find . -type f -printf '%P %s %T@ %m\\n' | sort").stdout.splitlines()
    want = sorted(f"{rel} {(src / rel).stat().st_size} {int((src / rel).stat().st_mtime)} "
                  f"{oct((src / rel).stat().st_mode & 0o777)[2:]}" for rel in files)
    assert [" ".join(ln.rsplit(" ", 3)[:1] + [ln.rsplit(" ", 3)[1], ln.rsplit(" ", 3)[2].split(".")[0],
                                               ln.rsplit(" ", 3)[3]]) for ln in listing] == want
    assert r.put_files(src, files, dest) == 0  # size + mtime match: nothing moves
    (src / "a.txt").write_text("changed, longer\n")
    assert r.put_files(src, files, dest) == 1
    assert r.run(f"cat '{dest}/a.txt'").stdout == "changed, longer\n"
    assert r.run(f"find '{dest}' -name '*.gtrain-tmp' | wc -l").stdout.strip() == "0"


def test_write_file_mode_and_atomic(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    r = make_runner(pinned[2])
    r.write_file("jobs/j1/secret.env", b"TOKEN=x\n", mode=0o600)
    p = f"{r.root}/jobs/j1/secret.env"
    assert r.run(f"stat -c '%a %s' {p}").stdout.split() == ["600", "8"]
    r.write_file(p, b"TOKEN=y\n" * 10, mode=0o640)
    assert r.run(f"stat -c %a {p}; cat {p} | wc -l; ls -A {r.root}/jobs/j1").stdout.split() == \
        ["640", "10", "secret.env"]


def test_fetch_from_offset_and_across_rekeys(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    r = make_runner(pinned[3])
    data = os.urandom(3 << 20)
    r.write_file("log.bin", data)
    buf = io.BytesIO()
    seen: list[int] = []
    assert r.fetch("log.bin", buf, offset=1000, on_bytes=seen.append) == len(data) - 1000
    assert buf.getvalue() == data[1000:] and sum(seen) == len(data) - 1000
    buf2 = io.BytesIO()
    assert r.fetch(f"{r.root}/log.bin", buf2, offset=len(data)) == 0
    with pytest.raises(SyncError, match="missing.bin"):
        r.fetch("missing.bin", io.BytesIO())
    # 40 MiB through a server that rekeys every 16 MiB
    r.run("head -c 41943040 /dev/urandom > big.bin")
    want = r.run("sha256sum big.bin").stdout.split()[0]
    h = hashlib.sha256()

    class Sink(io.RawIOBase):
        def write(self, b: bytes) -> int:  # type: ignore[override]
            h.update(b)
            return len(b)

    assert r.fetch("big.bin", Sink()) == 40 << 20  # type: ignore[arg-type]
    assert h.hexdigest() == want


def test_changed_host_key_is_refused(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    h = pinned[3]
    make_runner(h).run("true")
    ssh.close_all()
    h.restart_sshd(new_host_key=True)
    with pytest.raises(RemoteError) as ei:
        make_runner(h).run("true")
    msg = str(ei.value)
    assert "CHANGED" in msg and f"{h.user}@{h.address}:{h.port}" in msg
    assert "gtrain ssh-forget" in (ei.value.hint or "")
    # forgetting + pinning the new key (what `gtrain ssh-forget` + spec host_keys do) lets it in again
    ssh.forget_host(h.address, h.port)
    ssh.pin_host_key(h.address, h.port, h.host_key_line)
    assert make_runner(h).run("echo ok").stdout == "ok\n"


def test_unknown_host_refused_without_tofu(ssh_hosts: SSHHosts, make_runner: Callable[..., SSHRunner],
                                           gtrain_home: Path) -> None:
    h = ssh_hosts[0]
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="not known") as ei:
        make_runner(h, connect_retry_s=10).run("true")
    assert time.monotonic() - t0 < 3  # no retrying a refusal
    assert f"{h.user}@{h.address}:{h.port}" in str(ei.value)
    assert ssh.pinned_keys(h.address, h.port) == []


def test_tofu_records_key_and_reports(ssh_hosts: SSHHosts, make_runner: Callable[..., SSHRunner],
                                      gtrain_home: Path) -> None:
    h = ssh_hosts[1]
    seen: list[tuple[str, int, str, str]] = []
    r = make_runner(h, tofu=True, on_new_host_key=lambda *a: seen.append(a))
    assert r.run("echo hi").stdout == "hi\n"
    kt, b64 = h.host_key_line.split()
    assert seen == [(h.address, h.port, kt, ssh.fingerprint_sha256(b64))]
    assert ssh.pinned_keys(h.address, h.port) == [(kt, b64)]
    ssh.close_all()
    assert make_runner(h).run("echo again").stdout == "again\n"  # pinned now, no tofu needed
    assert seen == [(h.address, h.port, kt, ssh.fingerprint_sha256(b64))]


def test_host_down_is_a_clear_error(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    h = pinned[3]
    h.kill_sshd()
    try:
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as ei:
            make_runner(h, connect_retry_s=1.5).run("true")
        assert time.monotonic() - t0 < 6
        msg = str(ei.value)
        assert f"{h.user}@{h.address}:{h.port}" in msg and "refused" in msg and "attempts" in msg
        if h.veth:  # unreachable (packets dropped): a timeout, still bounded
            h.link_down()
            try:
                t0 = time.monotonic()
                with pytest.raises(RemoteError, match="timed out") as ei:
                    make_runner(h, connect_retry_s=1.0, connect_timeout_s=0.5).run("true")
                assert time.monotonic() - t0 < 5
                assert h.address in str(ei.value)
            finally:
                h.link_up()
    finally:
        h.start_sshd()
    # comes back once sshd is up (retry with backoff inside the bound)
    assert make_runner(h).run("echo back").stdout == "back\n"


def test_pool_reuses_one_transport_per_host(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    h0, h1 = pinned[0], pinned[1]
    before = ssh.pool_stats()["connects"]
    a, b, c = make_runner(h0), make_runner(h0), make_runner(h1)
    parallel(lambda r: r.run("true"), [a, b, c, a, b, c, a, b])
    for _ in range(5):
        a.run("true")
        b.write_file("x", b"1")
    assert ssh.pool_stats()["connects"] - before == 2
    transports = ssh._POOL.transports()
    assert len(transports) == 2 and all(t.is_active() for t in transports.values())


def test_parallel_fanout_takes_about_one_host(pinned: SSHHosts, make_runner: Callable[..., SSHRunner]) -> None:
    runners = [make_runner(h) for h in pinned]
    parallel(lambda r: r.run("true"), runners)  # connect
    t0 = time.monotonic()
    runners[0].run("sleep 0.5")
    one = time.monotonic() - t0
    t0 = time.monotonic()
    out = parallel(lambda r: r.run("sleep 0.5; hostname").stdout, runners)
    many = time.monotonic() - t0
    assert len(out) == len(pinned)
    assert many < 3 * one, (one, many)


def test_proxy_jump_and_proxy_command(pinned: SSHHosts, make_runner: Callable[..., SSHRunner],
                                      tmp_path: Path) -> None:
    bastion, node = pinned[0], pinned[1]
    jump = f"{bastion.user}@{bastion.address}:{bastion.port}"
    r = make_runner(node, address=node.address)
    r.target = node.target(proxy_jump=jump)
    res = r.run("echo $SSH_CONNECTION").stdout.split()
    assert res[2] == node.address  # we arrived at the node ...
    if pinned.mode == "netns":
        assert res[0] == bastion.address  # ... coming from the bastion
    ssh.close_all()
    relay = tmp_path / "relay.py"
    relay.write_text(
        "import socket, sys, threading\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
        "def up():\n"
        "    while (b := sys.stdin.buffer.read1(65536)):\n"
        "        s.sendall(b)\n"
        "    s.shutdown(socket.SHUT_WR)\n"
        "threading.Thread(target=up, daemon=True).start()\n"
        "while (b := s.recv(65536)):\n"
        "    sys.stdout.buffer.write(b); sys.stdout.buffer.flush()\n"
    )
    r2 = make_runner(node)
    r2.target = node.target(proxy_command=f"{sys.executable} {relay} %h %p")
    assert r2.run("echo via-proxy").stdout == "via-proxy\n"
