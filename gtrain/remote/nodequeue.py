"""A cluster's job queue, ON a node, stdlib only (shipped as ``ROOT/jobs/.queue/gtrain-queue.py``).

``gtrain launch --queue`` writes one entry per job into every node's ``ROOT/jobs/.queue/JOB.json`` (its
priority and the CLI's enqueue time, the same on every node: every node orders its queue alike) and starts one
waiter per job and node, detached, with the job's secrets on its stdin (held in memory, never written)::

    python3 ROOT/jobs/.queue/gtrain-queue.py wait QUEUE_DIR JOB_ID     (a detached waiter; log: JOB/queue.log)
    python3 - list QUEUE_DIR                                            (one JSON document: the entries)

A waiter starts its job's ``launch.sh`` on its node once no job runs there (no ``JOB/pid`` alive with a
state not yet ended) and its job is the first waiting one: highest ``priority``, then the earliest enqueued.
It copies the job's staged workdir (``JOB/stage``, shipped at enqueue time so a running job's files stay as
they are) over ``ROOT/workdir`` first. A job cancelled while waiting (``JOB/cancel``, written by
``nodeside.cancel``) or whose entry is gone makes its waiter exit; an entry whose waiter died (a reboot) is
skipped. Each node decides for itself: nodes cannot reach each other's files, and a job ends on all its nodes
together, so every node picks the same next job.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time

ENDED = ("succeeded", "failed", "cancelled")


def _load(path: str) -> dict[str, object] | None:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _save(path: str, doc: dict[str, object]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return True


def _pid(job_dir: str) -> int | None:
    try:
        with open(os.path.join(job_dir, "pid"), encoding="utf-8") as f:
            txt = f.read().strip()
    except OSError:
        return None
    return int(txt) if txt.isdigit() else None


def job_word(job_dir: str) -> str:
    """One job's state on this node, from its own files: queued, running, succeeded, failed or cancelled."""
    st = (_load(os.path.join(job_dir, "state.json")) or {}).get("state")
    if st in ENDED:
        return str(st)
    if os.path.exists(os.path.join(job_dir, "cancel")):
        return "cancelled"
    pid = _pid(job_dir)
    if pid is None:
        return "queued"
    return "running" if _alive(pid) else "failed"


def running(jobs_dir: str) -> list[str]:
    """The jobs that run on this node now (their launch.sh alive, their state not ended)."""
    try:
        names = sorted(os.listdir(jobs_dir))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        d = os.path.join(jobs_dir, name)
        if name.startswith(".") or not os.path.isdir(d):
            continue
        if _alive(_pid(d)) and (_load(os.path.join(d, "state.json")) or {}).get("state") not in ENDED:
            out.append(name)
    return out


def busy(jobs_dir: str) -> str | None:
    """A job that runs on this node now, or None."""
    return next(iter(running(jobs_dir)), None)


def held(queue_dir: str) -> set[int] | None:
    """The GPUs (indices) the jobs running on this node hold; None: the whole node (a job not packed, or one
    started without the queue)."""
    out: set[int] = set()
    for name in running(os.path.dirname(os.path.normpath(queue_dir))):
        devices = (_load(os.path.join(queue_dir, f"{name}.json")) or {}).get("devices")
        if not isinstance(devices, list):
            return None
        out.update(int(d) for d in devices)
    return out


def fit(entry: dict[str, object], queue_dir: str) -> list[int] | None | bool:
    """Whether ``entry`` can start now: False (not yet), True (a whole-node job, the node is free), or the GPU
    indices a packed job (``gpus`` of ``node_gpus``) gets, the lowest free ones."""
    need, total = entry.get("gpus"), entry.get("node_gpus")
    hold = held(queue_dir)
    if not isinstance(need, int) or not isinstance(total, int):
        return hold is not None and not hold
    if hold is None or total - len(hold) < need:
        return False
    return sorted(set(range(total)) - hold)[:need]


