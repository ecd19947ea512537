"""The run archive (``$GTRAIN_HOME/runs/<cluster id>/``: events, each job's logs, metrics, telemetry; see
``gtrain.runlog.archive``) in the shared state, under ``PREFIX/runs/<cluster id>/``, so that `logs` after
`down`, `plot` and `report` work on a machine that did not follow the job.

Uploaded when a command that changed the cluster ends (the store's ``close``), downloaded when one cluster is
looked up by name. One object per file; what each side last saw of a file (its size, mtime and the object's
version) is kept in the cache's ``meta`` so only what changed moves. Writes are conditional like the rest: on
a lost race the longer of the two files wins (the archive's files grow by appending). Text is scrubbed of
secrets once more on its way out; the parsed-metrics ``.cache/`` stays local.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from gtrain import redact
from gtrain.sync.condput import CondStore, Conflict


class SharedStateStore(Protocol):
    """What of ``gtrain.sharedstate.store.SharedStateStore`` this module uses."""

    home: Path
    remote: CondStore

    @property
    def conn(self) -> Any: ...

    def tx(self) -> Any: ...

_MAX = 64 << 20


def _local(store: SharedStateStore, cid: str) -> Path:
    return store.home / "runs" / cid


def _seen(store: SharedStateStore, cid: str) -> dict[str, Any]:
    row = store.conn.execute("SELECT value FROM meta WHERE key=?", (f"runs:{cid}",)).fetchone()
    return json.loads(row[0]) if row else {}


def _save(store: SharedStateStore, cid: str, seen: dict[str, Any]) -> None:
    with store.tx() as c:
        c.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                  (f"runs:{cid}", json.dumps(seen)))


def _scrub(data: bytes) -> bytes:
    try:
        return redact.scrub(data.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        return data  # binary (TensorBoard event files): what the archive wrote


def _safe(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts) and \
        "\\" not in rel and "\x00" not in rel and parts[0] != ".cache" and ".cache" not in parts


def upload(store: SharedStateStore, cid: str) -> None:
    root = _local(store, cid)
    if not root.is_dir():
        return
    seen = _seen(store, cid)
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or path.is_symlink() or not _safe(rel):
            continue
        st = path.stat()
        if st.st_size > _MAX:
            continue
        was = seen.get(rel) or {}
        if was.get("size") == st.st_size and was.get("mtime") == st.st_mtime_ns:
            continue
        data = _scrub(path.read_bytes())
        key = f"runs/{cid}/{rel}"
        try:
            version = store.remote.put(key, data, match=was.get("version"), absent=not was.get("version"))
        except Conflict:
            theirs = store.remote.get(key)
            if theirs is not None and len(theirs.data) >= len(data):
                _write(path, theirs.data)
                st = path.stat()
                version = theirs.version
            else:
                version = store.remote.put(key, data, match=theirs.version if theirs else None,
                                           absent=theirs is None)
        seen[rel] = {"size": st.st_size, "mtime": st.st_mtime_ns, "version": version}
    _save(store, cid, seen)


def download(store: SharedStateStore, cid: str) -> None:
    listed = store.remote.list(f"runs/{cid}/")
    if not listed:
        return
    root = _local(store, cid)
    seen = _seen(store, cid)
    for rel_key, version in sorted(listed.items()):
        rel = rel_key[len(f"runs/{cid}/"):]
        if not _safe(rel) or (seen.get(rel) or {}).get("version") == version:
            continue
        got = store.remote.get(rel_key)
        if got is None or len(got.data) > _MAX:
            continue
        path = root / rel
        _write(path, got.data)
        st = path.stat()
        seen[rel] = {"size": st.st_size, "mtime": st.st_mtime_ns, "version": got.version}
    _save(store, cid, seen)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.gtrain-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
