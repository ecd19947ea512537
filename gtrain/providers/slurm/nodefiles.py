"""Reading a Slurm job's files on the login side, stdlib only (sent as source to a login node's python3;
called in-process when the login side is this machine). Never asks whether a compute node's pid is alive:
the login node cannot see them -- Slurm says what runs. The one process it checks is the login side's own:
the wrapper that drives a step of a held allocation (``slurm.hold``) holds a flock on ``JOB/step.lock``.

Layout (``JOB`` = ``<shared_dir>/gtrain/<cluster>/jobs/<job id>``)::

    JOB/batch.sh  node.sh  batch.log     the batch script, the per-node wrapper srun starts, the batch's output
    JOB/preempt                          written when the batch shell got the --signal (time limit near)
    JOB/node-K/launch.sh rank.sh setup.sh  node K's scripts (gtrain's shared templates)
    JOB/node-K/state.json node.log        node K's own state and its launcher's output (no other node writes them)
    JOB/node-K/logs/rank-R.log .exit      each global rank's output and "rc time"
    JOB/node-K/run-N/                     state and exit files of an earlier run (before a requeue)
    JOB/step.sh step.pid step.lock        slurm.hold: the login-side wrapper of the step, its pid, its flock,
    JOB/step.exit                         "rc time" of the step,
    JOB/step.log                          and its own output (batch.sh's goes to batch.log as ever)
    JOB/cancelled                         slurm.hold: written by cancel before the step is scancelled
"""

from __future__ import annotations

import json
import os
import re
import sys

_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
_CAP = 4 << 20  # bytes per file per read


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def node_files(node_dir: str) -> dict[str, object]:
    raw = _read(os.path.join(node_dir, "state.json"))
    state: object = None
    if raw:
        try:
            state = json.loads(raw)
        except ValueError:
            state = None
    ranks: dict[str, list[float]] = {}
    logs = os.path.join(node_dir, "logs")
    for n in (os.listdir(logs) if os.path.isdir(logs) else []):
        if n.startswith("rank-") and n.endswith(".exit"):
            txt = (_read(os.path.join(logs, n)) or "").split()
            try:
                ranks[n[5:-5]] = [int(txt[0]), float(txt[1]) if len(txt) > 1 else 0.0]
            except (ValueError, IndexError):
                pass
    return {"exists": os.path.isdir(node_dir), "state": state, "ranks": ranks}


def _held(path: str) -> bool:
    """Whether a live process holds the flock on ``path`` (the step wrapper and its children do)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def step_info(job_root: str) -> dict[str, object]:
    """The login-side step wrapper of a held allocation's job: started, alive, its "rc time", cancelled."""
    pid = (_read(os.path.join(job_root, "step.pid")) or "").strip()
    txt = (_read(os.path.join(job_root, "step.exit")) or "").split()
    done: list[float] | None = None
    try:
        done = [int(txt[0]), float(txt[1]) if len(txt) > 1 else 0.0] if txt else None
    except ValueError:
        done = None
    unknown = os.path.exists(os.path.join(job_root, "step.nolock"))  # no flock(1) there: trust the wrapper
    return {"started": pid.isdigit(), "alive": unknown or _held(os.path.join(job_root, "step.lock")), "exit": done,
            "cancelled": os.path.exists(os.path.join(job_root, "cancelled"))}


def snapshot(job_root: str, num_nodes: str) -> dict[str, object]:
    """Every node's state and rank exits, in one call."""
    return {"nodes": {str(k): node_files(os.path.join(job_root, f"node-{k}")) for k in range(int(num_nodes))},
            "preempt": os.path.exists(os.path.join(job_root, "preempt")), "step": step_info(job_root)}


def _tail_offset(path: str, lines: int) -> int:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            start = max(0, size - 65536 * (lines + 1))
            f.seek(start)
            data = f.read()
    except OSError:
        return 0
    if data.endswith(b"\n"):
        data = data[:-1]
    cut = len(data)
    for _ in range(lines):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return start
    return start + cut + 1


def read(node_dir: str, offsets_json: str = "{}", tail: str = "-1", final: str = "0") -> dict[str, object]:
    """New complete lines of node.log (tag ``-``) and every rank's log since ``offsets``; with ``final``, a
    last line without its newline too. Returns ``{"lines": [[tag, text]...], "offsets": {...}}``."""
    offsets: dict[str, int] = json.loads(offsets_json)
    n_tail = int(tail)
    files = [("-", "node.log")]
    logs = os.path.join(node_dir, "logs")
    for n in sorted(os.listdir(logs) if os.path.isdir(logs) else [], key=lambda s: (len(s), s)):
        m = _RANK_LOG.match(n)
        if m:
            files.append((m.group(1), os.path.join("logs", n)))
    lines: list[list[str]] = []
    for tag, rel in files:
        path = os.path.join(node_dir, rel)
        if rel not in offsets:
            offsets[rel] = _tail_offset(path, n_tail) if n_tail >= 0 else 0
        try:
            with open(path, "rb") as f:
                f.seek(offsets[rel])
                data = f.read(_CAP)
        except OSError:
            continue
        end = len(data) if final == "1" else data.rfind(b"\n") + 1
        if end <= 0:
            continue
        offsets[rel] += end
        chunk = data[:end]
        parts = chunk.split(b"\n")
        if chunk.endswith(b"\n"):
            parts.pop()
        for ln in parts:
            lines.append([tag, ln.decode("utf-8", errors="replace").rstrip("\r")])
    return {"lines": lines, "offsets": offsets, "step": step_info(os.path.dirname(node_dir.rstrip("/")))}


FUNCS = {"snapshot": snapshot, "read": read}

if __name__ == "__main__":
    print(json.dumps(FUNCS[sys.argv[1]](*sys.argv[2:])))  # type: ignore[operator]
