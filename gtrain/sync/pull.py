"""``gtrain pull``: bring a job's checkpoint_dir back from a node, every file verified by sha256.

Unchanged files (same size and sha256 as the node's) are skipped; a file is fetched into
``DEST/.gtrain-partial/<path>.part`` and renamed into place only once its sha256 matches, so an interrupted
pull resumes from the bytes it already has and never leaves a partial file under a final name. A name
from the node that would land outside DEST (``../x``, absolute) is refused.

torchrun's c10d rendezvous assigns global ranks by its own order, so "rank 0 saves" may happen on any
node: by default every node's checkpoint_dir is listed and merged (a path present on two nodes with
different content comes from the node where it is newest).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import SyncError
from gtrain.remote.fanout import parallel

if TYPE_CHECKING:
    from gtrain.remote.base import Runner

PARTIAL = ".gtrain-partial"


@dataclass
class PullResult:
    dest: str
    nodes: list[int]
    files: int = 0
    transferred: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"dest": self.dest, "nodes": self.nodes, "files": self.files, "transferred": self.transferred,
                "skipped": self.skipped, "resumed": self.resumed, "bytes": self.bytes,
                "seconds": round(self.seconds, 3)}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def safe_rel(name: str) -> str:
    norm = posixpath.normpath(name)
    if not name or name.startswith("/") or norm.startswith("../") or norm == ".." or "\\" in name or "\x00" in name:
        raise SyncError(f"refusing to pull {name!r}: it would land outside the destination")
    return norm


def pull_dir(sources: list[tuple[int, Runner, str]], dest: Path, *, workers: int = 8) -> PullResult:
    """Pull from ``(node, runner, remote_dir)`` sources into ``dest``."""
    t0 = time.monotonic()
    manifests = parallel(lambda src: src[1].call("manifest", src[2], timeout=3600), sources)
    chosen: dict[str, tuple[dict[str, Any], Runner, str, int]] = {}
    for (node, runner, remote_dir), entries in zip(sources, manifests, strict=True):
        for e in entries:
            rel = safe_rel(str(e["path"]))
            old = chosen.get(rel)
            if old is None or (old[0]["sha256"] != e["sha256"] and float(e["mtime"]) > float(old[0]["mtime"])):
                chosen[rel] = (e, runner, remote_dir, node)
    dest.mkdir(parents=True, exist_ok=True)
    res = PullResult(str(dest), sorted({c[3] for c in chosen.values()}), files=len(chosen))
    partial_root = dest / PARTIAL

    def one(item: tuple[str, tuple[dict[str, Any], Runner, str, int]]) -> None:
        rel, (entry, runner, remote_dir, _node) = item
        size, want = int(entry["size"]), str(entry["sha256"])
        final = dest / rel
        if final.is_file() and final.stat().st_size == size and sha256_file(final) == want:
            res.skipped.append(rel)
            return
        part = partial_root / (rel + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        offset = part.stat().st_size if part.exists() else 0
        if offset > size:
            offset = 0
        if offset:
            res.resumed.append(rel)
        for attempt in (1, 2):
            with open(part, "r+b" if offset else "wb") as f:
                f.seek(offset)
                f.truncate()
                got = runner.fetch(f"{remote_dir}/{rel}", f, offset)
            res.bytes += got
            if sha256_file(part) == want:
                break
            if attempt == 2:
                part.unlink(missing_ok=True)
                raise SyncError(f"{rel}: sha256 does not match the node's after two tries "
                                "(is the job still writing it?)", hint="pull again after the job's next save")
            offset = 0  # the resumed bytes were stale: start this file over
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, final)
        mtime = float(entry.get("mtime") or time.time())
        os.utime(final, (mtime, mtime))
        res.transferred.append(rel)

    parallel(one, sorted(chosen.items()), max_workers=workers)
    _prune_empty(partial_root)
    res.transferred.sort()
    res.skipped.sort()
    res.seconds = time.monotonic() - t0
    return res


def _prune_empty(root: Path) -> None:
    if not root.is_dir():
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda x: -len(x[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass
