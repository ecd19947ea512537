"""The relay: runs ON a node of the cluster (stdlib only) and runs one shell command on each of its share of
the cluster's other nodes with the node's own OpenSSH client, over the cluster's network, returning each
node's result as soon as it has it. The laptop side is :mod:`gtrain.remote.tree` (ClusterShell's gateway
mode: https://clustershell.readthedocs.io/en/latest/guide/taskmgnt.html).

Shipped like :mod:`gtrain.remote.nodeside`: its source is sent on stdin and run by
``python3 -c 'exec(compile(sys.stdin.buffer.read(LEN), ...))'``; what follows on stdin is the request:

* one JSON line ``{"targets": [...], "blobs": [LEN, ...], "window": W, "timeout": S, "connect_timeout": S}``,
  each target ``{"i": NODE, "host": ADDR, "port": P, "user": U, "keys": ["TYPE B64", ...], "cmd": CMD,
  "stdin": BLOB_INDEX or null}``;
* then the blobs, back to back (a command's stdin: the node-side script, a job's secrets -- kept in memory and
  handed to ``ssh`` through a pipe, never written to disk).

Output, one JSON line per node as it finishes: ``{"i": NODE, "rc": RC, "out": TEXT, "err": TEXT}``, or
``{"i": NODE, "unreached": WHY}`` when ``ssh`` itself could not get there (the command did not run); then
``{"done": true}``. The laptop treats every node without a line (this relay died, its connection dropped) as
not done and reaches it directly or reports it -- never skips it.

Authentication: the laptop forwards its SSH agent to this session only (``SSH_AUTH_SOCK`` here); no key is
ever written to a node. Host keys: each target's pinned keys (from the laptop's known_hosts) in a private
temporary file under an alias, with ``StrictHostKeyChecking yes``: a node whose key differs is refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading

#: what OpenSSH prints when it, not the remote command, failed (exit 255): the command never ran
_SSH_FAILED = re.compile(
    r"^(ssh: |kex_exchange_identification|Connection (closed|reset|timed out|refused)|Permission denied|"
    r"Host key verification failed|No route to host|Could not resolve|banner exchange)", re.M)


def _alias(i: int) -> str:
    return f"gtrain-node-{i}"


def _argv(t: dict, known: str, connect_timeout: float) -> list[str]:  # type: ignore[type-arg]
    return ["ssh", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", f"HostKeyAlias={_alias(t['i'])}", "-o", f"ConnectTimeout={int(max(1, connect_timeout))}",
            "-o", "LogLevel=ERROR", "-o", "ForwardAgent=no", "-o", "ServerAliveInterval=15",
            "-o", "ControlMaster=no", "-o", "ControlPath=none", "-p", str(int(t["port"])), "-l", str(t["user"]),
            "--", str(t["host"]), str(t["cmd"])]


def _one(t: dict, blobs: list[bytes], known: str, timeout: float, connect_timeout: float) -> dict:  # type: ignore[type-arg]
    data = blobs[t["stdin"]] if t.get("stdin") is not None else b""
    try:
        p = subprocess.run(_argv(t, known, connect_timeout), input=data, capture_output=True,
                           timeout=timeout if timeout > 0 else None, check=False)
    except FileNotFoundError:
        return {"i": t["i"], "unreached": "no ssh client on the relay"}
    except subprocess.TimeoutExpired:
        return {"i": t["i"], "rc": None, "out": "", "err": "", "timed_out": timeout}
    err = p.stderr.decode(errors="replace")
    if p.returncode == 255 and _SSH_FAILED.search(err):
        return {"i": t["i"], "unreached": err.strip()[-300:]}
    return {"i": t["i"], "rc": p.returncode, "out": p.stdout.decode(errors="replace"), "err": err}


def serve(inp: object, out: object) -> None:
    """Read a request from ``inp`` (binary), write results to ``out`` (text), one line each."""
    req = json.loads(inp.readline())  # type: ignore[attr-defined]
    blobs = [inp.read(int(n)) for n in req.get("blobs", [])]  # type: ignore[attr-defined]
    targets = list(req["targets"])
    timeout, connect_timeout = float(req.get("timeout") or 0), float(req.get("connect_timeout") or 10)
    lock = threading.Lock()
    fd, known = tempfile.mkstemp(prefix="gtrain-relay-", suffix=".known_hosts")
    try:
        with os.fdopen(fd, "w") as f:
            for t in targets:
                for key in t.get("keys", []):
                    f.write(f"{_alias(t['i'])} {key}\n")
        todo = iter(targets)

        def worker() -> None:
            while True:
                with lock:
                    t = next(todo, None)
                if t is None:
                    return
                try:
                    res = _one(t, blobs, known, timeout, connect_timeout)
                except Exception as e:  # noqa: BLE001 - one node's surprise is that node's result
                    res = {"i": t["i"], "unreached": f"relay error: {e}"}
                line = json.dumps(res)
                with lock:
                    out.write(line + "\n")  # type: ignore[attr-defined]
                    out.flush()  # type: ignore[attr-defined]

        threads = [threading.Thread(target=worker, daemon=True)
                   for _ in range(max(1, min(int(req.get("window") or 16), 8 * (os.cpu_count() or 1), len(targets))))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out.write(json.dumps({"done": True}) + "\n")  # type: ignore[attr-defined]
        out.flush()  # type: ignore[attr-defined]
    finally:
        os.unlink(known)


if __name__ == "__main__" or __name__ == "gtrain-relay":
    serve(sys.stdin.buffer, sys.stdout)
