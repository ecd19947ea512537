"""Status from heartbeats (docs/scale.md, "Status from heartbeats"): every node tells node 0 how its part of the
job is, node 0 keeps the cluster's picture in one file, and the follower reads that file in one request instead
of asking every node. Stdlib only: launch.sh runs this file's source on every node (``python3 - beat ...``,
embedded by templates/_heartbeat.sh.j2), and the follower's side (:func:`derive`) is pure.

- ``beat JOB_DIR JOB_ID RANK NUM_NODES ADDR PORT EVERY PARENT``: every ``EVERY`` seconds (GTRAIN_HEARTBEAT_S)
  one UDP datagram to node 0 (``ADDR``, the rendezvous address, UDP port ``PORT``: the job's master port,
  whose TCP twin the rendezvous holds), and one at once when ``state.json`` or ``logs/`` changed (the
  launcher started or ended, a rank ended), with this node's :func:`summary`: its launcher (alive, ended, dead,
  pending), its state and exit code, each live rank's progress (age, step), each ended rank's exit. Node 0
  (``RANK`` 0) also binds that port and writes ``JOB/nodes.json`` atomically every second: per node, when it was
  last heard (node 0's clock), how old that is, and what it said. It ends with ``PARENT`` (launch.sh), after
  one last datagram; SIGTERM/SIGHUP/SIGINT are launch.sh's to act on (it ends within half a second of it).
- ``read JOB_DIR``: node 0's ``nodes.json``, node 0's clock and whether its aggregator still runs: what the
  follower fetches, one request whatever the number of nodes.

A datagram lost is one beat late; a node never heard from (UDP blocked between nodes, python missing) is
``unheard`` and the follower asks it as before; a node heard and then silent past the stale timeout
(GTRAIN_HEARTBEAT_STALE_S, 30 s) is ``unreachable``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time

VERSION = 1
#: the same default as gtrain.runs.decide.HEARTBEAT_STALE_S (a unit test keeps them equal)
STALE_S = 30.0
#: how often node 0 rewrites nodes.json
WRITE_EVERY_S = 1.0
#: how long node 0 keeps trying to bind its port (an earlier attempt's aggregator may still hold it)
BIND_TRY_S = 20.0
#: a node's datagram names at most this many live ranks and ended ranks each (a datagram stays < 64 KB)
MAX_RANKS = 512
NODES_JSON = "nodes.json"
PID_FILE = "beat.pid"
ENDED = ("succeeded", "failed", "cancelled")
_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
_RANK_EXIT = re.compile(r"^rank-(\d+)\.exit$")


# ---- what a node says of itself --------------------------------------------------------------------------

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


def _last_step(path: str, tail: int = 8192) -> int | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail))
            data = f.read()
    except OSError:
        return None
    for line in reversed(data.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        step = rec.get("step") if isinstance(rec, dict) else None
        if isinstance(step, (int, float)) and not isinstance(step, bool):
            return int(step)
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def summary(job_dir: str) -> dict[str, object]:
    """This node's part of the job, as gtrain.remote.nodehealth.health and nodeside.job_state see it: the
    launcher's word (``agent``), the state and exit code of state.json, the heartbeat file's age, each live
    rank's progress ``[age, by, step]`` and each ended rank's ``[rc, time]``; ages on this node's clock."""
    now = time.time()
    if not os.path.isdir(job_dir):
        return {"agent": "dead", "state": "missing", "exit_code": None}
    try:
        st = json.loads(_read(os.path.join(job_dir, "state.json")) or "{}")
    except ValueError:
        st = {}
    st = st if isinstance(st, dict) else {}
    word = st.get("state") or "pending"
    started_age = None
    if word == "running":
        pid = st.get("pid")
        # as nodehealth.health and nodeside.job_state: a launcher gone after gtrain asked it to stop (JOB/cancel)
        # and killed before it wrote its end was cancelled; it did not die
        agent = ("alive" if isinstance(pid, int) and _alive(pid) else
                 "ended" if os.path.exists(os.path.join(job_dir, "cancel")) else "dead")
        if isinstance(st.get("time"), (int, float)):
            started_age = max(0.0, now - float(st["time"]))
        if agent == "ended":
            word = "cancelled"
    else:
        agent = "ended" if word in ENDED else "pending"
    logs = os.path.join(job_dir, "logs")
    try:
        names = sorted(os.listdir(logs))
    except OSError:
        names = []
    exits: dict[str, list[float]] = {}
    for n in names:
        m = _RANK_EXIT.match(n)
        if m and len(exits) < MAX_RANKS:
            txt = (_read(os.path.join(logs, n)) or "").split()
            try:
                exits[m.group(1)] = [int(txt[0]), float(txt[1]) if len(txt) > 1 else 0.0]
            except (ValueError, IndexError):
                pass
    ranks: dict[str, list[object]] = {}
    steps = []
    for n in names:
        m = _RANK_LOG.match(n)
        if not m or m.group(1) in exits or len(ranks) >= MAX_RANKS:
            continue
        r = m.group(1)
        metrics = os.path.join(job_dir, "metrics", f"rank-{r}.jsonl")
        m_age = _age(metrics, now)
        in_attempt = m_age is not None and (started_age is None or m_age <= started_age)
        step = _last_step(metrics) if m_age is not None else None
        if step is not None:
            steps.append(step)
        ranks[r] = [m_age if in_attempt else _age(os.path.join(logs, n), now), "metrics" if in_attempt else "log",
                    step]
    code = st.get("exit_code", st.get("agent_rc"))
    return {"agent": agent, "state": word, "exit_code": code if isinstance(code, int) else None,
            "hb_age": _age(os.path.join(job_dir, "heartbeat"), now), "started_age": started_age,
            "ranks": ranks, "exits": exits, "step": max(steps) if steps else None}