def entries(queue_dir: str) -> list[dict[str, object]]:
    """Every entry with its job's state now (``state``) and, for a waiting one, its place (``position``, 1 =
    next): waiting first in the order they will start, then running, then ended (newest first)."""
    out: list[dict[str, object]] = []
    try:
        names = sorted(os.listdir(queue_dir))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        doc = _load(os.path.join(queue_dir, name))
        if doc is None or not isinstance(doc.get("job_dir"), str):
            continue
        word = job_word(str(doc["job_dir"]))
        if word == "queued" and not _alive(doc.get("waiter_pid")) and doc.get("waiter_pid") is not None:
            word = "lost"  # its waiter died (the node rebooted): it never starts; `cancel` clears it
        doc["state"] = "waiting" if word == "queued" else word
        out.append(doc)
    waiting = sorted((d for d in out if d["state"] == "waiting"), key=_order)
    for i, d in enumerate(waiting, 1):
        d["position"] = i
    rest = sorted((d for d in out if d["state"] != "waiting"),
                  key=lambda d: (d["state"] != "running", -_num(d.get("started_at") or d.get("seq"))))
    return [*waiting, *rest]


def _num(v: object) -> float:
    return float(v) if isinstance(v, (int, float)) else 0.0  # a tuple: a node may have an old python3


def _order(d: dict[str, object]) -> tuple[float, float, str]:
    return (-_num(d.get("priority")), _num(d.get("seq")), str(d.get("job_id")))


def _copy_stage(stage: str, workdir: str) -> None:
    if os.path.isdir(stage):
        shutil.copytree(stage, workdir, dirs_exist_ok=True, symlinks=True)
        shutil.rmtree(stage, ignore_errors=True)  # a copy of the workdir per waiting job: not one per ended job


def wait(queue_dir: str, job_id: str, poll: str = "1") -> int:
    """Wait for ``job_id``'s turn on this node, then start its launch.sh (detached, its own session, the
    secrets read from stdin on its stdin) and exit."""
    secrets = sys.stdin.buffer.read()
    path = os.path.join(queue_dir, f"{job_id}.json")
    entry = _load(path)
    if entry is None:
        print(f"gtrain queue: no entry for {job_id}", flush=True)
        return 1
    entry["waiter_pid"] = os.getpid()
    _save(path, entry)
    job_dir = str(entry["job_dir"])
    jobs_dir = os.path.dirname(os.path.normpath(queue_dir))
    print(f"gtrain queue: {job_id} waiting (priority {entry.get('priority', 0)})", flush=True)
    lock_fd = os.open(os.path.join(queue_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    while True:
        if _load(path) is None or job_word(job_dir) != "queued":
            print(f"gtrain queue: {job_id} {job_word(job_dir)} before it started: leaving", flush=True)
            return 0
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            head = next((d for d in entries(queue_dir) if d["state"] == "waiting"), None)
            place = fit(entry, queue_dir) if head is not None and head.get("job_id") == job_id else False
            if place is not False:
                devices = place if isinstance(place, list) else None
                env = dict(os.environ)
                if devices is not None:  # a packed job: its own GPUs
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
                _copy_stage(os.path.join(job_dir, "stage"), str(entry["workdir"]))
                with open(os.path.join(job_dir, "node.log"), "ab") as log:
                    p = subprocess.Popen(["bash", os.path.join(job_dir, "launch.sh")], stdin=subprocess.PIPE,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         cwd=os.path.dirname(jobs_dir), close_fds=True, env=env)
                with open(os.path.join(job_dir, "pid"), "w", encoding="utf-8") as f:
                    f.write(f"{p.pid}\n")  # launch.sh writes the same; busy() counts it from now on
                assert p.stdin is not None
                try:
                    p.stdin.write(secrets)
                    p.stdin.close()
                except BrokenPipeError:
                    pass
                _save(path, {**(_load(path) or entry), "started_at": time.time(), "pid": p.pid,
                             "devices": devices})
                gpus = "" if devices is None else f", GPUs {','.join(map(str, devices))}"
                print(f"gtrain queue: {job_id} started (pid {p.pid}{gpus})", flush=True)
                return 0
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        time.sleep(float(poll))


if __name__ == "__main__":
    func, args = sys.argv[1], sys.argv[2:]
    if func == "wait":
        sys.exit(wait(*args))
    if func == "list":
        print(json.dumps(entries(*args)))
