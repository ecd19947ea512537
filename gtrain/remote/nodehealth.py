"""What the watcher asks a node when it needs the node's own word (gtrain.runs.signals), stdlib only: like
gtrain.remote.nodeside, its source goes to the node on stdin (``python3 - FUNC ARGS``) and one JSON document
comes back.

- ``health JOB_DIR``: the node's part of the job as the node sees it: its launcher (``alive``, ``dead``: the
  state says running and launch.sh is gone, or the job's folder is; ``ended``; ``pending``), the age of its
  heartbeat (``JOB/heartbeat``, rewritten by launch.sh every ``GTRAIN_HEARTBEAT_S``) and each live rank's
  progress: the age of its newest metrics record (``metrics/rank-R.jsonl``, and the step it names) when the rank
  logged one in this attempt, else of its log's newest line (``logs/rank-R.log``). Ages are taken on the node's
  clock, so the watcher's clock need not agree with it.
- ``dump JOB_DIR JOB_ID``: every live rank's Python stacks into its own log: ``py-spy dump`` where the node has
  it (next to the rank's python, or on PATH; the rank goes on), else SIGABRT, on which a rank started with
  ``PYTHONFAULTHANDLER=1`` (launch.sh exports it) prints every thread's traceback to its log, then ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
_ENDED = ("succeeded", "failed", "cancelled")


def _age(path: str, now: float) -> float | None:
    try:
        return max(0.0, now - os.stat(path).st_mtime)
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _last_step(path: str) -> int | None:
    """The step of the newest record of a metrics file that names one (its last 64 KiB are read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        step = rec.get("step") if isinstance(rec, dict) else None
        if isinstance(step, (int, float)) and not isinstance(step, bool):
            return int(step)
    return None


def live_ranks(job_dir: str) -> list[int]:
    """The ranks of this attempt on this node with a log and no exit file yet."""
    logs = os.path.join(job_dir, "logs")
    try:
        names = sorted(os.listdir(logs))
    except OSError:
        return []
    out = []
    for n in names:
        m = _RANK_LOG.match(n)
        if m and not os.path.exists(os.path.join(logs, f"rank-{m.group(1)}.exit")):
            out.append(int(m.group(1)))
    return out


def health(job_dir: str) -> dict[str, object]:
    now = time.time()
    if not os.path.isdir(job_dir):
        return {"now": now, "agent": "dead", "why": "the job's folder is gone"}
    try:
        with open(os.path.join(job_dir, "state.json"), encoding="utf-8") as f:
            st = json.load(f)
    except (OSError, ValueError):
        st = {}
    word = st.get("state") if isinstance(st, dict) else None
    started_age = None
    if word == "running":
        pid = st.get("pid")
        # a launcher gone without writing its end died, unless gtrain stopped it (JOB/cancel: a fail-fast, a
        # cancel, a recovery's stop) and the stop's SIGKILL came first (a durable run's final flush outlasting
        # the grace): that is an end, as nodeside.job_state says (cancelled), not a node lost
        agent = ("alive" if isinstance(pid, int) and _alive(pid) else
                 "ended" if os.path.exists(os.path.join(job_dir, "cancel")) else "dead")
        if isinstance(st.get("time"), (int, float)):
            started_age = max(0.0, now - float(st["time"]))
    else:
        agent = "ended" if word in _ENDED else "pending"
    ranks: dict[str, object] = {}
    for r in live_ranks(job_dir):
        metrics = os.path.join(job_dir, "metrics", f"rank-{r}.jsonl")
        m_age = _age(metrics, now)
        in_attempt = m_age is not None and (started_age is None or m_age <= started_age)
        ranks[str(r)] = {"age": m_age if in_attempt else _age(os.path.join(job_dir, "logs", f"rank-{r}.log"), now),
                         "by": "metrics" if in_attempt else "log",
                         "step": _last_step(metrics) if m_age is not None else None}
    return {"now": now, "agent": agent, "heartbeat_age": _age(os.path.join(job_dir, "heartbeat"), now),
            "started_age": started_age, "ranks": ranks}


def _pyspy(pid: int) -> str | None:
    if os.environ.get("GTRAIN_PYSPY", "1") == "0":  # tests: the faulthandler way, py-spy or not
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            exe = f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        exe = ""
    beside = os.path.join(os.path.dirname(exe), "py-spy") if os.path.isabs(exe) else ""
    return beside if beside and os.access(beside, os.X_OK) else shutil.which("py-spy")


def _mine(pid: int, job_id: str) -> bool:
    """Whether ``pid`` is a process of this job (a pid file can outlive its process; a rank in a container
    has a pid of the container's own)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"\0GTRAIN_JOB_ID={job_id}\0".encode() in b"\0" + f.read()
    except OSError:
        return False


def dump(job_dir: str, job_id: str, timeout: str = "20") -> dict[str, str]:
    """Every live rank's stacks into its log; rank -> how (``py-spy``, ``faulthandler``) or why not."""
    out: dict[str, str] = {}
    aborted: list[int] = []
    for r in live_ranks(job_dir):
        log = os.path.join(job_dir, "logs", f"rank-{r}.log")
        try:
            with open(os.path.join(job_dir, "ranks", f"{r}.pid"), encoding="utf-8") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            out[str(r)] = "no pid file"
            continue
        if not _alive(pid) or not _mine(pid, job_id):
            out[str(r)] = f"pid {pid} is not this job's rank (ended, or in a container)"
            continue
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        spy = _pyspy(pid)
        if spy:
            try:
                res = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                     timeout=float(timeout))
                if res.returncode == 0 and res.stdout.strip():
                    with open(log, "a", encoding="utf-8") as f:
                        f.write(f"[gtrain] hang: the Python stacks of rank {r} (pid {pid}, py-spy dump, {stamp}):\n"
                                f"{res.stdout.rstrip()}\n")
                    out[str(r)] = "py-spy"
                    continue
            except (OSError, subprocess.SubprocessError):
                pass
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"[gtrain] hang: SIGABRT to rank {r} (pid {pid}, {stamp}): with PYTHONFAULTHANDLER its Python "
                    "stacks follow\n")
        try:
            os.kill(pid, signal.SIGABRT)
            aborted.append(pid)
            out[str(r)] = "faulthandler"
        except OSError as e:
            out[str(r)] = f"SIGABRT failed: {e}"
    deadline = time.time() + 10  # faulthandler writes in the signal handler; the rank ends right after
    while aborted and time.time() < deadline:
        aborted = [p for p in aborted if _alive(p)]
        time.sleep(0.05)
    return out


FUNCS = {"health": health, "dump": dump}

if __name__ == "__main__":
    print(json.dumps(FUNCS[sys.argv[1]](*sys.argv[2:])))  # type: ignore[operator]