# ---- node 0's picture ------------------------------------------------------------------------------------

class Aggregate:
    """What node 0 heard: :meth:`take` one datagram, :meth:`document` the nodes.json of now."""

    def __init__(self, job_id: str, num_nodes: int, every: float, port: int, attempt: str = "") -> None:
        self.job_id, self.num_nodes, self.every, self.port, self.attempt = job_id, num_nodes, every, port, attempt
        self.heard: dict[int, tuple[float, dict[str, object]]] = {}
        self.started_at = time.time()
        self.dropped = 0

    def take(self, data: bytes, sender: str = "", now: float | None = None) -> bool:
        """One datagram: kept when it is this job's, from a node rank (the newest ``seq`` of each node wins)."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            self.dropped += 1
            return False
        node = doc.get("node") if isinstance(doc, dict) else None
        if (not isinstance(doc, dict) or doc.get("v") != VERSION or doc.get("job") != self.job_id
                or not isinstance(node, int) or isinstance(node, bool) or not 0 <= node < 100000):
            self.dropped += 1
            return False
        old = self.heard.get(node)
        seq, old_seq = doc.get("seq"), old[1].get("seq") if old is not None else None
        if (old is not None and isinstance(seq, int) and isinstance(old_seq, int) and seq < old_seq
                and doc.get("pid") == old[1].get("pid")):
            return False  # reordered: an older beat of the same sender
        doc["from"] = sender
        self.heard[node] = (time.time() if now is None else now, doc)
        return True

    def document(self, now: float | None = None) -> dict[str, object]:
        now = time.time() if now is None else now
        nodes = {}
        for node, (at, doc) in sorted(self.heard.items()):
            entry = {k: v for k, v in doc.items() if k not in ("v", "job", "node")}
            entry["heard_at"] = round(at, 3)
            entry["age"] = round(max(0.0, now - at), 3)
            nodes[str(node)] = entry
        return {"v": VERSION, "job": self.job_id, "attempt": self.attempt, "pid": os.getpid(),
                "written_at": round(now, 3), "started_at": round(self.started_at, 3), "every": self.every,
                "port": self.port, "num_nodes": self.num_nodes, "dropped": self.dropped, "nodes": nodes}

    def write(self, job_dir: str, now: float | None = None) -> None:
        path = os.path.join(job_dir, NODES_JSON)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.document(now), f, separators=(",", ":"))
        os.replace(tmp, path)


def read(job_dir: str) -> dict[str, object]:
    """What the follower fetches from node 0: ``{"now", "doc", "alive"}`` (``doc`` None: no nodes.json)."""
    now = time.time()
    raw = _read(os.path.join(job_dir, NODES_JSON))
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = None
    pid = doc.get("pid") if isinstance(doc, dict) else None
    return {"now": now, "doc": doc if isinstance(doc, dict) else None,
            "alive": isinstance(pid, int) and not isinstance(pid, bool) and _alive(pid)}


# ---- the follower's side (pure) --------------------------------------------------------------------------

def stale_s() -> float:
    """:data:`STALE_S`, or ``GTRAIN_HEARTBEAT_STALE_S``."""
    try:
        return float(os.environ.get("GTRAIN_HEARTBEAT_STALE_S") or STALE_S)
    except ValueError:
        return STALE_S


def written_s(every: float) -> float:
    """An aggregate not rewritten for this long is stale as a whole (its aggregator is gone or stuck)."""
    return max(5.0, 3 * WRITE_EVERY_S, 2 * every)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def on_time(beat: dict[str, object]) -> bool:
    """Whether node 0 heard the node within two of its beats (and a second): it is up and reachable from node 0
    now, whatever its job does. Tighter than the stale timeout: a machine that just went away is asked
    directly after two missed beats, not after 30 s."""
    age, every = _num(beat.get("age")), _num(beat.get("beat_s")) or 5.0
    return age is not None and age <= 2 * every + 1.0


def word_of(entry: dict[str, object] | None, age: float | None, stale: float) -> str:
    """One node's word from node 0's picture: ``unheard`` (never heard: ask it), ``unreachable`` (heard, then
    silent past ``stale`` while its part of the job was not over), else what it said of its launcher:
    ``running``, ``pending``, ``dead`` (state says running, launch.sh is gone), or its end's state."""
    if entry is None or age is None:
        return "unheard"
    agent, state = entry.get("agent"), str(entry.get("state") or "")
    if agent == "ended" and state in ENDED:
        return state  # it said it ended, then stopped beating: that is its last word, not silence
    if age > stale:
        return "unreachable"
    if agent == "alive":
        return "running"
    if agent == "dead":
        return "dead"
    return "pending"


