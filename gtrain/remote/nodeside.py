"""Functions that run ON a node, stdlib only (a node has python3, not gtrain).

A remote runner sends this file's source on stdin (``python3 - FUNC ARGS…``) and reads one JSON document
back; the local runner calls the same functions in-process. ``follow`` streams instead: one line per log
line, ``TAG<TAB>TEXT``, then a final ``\\x00END<TAB>{json state}``.

Job directory layout (written by the launch templates)::

    JOB/launch.sh  rank.sh  setup.sh      rendered scripts (no secret values)
    JOB/pid                               pid of launch.sh = its process group and session id
    JOB/state.json                        {"state": pending|running|succeeded|failed|cancelled, ...}
    JOB/cancel                            marker: a cancel was asked for
    JOB/node.log                          launch.sh + torchrun agent output
    JOB/logs/rank-R.log, rank-R.exit      each global rank's output and "rc time"
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import time

TERMINAL = ("succeeded", "failed", "cancelled")
_RANK_RE = re.compile(r"^rank-(\d+)\.log$")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError, ProcessLookupError):  # ESRCH: /proc/PID of one that just exited
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _read(f"/proc/{pid}/stat")
    if stat is not None:  # a zombie is dead for our purposes
        state = stat.rsplit(")", 1)[-1].split()[0]
        return state not in ("Z", "X")
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # any non-zombie member?
    for d in os.listdir("/proc"):
        if d.isdigit():
            stat = _read(f"/proc/{d}/stat")
            if not stat:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


def _node_needles(job_dir: str) -> list[bytes]:
    """What tells this node's processes of a job from another node's on the same machine (the local provider,
    ssh hosts sharing one PID namespace): the GTRAIN_NODE_RANK and GTRAIN_WORKDIR its rendered scripts export."""
    import shlex

    found: dict[str, str] = {}
    for script in ("launch.sh", "setup.sh", "data.sh", "rank.sh"):
        for line in (_read(os.path.join(job_dir, script)) or "").splitlines():
            for key in ("GTRAIN_NODE_RANK", "GTRAIN_WORKDIR"):
                if key not in found and line.startswith(f"export {key}="):
                    try:
                        found[key] = shlex.split(line[len(f"export {key}="):])[0]
                    except (ValueError, IndexError):
                        pass
        if len(found) == 2:
            break
    return [f"\0{k}={v}\0".encode() for k, v in sorted(found.items())]


def job_pids(job_id: str, job_dir: str | None = None) -> list[int]:
    """Processes of a job found by the GTRAIN_JOB_ID in their environment: torchrun starts its workers in
    sessions of their own, so a worker orphaned by a killed agent is in no process group of ours. With
    ``job_dir``, only this node's: the job id is the same on every node, so its node rank and workdir must
    match too."""
    needles = [f"\0GTRAIN_JOB_ID={job_id}\0".encode(), *(_node_needles(job_dir) if job_dir else [])]
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue
        if all(n in env for n in needles) and _alive(int(d)):
            out.append(int(d))
    return out


def _kill_pids(pids: list[int], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        left = [p for p in pids if _alive(p)]
        if not left:
            return
        for p in left:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while time.time() < deadline and any(_alive(p) for p in left):
            time.sleep(0.05)


def free_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def rank_exits(job_dir: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    logs = os.path.join(job_dir, "logs")
    try:
        names = os.listdir(logs)
    except FileNotFoundError:
        return out
    for n in names:
        if n.startswith("rank-") and n.endswith(".exit"):
            txt = (_read(os.path.join(logs, n)) or "").split()
            if txt:
                try:
                    out[n[5:-5]] = [int(txt[0]), float(txt[1]) if len(txt) > 1 else 0.0]
                except ValueError:
                    pass
    return out


def job_state(job_dir: str) -> dict[str, object]:
    """The truth about one job on this node, whatever happened to the CLI that launched it."""
    if not os.path.isdir(job_dir):
        return {"state": "missing", "exit_code": None, "ranks": {}}
    raw = _read(os.path.join(job_dir, "state.json"))
    st: dict[str, object] = {"state": "pending", "exit_code": None}
    if raw:
        try:
            st = json.loads(raw)
        except ValueError:
            pass
    ranks = rank_exits(job_dir)
    st["ranks"] = ranks
    state = st.get("state")
    if state == "running":
        pid = st.get("pid")
        if not isinstance(pid, int) or not _alive(pid):
            # launch.sh died without writing its end: killed, OOM, node rebooted
            st["state"] = "cancelled" if os.path.exists(os.path.join(job_dir, "cancel")) else "failed"
            st["lost"] = True
    if st.get("state") in TERMINAL:
        # workers left behind by a dead agent still hold CPUs/GPUs: say so, `cancel` ends them
        st["orphans"] = len(job_pids(os.path.basename(os.path.normpath(job_dir)), job_dir))
    if st.get("state") in TERMINAL and st.get("exit_code") is None:
        st["exit_code"] = node_exit_code(ranks, st.get("agent_rc"))
    return st


def node_exit_code(ranks: dict[str, list[float]], agent_rc: object) -> int:
    failed = sorted((t, rc) for rc, t in ((int(v[0]), v[1]) for v in ranks.values()) if rc != 0)
    if failed:
        return int(failed[0][1])
    if isinstance(agent_rc, int):
        return agent_rc
    return 1


def cancel(job_dir: str, grace: str = "10") -> dict[str, object]:
    """Stop a job: TERM its process group, then KILL after ``grace`` seconds. Idempotent."""
    if not os.path.isdir(job_dir):
        return {"state": "missing"}
    job_id = os.path.basename(os.path.normpath(job_dir))
    if job_state(job_dir).get("state") in TERMINAL:  # over already (maybe failed): only end what it left behind
        _kill_pids(job_pids(job_id, job_dir), float(grace))
        return job_state(job_dir)
    with open(os.path.join(job_dir, "cancel"), "w") as f:
        f.write(str(time.time()))
    pid_txt = (_read(os.path.join(job_dir, "pid")) or "").strip()
    if pid_txt.isdigit():
        pgid = int(pid_txt)
        for sig, wait in ((signal.SIGTERM, float(grace)), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + wait
            while time.time() < deadline and _group_alive(pgid):
                time.sleep(0.05)
            if not _group_alive(pgid):
                break
    # and whatever of the job is left outside that group (workers in their own sessions, orphans)
    _kill_pids(job_pids(job_id, job_dir), float(grace))
    st = job_state(job_dir)
    if st.get("state") not in TERMINAL:
        st = {"state": "cancelled", "exit_code": 130, "pid": None, "time": time.time()}
        tmp = os.path.join(job_dir, ".state.json.tmp")
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, os.path.join(job_dir, "state.json"))
        st = job_state(job_dir)
    return st


def manifest(root: str) -> list[dict[str, object]]:
    """Every regular file under ``root``: relative path, size, mtime and sha256."""
    out: list[dict[str, object]] = []
    if not os.path.isdir(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(filenames):
            p = os.path.join(dirpath, n)
            if os.path.islink(p) or not os.path.isfile(p) or ".gtrain-tmp" in n:
                continue
            h = hashlib.sha256()
            size = 0
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            out.append({"path": rel, "size": size, "mtime": os.stat(p).st_mtime, "sha256": h.hexdigest()})
    return out


def pull_manifest(root: str, under: str = "") -> dict[str, object]:
    """``manifest(root)`` for ``gtrain pull``, refused (``{"refused": why}``) when ``root`` or a folder between
    ``under`` (the node's gtrain root) and it is a symlink: a checkpoint_dir is a path inside the workdir, and
    a link would pull whatever it points at. Symlinks inside ``root`` are skipped, as by ``manifest``."""
    base = os.path.normpath(under) if under else ""
    path = os.path.normpath(root)
    if base and (path == base or path.startswith(base.rstrip("/") + "/")):
        cur = base
        for part in os.path.relpath(path, base).split(os.sep):
            if part in ("", "."):
                continue
            cur = os.path.join(cur, part)
            if os.path.islink(cur):
                return {"refused": f"{cur} is a symlink (to {os.readlink(cur)!r}); gtrain pulls only what is "
                                   "inside the workdir", "files": []}
    elif os.path.islink(path):
        return {"refused": f"{path} is a symlink (to {os.readlink(path)!r})", "files": []}
    return {"refused": None, "files": manifest(path)}


ROOT_MARKER = ".gtrain-root"
_ROOT_OWN = ("workdir", "jobs", "gtrain-sync.pyz", "gtrain-ckpt.pyz", "gtrain-record.json", ".gtrain-node", ROOT_MARKER)

def _never_root(path: str) -> bool:
    home = os.path.abspath(os.path.expanduser("~"))
    return path == "/" or path == home or home.startswith(path.rstrip("/") + "/") or os.path.islink(path)


def root_problem(root: str) -> str | None:
    """Why ``root`` cannot be gtrain's folder here (/, a home, a link, a foreign non-empty folder), or None."""
    path = os.path.abspath(os.path.expanduser(root))
    if _never_root(path):
        return f"{path} is /, a home folder (or holds one) or a symlink"
    if os.path.lexists(path) and (not os.path.isdir(path) or os.listdir(path)
                                  and not os.path.isfile(os.path.join(path, ROOT_MARKER))):
        return f"{path} already exists and holds what gtrain did not make (no {ROOT_MARKER} marker)"
    return None


def remove_tree(path: str) -> bool:
    """Remove what gtrain made in its root, then the root if that left it empty; nothing else is touched."""
    full = os.path.abspath(os.path.expanduser(path))
    if _never_root(full) or not os.path.isdir(full):
        return False
    for p in (os.path.join(full, name) for name in _ROOT_OWN):  # two removals of one root may race: both win
        try:
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        except FileNotFoundError:
            pass
    try:  # the root itself only when that left it empty (OSError: something not gtrain's is there)
        os.rmdir(full)
    except OSError:
        pass
    return True


def _tail_offset(path: str, lines: int) -> int:
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return 0
    if lines <= 0:
        return size
    with open(path, "rb") as f:
        block = 1 << 16
        pos = size
        data = b""
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
        # skip a trailing newline, then keep the last `lines` lines
        idx = len(data)
        body = data[:-1] if data.endswith(b"\n") else data
        count = 0
        for i in range(len(body) - 1, -1, -1):
            if body[i:i + 1] == b"\n":
                count += 1
                if count == lines:
                    idx = i + 1
                    break
        else:
            idx = 0
        return pos + idx


def follow(job_dir: str, follow_flag: str = "0", tail: str = "-1", interval: str = "0.1") -> int:
    """Print every log line of the job on this node as ``TAG\\tTEXT`` (TAG: ``-`` for the node's own
    output, else the global rank). With ``follow_flag`` 1, keep going until the job ends."""
    out = sys.stdout
    do_follow = follow_flag == "1"
    n_tail = int(tail)
    poll = float(interval)
    pos: dict[str, int] = {}
    partial: dict[str, bytes] = {}

    def files() -> list[tuple[str, str]]:
        fs = [("-", os.path.join(job_dir, "node.log"))]
        try:
            for n in sorted(os.listdir(os.path.join(job_dir, "logs"))):
                m = _RANK_RE.match(n)
                if m:
                    fs.append((m.group(1), os.path.join(job_dir, "logs", n)))
        except FileNotFoundError:
            pass
        return fs

    def drain(final: bool) -> None:
        wrote = False
        for tag, path in files():
            if path not in pos:
                pos[path] = _tail_offset(path, n_tail) if n_tail >= 0 else 0
            try:
                with open(path, "rb") as f:
                    f.seek(pos[path])
                    data = f.read()
            except FileNotFoundError:
                continue
            if not data and not (final and partial.get(path)):
                continue
            pos[path] += len(data)
            data = partial.pop(path, b"") + data
            lines = data.split(b"\n")
            rest = lines.pop()
            if rest:
                if final:
                    lines.append(rest)
                else:
                    partial[path] = rest
            for ln in lines:
                out.write(f"{tag}\t{ln.decode('utf-8', errors='replace').rstrip(chr(13))}\n")
                wrote = True
        if wrote:
            out.flush()

    while True:
        st = job_state(job_dir)
        done = st.get("state") in TERMINAL or st.get("state") == "missing"
        drain(final=done or not do_follow)
        if done or not do_follow:
            break
        time.sleep(poll)
    out.write("\x00END\t" + json.dumps(st) + "\n")
    out.flush()
    return 0


def probe(root: str, check_torch: str = "1") -> dict[str, object]:
    """What `gtrain up` checks on a host: python, torch, GPUs, free disk, and the address we reached it on.
    Read-only: ``root`` is only expanded (``~``), not created."""
    import platform
    import subprocess

    out: dict[str, object] = {"python": platform.python_version(), "hostname": socket.gethostname()}
    conn = os.environ.get("SSH_CONNECTION", "").split()
    out["ssh_server_addr"] = conn[2] if len(conn) >= 4 else None
    if check_torch == "1":
        try:
            import torch  # noqa: F401

            out["torch"] = torch.__version__
        except Exception as e:  # noqa: BLE001 - reported, not raised
            out["torch_error"] = f"{type(e).__name__}: {e}"
    gpus = 0
    if shutil.which("nvidia-smi"):
        try:
            res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            gpus = sum(1 for ln in res.stdout.splitlines() if ln.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            pass
    out["gpus"] = gpus
    home = os.path.expanduser("~")
    out["free_gb"] = round(shutil.disk_usage(home).free / 1e9, 1)
    out["root"] = os.path.expanduser(root)
    out["root_error"] = root_problem(root)
    return out


def _busy() -> str | None:
    """What keeps the node from being idle: a process of a gtrain job (GTRAIN_JOB_ID in its environment) or
    an interactive SSH login (an ``sshd: USER@pts/N`` process); None when there is neither."""
    me = os.getpid()
    # the watcher of one cluster's node counts that cluster's jobs (GTRAIN_IDLE_CLUSTER, set by `up`): on a
    # machine that holds more than one node (the ssh provider's shared hosts, tests), another cluster's job
    # must not keep this node up, nor stop it from powering off
    cluster = os.environ.get("GTRAIN_IDLE_CLUSTER")
    mine = b"\0GTRAIN_CLUSTER=" + cluster.encode() + b"\0" if cluster else b""
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"  # every NAME=value framed by NULs
            if b"\0GTRAIN_JOB_ID=" in env and mine in env:
                return f"job process {d}"
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
            if cmd.startswith(b"sshd: ") and b"@pts/" in cmd:
                login = cmd.split(b"\0")[0].decode(errors="replace")
                return f"ssh login ({login})"
        except OSError:
            continue
    return None


def idle_watch(idle_s: str, poll_s: str, pidfile: str, *cmd: str) -> int:
    """Run ``cmd`` (the provider's: power the node off) once the node has had no gtrain job process and no
    interactive SSH login for ``idle_s`` seconds (``policies.idle_minutes``). Started detached by ``gtrain up``
    on cloud nodes, so it holds with no laptop; one per node (a second one finds ``pidfile`` locked and
    exits). Prints what it decides, one line each, to its log."""
    import fcntl
    import subprocess

    fd = os.open(os.path.expanduser(pidfile), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    limit, poll = float(idle_s), float(poll_s)
    last_busy = time.time()
    print(f"gtrain idle watch: {' '.join(cmd)!r} after {limit:.0f}s idle", flush=True)
    while True:
        why = _busy()
        now = time.time()
        if why is not None:
            last_busy = now
        elif now - last_busy >= limit:
            print(f"gtrain idle watch: idle for {now - last_busy:.0f}s: running {' '.join(cmd)!r}", flush=True)
            rc = subprocess.run(list(cmd), check=False).returncode
            print(f"gtrain idle watch: exit {rc}", flush=True)
            return rc
        time.sleep(poll)


FUNCS = {
    "probe": probe,
    "free_port": free_port, "job_state": job_state, "cancel": cancel, "manifest": manifest,
    "pull_manifest": pull_manifest,
    "remove_tree": remove_tree,
}

if __name__ == "__main__":
    name, args = sys.argv[1], sys.argv[2:]
    if name == "follow":
        sys.exit(follow(*args))
    if name == "idle_watch":
        sys.exit(idle_watch(*args))
    print(json.dumps(FUNCS[name](*args)))  # type: ignore[operator]
