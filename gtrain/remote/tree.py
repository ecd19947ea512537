"""Tree fan-out: above a threshold of nodes, one shell command per node goes through relays.

ClusterShell's gateway mode (https://clustershell.readthedocs.io/en/latest/guide/taskmgnt.html, "the
propagation tree"): this machine reaches ~sqrt(N) relays -- nodes of the cluster, one per contiguous block of
ranks -- and each runs :mod:`gtrain.remote.relay` (stdlib only, its source sent on stdin like
:mod:`gtrain.remote.nodeside`), which runs the command on each node of its block with its own OpenSSH client
over the cluster's network and streams back one result per node as it gets it. This machine holds sqrt(N)
SSH connections and does sqrt(N) handshakes, not N.

* Authentication: this machine's SSH agent is forwarded to the relay's session only. A node reached with an
  ``identity_file`` gets a private ``ssh-agent`` started here (``ssh-agent -D -a SOCK``, the key added with
  ``ssh-add``; it ends with this process); no key is written to a node. Without an identity file,
  ``SSH_AUTH_SOCK`` is used; with neither, the flat fan-out is used.
* Host keys: each node's pinned keys go to its relay (public keys), checked with ``StrictHostKeyChecking``.
* A relay that dies, or whose connection drops, mid-command: every node of its block without a result is
  reached directly from here, and reported unreachable (``NodeResult.error``) if that fails too -- never
  skipped. A command that must not run twice (a job's start) is given a ``once`` marker: a directory made
  atomically on the node before the command runs, so a retry after a relay died finds it and does nothing;
  such a command is also retried from here when the relay's ``ssh`` to the node timed out.
* Threshold: ``GTRAIN_TREE_THRESHOLD`` (default 64) nodes; at or below it, or when a node is not an SSH node
  reachable this way (a proxy command), the flat :func:`gtrain.remote.fanout.parallel`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gtrain.errors import ConfigError, GtrainError
from gtrain.remote.base import Runner, nodeside_source
from gtrain.remote.fanout import parallel

ENV_THRESHOLD = "GTRAIN_TREE_THRESHOLD"
DEFAULT_THRESHOLD = 64
#: nodes each relay works on at once (at most; the relay also keeps to 8 per CPU of its own)
RELAY_WINDOW = 32
#: printed by a ``once`` command that found its marker: it had already run
ONCE_SENTINEL = "\x1egtrain-once-already\n"


@dataclass
class NodeResult:
    """One node's outcome: ``rc`` with its output, or ``error`` (the node could not be reached)."""

    rc: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    via: str = "direct"
    already: bool = False  # a ``once`` command whose marker was there: it had run before


def tree_threshold(env: str | None = None) -> int:
    raw = os.environ.get(ENV_THRESHOLD) if env is None else env
    if raw is None or not raw.strip():
        return DEFAULT_THRESHOLD
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 1:
        raise ConfigError(f"{ENV_THRESHOLD}={raw!r} is not a positive integer",
                          hint=f"set {ENV_THRESHOLD} to the node count above which relays are used (e.g. 64)")
    return n


def pick_relays(n: int) -> list[list[int]]:
    """Blocks of node indices, one per relay; each block's first node is its relay: ceil(sqrt(n)) blocks of
    contiguous ranks (neighbouring ranks are often neighbouring machines)."""
    if n <= 0:
        return []
    k = max(1, math.ceil(math.sqrt(n)))
    bounds = [round(j * n / k) for j in range(k + 1)]
    return [list(range(bounds[j], bounds[j + 1])) for j in range(k) if bounds[j] < bounds[j + 1]]


def once_wrap(cmd: str, marker: str) -> str:
    """``cmd`` run at most once on a node: ``mkdir MARKER`` is atomic, a second try prints the sentinel."""
    m = shlex.quote(marker)
    return (f"mkdir -p -- \"$(dirname -- {m})\" && {{ mkdir -- {m} 2>/dev/null || "
            "{ printf '\\036gtrain-once-already\\n'; exit 0; }; }\n" + cmd)