def derive(answer: dict[str, object] | None, *, job_id: str, num_nodes: int, stale: float,
           attempt: object = None) -> dict[int, dict[str, object]] | None:
    """Each node's word from :func:`read`'s answer: ``{rank: {"word", "age", "beat_s", "state", "exit_code",
    "step", "entry"}}`` with ``age`` seconds since node 0 last heard it (None: never) and ``beat_s`` the nodes'
    GTRAIN_HEARTBEAT_S. None when the aggregate cannot
    be used and every node must be asked as before: no answer, no nodes.json, another job's or attempt's, its
    aggregator gone, or not rewritten for :func:`written_s`."""
    if not isinstance(answer, dict):
        return None
    doc, now = answer.get("doc"), _num(answer.get("now"))
    if not isinstance(doc, dict) or now is None or not answer.get("alive") or doc.get("job") != job_id:
        return None
    if attempt is not None and str(doc.get("attempt") or "") not in ("", str(attempt)):
        return None
    written, every = _num(doc.get("written_at")), _num(doc.get("every")) or 5.0
    if written is None or now - written > written_s(every):
        return None
    got = doc.get("nodes") if isinstance(doc.get("nodes"), dict) else {}
    out: dict[int, dict[str, object]] = {}
    for i in range(num_nodes):
        entry = got.get(str(i)) if isinstance(got, dict) else None
        entry = entry if isinstance(entry, dict) else None
        heard = _num(entry.get("heard_at")) if entry else None
        age = max(0.0, now - heard) if heard is not None else None
        out[i] = {"word": word_of(entry, age, stale), "age": age, "beat_s": every,
                  "state": entry.get("state") if entry else None,
                  "exit_code": entry.get("exit_code") if entry else None,
                  "step": entry.get("step") if entry else None, "entry": entry}
    return out


