"""The node's side of the workdir bundle, stdlib only (a node has python3, not gtrain).

The workdir travels as one tar named by its sha256 (:mod:`gtrain.jobs.workdir`). On a node it lives in
``ROOT/.gtrain-bundles/<sha256>.tar`` (only the newest is kept) and is unpacked into the node's workdir as
``put_files`` would copy it: files whose size and mtime already match are left alone, nothing is deleted.

Run as ``python3 - FUNC ARGS...`` (this source on stdin; one JSON document out):

    have   ROOT SHA                          {"have": bool}: the bundle is on this node, verified
    fetch  JSON                              fetch (or reuse), verify, unpack: see :func:`fetch`
    serve  DIR ADDR TOKEN TTL                a short-lived HTTP server of DIR's bundles on ADDR (node 0):
                                             {"port": P, "pid": PID}; it ends after TTL s or on ``stop``
    stop   DIR TOKEN                         end that server (its pid file names it)

and, for a store, as ``python3 -c SOURCE+STORE_MAIN PYZ JSON`` inside ``data.sh`` (the job's env and secrets:
the node's own credentials), where ``PYZ`` is the sync engine's zip (:mod:`gtrain.sync.bundle`) and
``STORE_MAIN`` (:mod:`gtrain.jobs.workdir`) reads the store through it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tarfile
import time
from collections.abc import Callable
from typing import NoReturn

BUNDLES = ".gtrain-bundles"
#: node 0's copy of the laptop's upload, kept under a fixed name: the next upload is an rsync delta against it
UPLOAD = "upload.tar"
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


def _dir(root: str) -> str:
    return os.path.join(root, BUNDLES)


def _sha_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_sha(sha: str) -> str:
    if not _SHA_RE.match(sha):
        raise ValueError(f"not a sha256: {sha!r}")
    return sha


def have(root: str, sha: str) -> dict[str, object]:
    """Whether ``ROOT/.gtrain-bundles/<sha>.tar`` is here and was verified (its ``.ok`` marker)."""
    d = _dir(root)
    _check_sha(sha)
    return {"have": os.path.isfile(os.path.join(d, f"{sha}.tar")) and os.path.isfile(os.path.join(d, f"{sha}.ok"))}


def _verified(d: str, sha: str) -> bool:
    """The tar is here and its content is ``sha``: a marker from an earlier check, or hashed now (a bundle the
    laptop just pushed). A tar whose content differs is removed."""
    tar, ok = os.path.join(d, f"{sha}.tar"), os.path.join(d, f"{sha}.ok")
    if not os.path.isfile(tar):
        return False
    if os.path.isfile(ok):
        return True
    if _sha_file(tar) == sha:
        with open(ok, "w") as f:
            f.write(f"{time.time()}\n")
        return True
    os.unlink(tar)
    return False


def _keep_only(d: str, sha: str) -> None:
    for name in os.listdir(d):
        if not name.startswith(sha) and name != UPLOAD and name.endswith((".tar", ".ok", ".part")):
            try:
                os.unlink(os.path.join(d, name))
            except OSError:
                pass


def _download_http(url: str, part: str, timeout: float) -> int:
    import urllib.request

    n = 0
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as f:  # noqa: S310 - http only
        while chunk := resp.read(_CHUNK):
            f.write(chunk)
            n += len(chunk)
    return n


def _safe_members(tf: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Regular files and folders with relative paths that stay inside; anything else refuses the bundle."""
    out = []
    for m in tf.getmembers():
        parts = m.name.split("/")
        if m.name.startswith("/") or any(p in ("", ".", "..") for p in parts) or not (m.isfile() or m.isdir()):
            raise ValueError(f"bundle member {m.name!r} refused (absolute, '..', or not a plain file)")
        out.append(m)
    return out


def unpack(tar: str, workdir: str) -> dict[str, int]:
    """Unpack into ``workdir`` like ``put_files``: a file whose size and mtime match stays; others are written
    to a temp file and renamed over; nothing is deleted. A path that crosses a link on the node is refused."""
    written = same = 0
    real = os.path.realpath(workdir)
    os.makedirs(workdir, exist_ok=True)
    with tarfile.open(tar, "r:") as tf:
        for m in _safe_members(tf):
            dst = os.path.join(workdir, m.name)
            parent = os.path.dirname(dst)
            os.makedirs(parent, exist_ok=True)
            if not os.path.realpath(parent).startswith(real + os.sep) and os.path.realpath(parent) != real:
                raise ValueError(f"bundle member {m.name!r}: its folder is a link out of the workdir on this node")
            if m.isdir():
                os.makedirs(dst, exist_ok=True)
                continue
            try:
                st = os.lstat(dst)
                if not os.path.islink(dst) and st.st_size == m.size and int(st.st_mtime) == int(m.mtime):
                    same += 1
                    continue
            except FileNotFoundError:
                pass
            src = tf.extractfile(m)
            assert src is not None
            tmp = os.path.join(parent, f".{os.path.basename(dst)}.gtrain-tmp")
            with open(tmp, "wb") as f:
                shutil.copyfileobj(src, f, _CHUNK)
            os.chmod(tmp, m.mode & 0o777)
            os.utime(tmp, (m.mtime, m.mtime))
            os.replace(tmp, dst)
            written += 1
    return {"written": written, "unchanged": same}


def fetch(doc_json: str, store_download: Callable[[str, str, str], int] | None = None) -> dict[str, object]:
    """``{"root", "workdir", "sha", "sources": [{"kind": "http", "url"} | {"kind": "store", "url", "key"}],
    "tries", "timeout"}``: the bundle from the first source that gives the right bytes (each tried ``tries``
    times, 1 s apart; a download whose sha256 differs is refused and removed), then unpacked. A bundle already here and
    verified is not fetched again. ``{"ok": true, "source", "bytes", "seconds", "written", "unchanged",
    "cached"}`` or ``{"ok": false, "error", "corrupt"}`` (``corrupt``: some source gave wrong bytes).
    ``store_download(url, key, dest) -> bytes``: how a store source is read (the caller's: the sync engine)."""
    doc = json.loads(doc_json)
    sha, root, workdir = _check_sha(doc["sha"]), doc["root"], doc["workdir"]
    d = _dir(root)
    os.makedirs(d, mode=0o700, exist_ok=True)
    t0 = time.monotonic()
    tar = os.path.join(d, f"{sha}.tar")
    errors: list[str] = []
    corrupt = False
    source, got, cached = "", 0, _verified(d, sha)
    if cached:
        source = "cached"
    elif doc.get("adopt"):  # node 0: what the laptop just sent as UPLOAD, taken if its sha256 is right
        up = os.path.join(d, UPLOAD)
        if os.path.isfile(up) and _sha_file(up) == sha:
            _rm(tar)
            os.link(up, tar)
            with open(os.path.join(d, f"{sha}.ok"), "w") as f:
                f.write(f"{time.time()}\n")
            source, got = "upload", os.path.getsize(tar)
        else:
            corrupt = os.path.isfile(up)
            errors.append(f"{UPLOAD}: " + ("sha256 mismatch: refused" if corrupt else "missing"))
            if corrupt:  # rsync's quick check (size and mtime) may have kept an older bundle: the retry sends it whole
                _rm(up)
    for src in [] if source else doc.get("sources", []):
        where = src["url"] if src["kind"] == "http" else f"{src['url'].rstrip('/')}/{src['key']}"
        where = where.split("/", 3)[2] if src["kind"] == "http" else where  # host:port only (no token)
        for attempt in range(int(doc.get("tries", 2))):
            if attempt:
                time.sleep(1)
            part = os.path.join(d, f"{sha}.{os.getpid()}.part")
            try:
                if src["kind"] == "http":
                    got = _download_http(src["url"], part, float(doc.get("timeout", 60)))
                elif store_download is not None:
                    got = store_download(src["url"], src["key"], part)
                else:
                    raise RuntimeError("no store client on this node")
            except Exception as e:  # noqa: BLE001 - reported: the laptop pushes instead
                msg = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
                errors.append(f"{where}: {msg}"[:300])
                _rm(part)
                if "sha256" in str(msg).lower() or "checksum" in str(msg).lower():
                    corrupt = True
                continue  # once more (a busy network: a neighbour not resolved in time), then the next source
            if _sha_file(part) != sha:
                corrupt = True
                errors.append(f"{where}: sha256 mismatch ({got} bytes): refused")
                _rm(part)
                continue
            os.replace(part, tar)
            with open(os.path.join(d, f"{sha}.ok"), "w") as f:
                f.write(f"{time.time()}\n")
            source = where
            break
        if source:
            break
    if not source:
        return {"ok": False, "error": "; ".join(errors) or "no source", "corrupt": corrupt}
    _keep_only(d, sha)
    try:
        res = unpack(tar, workdir)
    except (OSError, ValueError, tarfile.TarError) as e:
        return {"ok": False, "error": f"unpack: {e}", "corrupt": False}
    return {"ok": True, "source": source, "bytes": got, "seconds": round(time.monotonic() - t0, 3),
            "cached": cached, **res}