def detached(cmd: str, with_stdin: bool) -> str:
    """The command that starts ``cmd`` in its own session and returns (what ``Runner.start_detached`` runs)."""
    q = shlex.quote(cmd)
    return f"cat | setsid -f bash -c {q} >/dev/null 2>&1" if with_stdin else \
        f"setsid -f bash -c {q} </dev/null >/dev/null 2>&1"


def python_call(runner: Runner, func: str, *args: str) -> tuple[str, bytes]:
    """The command and stdin of ``runner.call(func, *args)`` (nodeside's function, its JSON on stdout)."""
    return " ".join([shlex.quote(runner.python), "-", *map(shlex.quote, [func, *args])]), nodeside_source().encode()


# ---- the agent the relays use -------------------------------------------------------------------------

_agent_lock = threading.Lock()
_agents: dict[str | None, str | None] = {}
_agent_procs: list[tuple[subprocess.Popen[bytes], str]] = []


def _stop_agents() -> None:
    for p, folder in _agent_procs:
        with contextlib.suppress(OSError):
            p.terminate()
        with contextlib.suppress(Exception):
            p.wait(timeout=5)
        shutil.rmtree(folder, ignore_errors=True)
    _agent_procs.clear()
    _agents.clear()


atexit.register(_stop_agents)