def health_of(beat: dict[str, object]) -> dict[str, object]:
    """A derived node's beat as gtrain.remote.nodehealth.health's document, each age moved on by the time since
    node 0 heard it (so ages are as of the read, up to one beat older than the node's own read would say)."""
    entry = beat.get("entry") if isinstance(beat.get("entry"), dict) else {}
    assert isinstance(entry, dict)
    since = _num(beat.get("age")) or 0.0

    def on(v: object) -> float | None:
        n = _num(v)
        return None if n is None else n + since

    ranks = {}
    raw = entry.get("ranks") if isinstance(entry.get("ranks"), dict) else {}
    for r, v in (raw or {}).items():  # type: ignore[union-attr]
        if isinstance(v, list) and len(v) == 3:
            ranks[str(r)] = {"age": on(v[0]), "by": v[1], "step": v[2]}
    return {"agent": entry.get("agent") or "unknown", "heartbeat_age": on(entry.get("hb_age")),
            "started_age": on(entry.get("started_age")), "ranks": ranks, "via": "node 0"}


# ---- the process launch.sh starts ------------------------------------------------------------------------

def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _mine(job_dir: str, parent: int) -> bool:
    """launch.sh ``parent`` is alive and still this node's launcher (a relaunch takes ``pid`` over)."""
    return (_read(os.path.join(job_dir, "pid")) or "").strip() == str(parent) and _alive(parent)