def _rm(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def serve(directory: str, addr: str, token: str, ttl: str = "600") -> dict[str, object]:
    """Serve ``GET /TOKEN/<sha>.tar`` of ``directory``'s verified bundles on ``addr`` (a free port) from a
    detached child that ends after ``ttl`` seconds or on SIGTERM. Returns its port and pid."""
    import http.server

    if not re.match(r"^[A-Za-z0-9_-]{16,}$", token):
        raise ValueError("token refused")
    directory = os.path.realpath(directory)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            m = re.match(r"^/([A-Za-z0-9_-]+)/([0-9a-f]{64})\.tar$", self.path)
            if m is None or m.group(1) != token or not os.path.isfile(os.path.join(directory, f"{m.group(2)}.ok")):
                self.send_error(404)
                return
            path = os.path.join(directory, f"{m.group(2)}.tar")
            try:
                f = open(path, "rb")  # noqa: SIM115 - closed below
            except OSError:
                self.send_error(404)
                return
            with f:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-tar")
                self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
                self.end_headers()
                self.wfile.flush()
                try:  # the kernel's sendfile: no copy through this process, however many nodes fetch at once
                    self.connection.sendfile(f)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        def log_message(self, *_a: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    srv = Server((addr, 0), Handler)
    port = srv.server_address[1]
    pidfile = os.path.join(directory, f"serve-{token}.pid")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid:  # the caller: wait for the child to be detached, then answer
        os.close(wfd)
        srv.server_close()
        child = int(os.read(rfd, 32).decode() or "0")
        os.close(rfd)
        os.waitpid(pid, 0)
        return {"port": port, "pid": child}
    os.close(rfd)
    os.setsid()
    if os.fork():  # the grandchild serves: reparented, so the caller's session can end
        os._exit(0)
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    os.write(wfd, str(os.getpid()).encode())
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = srv.fileno()  # nothing else of the caller's stays open here (an SSH channel's pipes would wait)
    os.closerange(3, keep)
    os.closerange(keep + 1, 65536)

    def end(*_a: object) -> NoReturn:
        _rm(pidfile)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGALRM, end)
    signal.alarm(max(1, int(float(ttl))))
    srv.serve_forever(poll_interval=0.5)
    end()


def stop(directory: str, token: str) -> dict[str, object]:
    """End the server ``serve`` started in ``directory`` for ``token`` (its pid file names it)."""
    if not re.match(r"^[A-Za-z0-9_-]{16,}$", token):
        raise ValueError("token refused")
    pid = (_read_text(os.path.join(directory, f"serve-{token}.pid")) or "").strip()
    if not pid.isdigit():
        return {"stopped": False}
    try:
        os.kill(int(pid), signal.SIGTERM)
    except ProcessLookupError:
        return {"stopped": False}
    return {"stopped": True}


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


FUNCS = {"have": have, "fetch": fetch, "serve": serve, "stop": stop}

# python3 -c SOURCE+STORE_MAIN PYZ JSON (gtrain.jobs.workdir) runs the caller's main after this source instead
if __name__ == "__main__" and not sys.argv[1].endswith(".pyz"):
    print(json.dumps(FUNCS[sys.argv[1]](*sys.argv[2:])))  # type: ignore[operator]