def agent_for(identity_file: str | None) -> str | None:
    """The agent socket that can sign for ``identity_file`` (None: the user's agent), or None if there is
    none (the caller falls back to the flat fan-out)."""
    with _agent_lock:
        if identity_file in _agents:
            return _agents[identity_file]
        sock: str | None = None
        if identity_file is None:
            sock = os.environ.get("SSH_AUTH_SOCK") or None
        elif shutil.which("ssh-agent") and shutil.which("ssh-add"):
            d = tempfile.mkdtemp(prefix="gtrain-agent-")
            os.chmod(d, 0o700)
            path = os.path.join(d, "agent.sock")
            proc = subprocess.Popen(["ssh-agent", "-D", "-a", path], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            _agent_procs.append((proc, d))
            for _ in range(200):
                if os.path.exists(path) or proc.poll() is not None:
                    break
                threading.Event().wait(0.01)
            env = {**os.environ, "SSH_AUTH_SOCK": path}
            added = subprocess.run(["ssh-add", "-q", os.path.expanduser(identity_file)], env=env,
                                   stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=30)
            sock = path if added.returncode == 0 else None  # a key with a passphrase: no tree
        _agents[identity_file] = sock
        return sock


# ---- running -------------------------------------------------------------------------------------------


def _relayable(runners: Sequence[Runner]) -> bool:
    from gtrain.remote.ssh.runner import SSHRunner

    return all(isinstance(r, SSHRunner) and not r.target.proxy_command for r in runners)


def _direct(r: Runner, cmd: str, stdin: bytes | None, timeout: float | None, via: str = "direct") -> NodeResult:
    try:
        res = r.run(cmd, stdin=stdin, timeout=timeout, check=False)
    except GtrainError as e:
        return NodeResult(None, error=e.message, via=via)
    return _finish(NodeResult(res.rc, res.stdout, res.stderr, via=via))


def _finish(res: NodeResult) -> NodeResult:
    if res.stdout.startswith(ONCE_SENTINEL):
        res.stdout, res.already = res.stdout[len(ONCE_SENTINEL):], True
    return res


def run_on_nodes(runners: Sequence[Runner], cmds: Sequence[str], *, stdin: Sequence[bytes | None] | None = None,
                 timeout: float | None = None, once: Sequence[str | None] | None = None,
                 threshold: int | None = None) -> list[NodeResult]:
    """Run ``cmds[i]`` (a bash command, in the node's root) on ``runners[i]`` for every i; results in order.
    Flat up to the threshold, through relays above it (see the module's docstring)."""
    n = len(runners)
    stdin = list(stdin) if stdin is not None else [None] * n
    full = [once_wrap(c, m) if m else c for c, m in zip(cmds, once or [None] * n, strict=True)]
    limit = tree_threshold() if threshold is None else threshold
    agent = None
    if n > limit and _relayable(runners):
        idents = {r.target.identity_file for r in runners}  # type: ignore[attr-defined]
        agent = agent_for(next(iter(idents))) if len(idents) == 1 else None
    if agent is None:
        return parallel(lambda i: _direct(runners[i], full[i], stdin[i], timeout), list(range(n)))
    return _tree(runners, full, stdin, timeout, agent, retry_timeouts=once is not None)


def _request(runners: Sequence[Runner], block: list[int], cmds: Sequence[str], stdin: Sequence[bytes | None],
             timeout: float | None) -> bytes:
    from gtrain.remote.ssh.hostkeys import known_hosts_name, pinned_map

    keys = pinned_map()
    blobs: list[bytes] = []
    index: dict[bytes, int] = {}
    targets = []
    for i in block:
        r: Any = runners[i]
        data = stdin[i]
        b = None
        if data is not None:
            if data not in index:
                index[data] = len(blobs)
                blobs.append(data)
            b = index[data]
        pinned = keys.get(known_hosts_name(r.target.host, r.target.port), [])
        targets.append({"i": i, "host": r.address, "port": r.target.port, "user": r.target.user,
                        "keys": [f"{t} {k}" for t, k in pinned], "cmd": r._wrap(cmds[i], True), "stdin": b})
    head = {"targets": targets, "blobs": [len(b) for b in blobs], "window": RELAY_WINDOW,
            "timeout": timeout or 0, "connect_timeout": 10}
    return json.dumps(head).encode() + b"\n" + b"".join(blobs)


def relay_source() -> bytes:
    from gtrain.remote import relay

    with open(relay.__file__, "rb") as f:
        return f.read()


def _tree(runners: Sequence[Runner], cmds: Sequence[str], stdin: Sequence[bytes | None], timeout: float | None,
          agent: str, retry_timeouts: bool = False) -> list[NodeResult]:
    results: list[NodeResult | None] = [None] * len(runners)
    from gtrain.remote.ssh.connect import _POOL

    src = relay_source()
    blocks = pick_relays(len(runners))
    failures: dict[int, str] = {}

    def own(i: int) -> None:  # a relay's own node, from here, on the connection its relay session rides on
        results[i] = _direct(runners[i], cmds[i], stdin[i], timeout)

    def one_block(block: list[int]) -> None:
        relay: Any = runners[block[0]]
        rest = block[1:]
        via = f"relay {relay.label}"

        def on_line(text: str) -> None:
            try:
                doc = json.loads(text)
            except ValueError:
                return
            if not isinstance(doc, dict) or "i" not in doc or doc["i"] not in rest:
                return
            i = int(doc["i"])
            if "unreached" in doc:
                failures[i] = f"{via} could not reach it: {doc['unreached']}"
            elif doc.get("timed_out") is not None:
                if retry_timeouts:  # a `once` command: a second try cannot run it twice
                    failures[i] = f"{via} timed out after {doc['timed_out']}s"
                else:
                    results[i] = NodeResult(None, error=f"timed out after {doc['timed_out']}s ({via})", via=via)
            else:
                results[i] = _finish(NodeResult(int(doc["rc"]), str(doc.get("out", "")), str(doc.get("err", "")),
                                                via=via))
                with _POOL._lock:  # counted for GTRAIN_SSH_STATS (the scale bench)
                    _POOL.relayed += 1

        launcher = (f"{shlex.quote(relay.python)} -c "
                    + shlex.quote(f"import sys;exec(compile(sys.stdin.buffer.read({len(src)}),'gtrain-relay','exec'))"))
        why = "ended without results"
        try:
            rc = relay.relay(launcher, on_line, stdin=src + _request(runners, rest, cmds, stdin, timeout),
                             agent_sock=agent, timeout=None if not timeout else timeout * 2 + 30)
            why = f"ended (exit {rc}) without results"
        except GtrainError as e:
            why = f"failed: {e.message}"
        for i in rest:
            if results[i] is None and i not in failures:
                failures[i] = f"{via} {why}"

    tasks: list[tuple[Any, Any]] = [(own, b[0]) for b in blocks] + [(one_block, b) for b in blocks if len(b) > 1]
    parallel(lambda t: t[0](t[1]), tasks)
    # every node the relays did not answer for: directly from here, else reported
    left = [i for i in range(len(runners)) if results[i] is None]
    if left:
        def direct(i: int) -> NodeResult:
            res = _direct(runners[i], cmds[i], stdin[i], timeout, via=f"direct ({failures.get(i, 'no relay')})")
            if res.error is not None:
                res.error = f"{res.error} (and {failures.get(i, 'no relay')})"
            return res

        for i, res in zip(left, parallel(direct, left), strict=True):
            results[i] = res
    return [r for r in results if r is not None]


def over_ssh(runners: Sequence[Runner]) -> bool:
    """Whether every runner is an SSH node (a batched command is one round trip each; for a local runner the
    in-process call is cheaper)."""
    from gtrain.remote.ssh.runner import SSHRunner

    return bool(runners) and all(isinstance(r, SSHRunner) for r in runners)


def use_tree(runners: Sequence[Runner], threshold: int | None = None) -> bool:
    """Whether :func:`run_on_nodes` would go through relays for these runners (callers that have a cheaper
    flat path of their own, such as a local runner's in-process call, keep it otherwise)."""
    limit = tree_threshold() if threshold is None else threshold
    return len(runners) > limit and _relayable(runners)


def call_all(runners: Sequence[Runner], func: str, args: Sequence[Sequence[str]], *, timeout: float | None = 120,
             threshold: int | None = None) -> list[Any]:
    """``runners[i].call(func, *args[i])`` for every node, through relays above the threshold: each node's
    JSON result, or a :class:`~gtrain.errors.RemoteError` (not raised) for a node that failed or was not
    reached."""
    from gtrain.errors import RemoteCommandError, RemoteError

    calls = [python_call(r, func, *a) for r, a in zip(runners, args, strict=True)]
    res = run_on_nodes(runners, [c for c, _ in calls], stdin=[s for _, s in calls], timeout=timeout,
                       threshold=threshold)
    out: list[Any] = []
    for r, got in zip(runners, res, strict=True):
        if got.error is not None or got.rc is None:
            out.append(RemoteError(f"{r.label}: {got.error or 'timed out'}"))
        elif got.rc != 0:
            out.append(RemoteCommandError(r.label, f"{r.python} - {func}", got.rc, got.stderr[-2000:]))
        else:
            try:
                out.append(json.loads(got.stdout))
            except ValueError:
                out.append(RemoteError(f"{r.label}: {func} answered no JSON: {got.stdout[:200]!r}"))
    return out


def exec_each(runners: Sequence[Runner], picked: Sequence[int], cmd_of: Callable[[int], str],
              on_text: Callable[[int, str], None], warn: Callable[[int, str], None]) -> list[int]:
    """``gtrain exec``'s fan-out: up to the threshold each picked node streams its lines as they come; above
    it, through relays, each node's lines (stdout, then stderr) once it is done. Returns each node's exit
    code: 255 for a node not reached (ssh's own code for that), a gtrain error's code for one that did not
    run the command."""
    from gtrain.errors import RemoteError

    rs = [runners[i] for i in picked]
    if not use_tree(rs):
        def one(i: int) -> int:
            try:
                return runners[i].stream(cmd_of(i), lambda text: on_text(i, text))
            except GtrainError as e:  # the command did not run: the code `gtrain ssh` gives for the same node
                warn(i, e.message)
                return 255 if isinstance(e, RemoteError) else e.exit_code

        return parallel(one, list(picked))
    codes = []
    for i, res in zip(picked, run_on_nodes(rs, [cmd_of(i) for i in picked]), strict=True):
        for text in (res.stdout + res.stderr).splitlines():
            on_text(i, text)
        if res.error is not None:
            warn(i, res.error)
        codes.append(255 if res.rc is None else res.rc)
    return codes