def beat(job_dir: str, job_id: str, rank: str, num_nodes: str, addr: str, port: str, every: str,
         parent: str) -> int:
    me, n, prt, period, ppid = int(rank), int(num_nodes), int(port), max(0.2, float(every)), int(parent)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # launch.sh's to act on; this ends within 0.5 s of launch.sh
    attempt = (_read(os.path.join(job_dir, "attempt")) or "1").strip() or "1"
    with open(os.path.join(job_dir, PID_FILE), "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    info = socket.getaddrinfo(addr, prt, 0, socket.SOCK_DGRAM)[0]
    family, target = info[0], info[4]
    out = socket.socket(family, socket.SOCK_DGRAM)
    agg = Aggregate(job_id, n, period, prt, attempt) if me == 0 else None
    srv = None
    began, seq, sent, wrote = time.time(), 0, 0.0, 0.0
    seen: tuple[float | None, float | None] = (None, None)

    def send() -> None:
        nonlocal seq
        seq += 1
        doc = {"v": VERSION, "job": job_id, "node": me, "attempt": attempt, "seq": seq, "pid": os.getpid(),
               "t": round(time.time(), 3), **summary(job_dir)}
        data = json.dumps(doc, separators=(",", ":")).encode()
        if len(data) > 60000:  # thousands of ranks on one node: their detail stays on the node
            doc["ranks"], doc["exits"] = {}, {}
            data = json.dumps(doc, separators=(",", ":")).encode()
        try:
            out.sendto(data, target)
        except OSError as e:
            sys.stderr.write(f"beat: {e}\n")

    while True:
        now = time.time()
        if not _mine(job_dir, ppid):
            send()  # the last word: the state launch.sh wrote on its way out
            if srv is not None and agg is not None:
                _drain(srv, agg)
                agg.write(job_dir)
            return 0
        marks = (_mtime(os.path.join(job_dir, "state.json")), _mtime(os.path.join(job_dir, "logs")))
        if now - sent >= period or marks != seen:  # a change (started, a rank ended, the end) goes out at once
            send()
            sent, seen = now, marks
        if agg is not None and srv is None and now - began < BIND_TRY_S:
            s = socket.socket(family, socket.SOCK_DGRAM)
            try:
                s.bind(("::" if family == socket.AF_INET6 else "", prt))
                s.setblocking(False)
                srv = s
            except OSError as e:
                s.close()
                if now - began + 0.5 >= BIND_TRY_S:
                    sys.stderr.write(f"beat: cannot bind udp port {prt}: {e}\n")
        if srv is not None and agg is not None:
            _drain(srv, agg)
            if time.time() - wrote >= WRITE_EVERY_S:
                try:
                    agg.write(job_dir)
                except OSError as e:
                    sys.stderr.write(f"beat: {e}\n")
                wrote = time.time()
        wait = max(0.01, min(0.5, sent + period - time.time(), (wrote + WRITE_EVERY_S - time.time())
                             if srv is not None else 0.5))
        if srv is not None:
            import select

            select.select([srv], [], [], wait)
        else:
            time.sleep(wait)


def _drain(srv: socket.socket, agg: Aggregate, most: int = 10000) -> None:
    for _ in range(most):
        try:
            data, sender = srv.recvfrom(65535)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        agg.take(data, str(sender[0]))


# ---- a node's own beat, job or no job (docs/scale.md, "An idle cluster's status") ---------------------------

#: the node's own beat's folder under the node's gtrain root (`down` removes it, and the beat ends with it)
NODE_DIR = ".gtrain-node/beat"


def pulse(folder: str, key: str, rank: str, num_nodes: str, addr: str, port: str, every: str) -> dict[str, object]:
    """Start this node's own beat, detached, and answer ``{"port", "pid"}``: every ``every`` seconds one datagram
    ``{"agent": "idle"}`` (key ``node:<cluster id>``) to node 0 at ``addr``:``port``; node 0 (rank 0, ``port``
    0: a free one, answered) also gathers them into ``folder``/nodes.json as :func:`beat` does for a job. It
    ends when ``folder`` is gone (`down`), when a newer pulse took ``folder``/beat.pid over, or on SIGTERM."""
    me, n, period = int(rank), int(num_nodes), max(0.2, float(every))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = socket.getaddrinfo(addr, int(port) or 1, 0, socket.SOCK_DGRAM)[0]
    srv = None
    if me == 0:
        srv = socket.socket(info[0], socket.SOCK_DGRAM)
        srv.bind(("::" if info[0] == socket.AF_INET6 else "", int(port)))
        srv.setblocking(False)
    prt = srv.getsockname()[1] if srv is not None else int(port)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid:  # the caller: answer once the daemon is on its own
        os.close(wfd)
        child = int(os.read(rfd, 32).decode() or "0")
        os.close(rfd)
        os.waitpid(pid, 0)
        return {"port": prt, "pid": child}
    os.close(rfd)
    os.setsid()
    if os.fork():
        os._exit(0)
    pidfile = os.path.join(folder, PID_FILE)
    with open(pidfile + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)  # an older pulse sees it is not its own, and ends
    os.write(wfd, str(os.getpid()).encode())
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = {srv.fileno()} if srv is not None else set()
    for fd in range(3, 1024):  # nothing of the caller's session stays open (its channel would wait)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    signal.signal(signal.SIGTERM, lambda *_a: os._exit(0))
    out = socket.socket(info[0], socket.SOCK_DGRAM)
    target = (info[4][0], prt, *info[4][2:])
    agg = Aggregate(key, n, period, prt) if srv is not None else None
    seq, sent, wrote = 0, 0.0, 0.0
    while (_read(pidfile) or "").strip() == str(os.getpid()):
        now = time.time()
        if now - sent >= period:
            seq += 1
            doc = {"v": VERSION, "job": key, "node": me, "seq": seq, "pid": os.getpid(), "t": round(now, 3),
                   "agent": "idle", "state": "up"}
            try:
                out.sendto(json.dumps(doc, separators=(",", ":")).encode(), target)
            except OSError:
                pass
            sent = now
        if srv is not None and agg is not None:
            _drain(srv, agg)
            if time.time() - wrote >= WRITE_EVERY_S:
                try:
                    agg.write(folder)
                except OSError:
                    os._exit(0)  # the folder is gone: `down`
                wrote = time.time()
            import select

            select.select([srv], [], [], max(0.01, min(0.5, sent + period - time.time())))
        else:
            time.sleep(max(0.01, min(0.5, sent + period - time.time())))
    os._exit(0)


FUNCS = {"beat": beat, "read": read, "pulse": pulse}

if __name__ == "__main__":
    res = FUNCS[sys.argv[1]](*sys.argv[2:])  # type: ignore[operator]
    if isinstance(res, dict):
        print(json.dumps(res))
    sys.exit(0)
