"""The checkpoint store: layout, manifests, upload, listing and restore. Stdlib + gtrain's sync engine only
(it runs on the nodes, shipped in ``gtrain-ckpt.pyz``, and in the CLI for ``pull`` / ``down``).

Layout under ``job.checkpoint_store`` (``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``az://container/prefix``)::

    <store>/<cluster>/<run-id>/node-K/<name>[/<file>...]   a checkpoint as node K wrote it under checkpoint_dir
    <store>/<cluster>/<run-id>/node-K/.gtrain/<name>.json  its manifest, written LAST: {name, node, files:
                                                           [{path, size, sha256, mtime}], mtime, written_at,
                                                           attempt}
    <store>/<cluster>/<run-id>/.gtrain-fresh.json          ``--fresh``: {since}; checkpoints written before
                                                           are not the run's any more
    <store>/<cluster>/<run-id>/.probe-node-K               written and deleted by the launch's write probe

(Jobs launched before runs were keyed so used ``<store>/<job-id>/``; :class:`Store` reads either: its key is
given.)

A checkpoint is a top-level entry of checkpoint_dir (a file ``step-10.pt`` or a folder ``step-10/``). It is
COMPLETE in the store when some node's manifest names it, every node that has objects under it has its
manifest too (a node still uploading has objects but no manifest yet), and, for a step folder, every node
that wrote the previous step folder wrote this one (a node slower to write its ranks' part has not yet: the
step is partial). Restore puts the union of every node's files of the newest complete checkpoint on each
node: what only rank 0's node wrote must reach every node (or, ``GTRAIN_CHECKPOINT_RESTORE=subset``, the files
of a DCP step that node's ranks read: :mod:`gtrain.checkpoints.subset`). A POINTER (a small file beside the step
folders naming one of them: DeepSpeed's ``latest``) is no checkpoint of its own: after a restore it names the step
restored.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gtrain.checkpoints.sharded import missing, names_every_rank
from gtrain.errors import SyncError
from gtrain.sync.local import hash_file, tmp_path, unlink_tmp
from gtrain.sync.model import Backend, RemoteObject, RemoteURL

META_DIR = ".gtrain"
FRESH = ".gtrain-fresh.json"
POINTER_MAX = 256  # bytes: a pointer file (DeepSpeed's ``latest``) holds a step folder's name, no more


class LinkInDest(SyncError):
    """A symlink under the destination a restore would write through: the pull stops (never a refused
    checkpoint; the store is fine, the destination is not)."""


def _no_link(dest: Path, rel: str) -> None:
    p = dest
    for part in rel.split("/"):
        p = p / part
        if os.path.islink(p):
            raise LinkInDest(f"refusing to pull into {dest}: {p} is a symlink (to {os.readlink(p)!r})",
                             hint="gtrain never writes through a symlink under the destination: remove it, "
                                  "or pull --to another folder")


def _noop(_n: int) -> None:
    return None


@dataclass
class Checkpoint:
    """One checkpoint as the store holds it, across nodes."""

    name: str
    manifests: dict[int, dict[str, Any]] = field(default_factory=dict)  # node -> manifest
    writers: set[int] = field(default_factory=set)  # nodes with data objects under it
    expected: set[int] = field(default_factory=set)  # a step folder: the nodes that wrote the previous one

    @property
    def complete(self) -> bool:
        """Some node's manifest names it and every node with objects under it has its manifest; then, for a
        sharded step (:mod:`gtrain.checkpoints.sharded`): DCP's ``.metadata`` (or every rank's ``__R.metadata``)
        and every file it names are in; DeepSpeed ZeRO's model states and every rank's file of their world size
        are in (those rules replace the previous step's writers: they name every rank's part); ZeRO files whose
        model states could not be read: no gap in the ranks, and the previous step's writers wrote theirs; any
        other step folder: every node that wrote the previous step folder wrote this one."""
        if not self.manifests or not self.writers <= set(self.manifests):
            return False
        what, lacks = self.lacks
        if lacks:
            return False
        return (lacks is not None and names_every_rank(what, self.manifests)) or self.expected <= set(self.manifests)

    @property
    def lacks(self) -> tuple[str | None, list[str] | None]:
        """(framework, the files the step still lacks by that framework's rule; None: no such rule here)."""
        return missing(self.name, self.manifests) if self.folder else (None, None)

    @property
    def folder(self) -> bool:
        """A step folder (``checkpoint-N/``, ``global_stepN/``): its files lie under its name."""
        return any("/" in str(f.get("path")) for m in self.manifests.values() for f in m["files"]
                   if isinstance(f, dict))

    @property
    def pointer(self) -> str | None:
        """The step folder this small file names (its newest copy's ``points_to``), when it is a pointer."""
        if not self.manifests:
            return None
        newest = max(self.manifests.values(),
                     key=lambda m: (float(m.get("mtime") or 0), float(m.get("written_at") or 0)))
        target = newest.get("points_to")
        return target if isinstance(target, str) and target else None

    @property
    def mtime(self) -> float:
        return max((float(m.get("mtime") or 0) for m in self.manifests.values()), default=0.0)

    @property
    def bytes(self) -> int:
        return sum(int(f["size"]) for m in self.manifests.values() for f in m["files"])

    def newest_files(self) -> tuple[dict[str, tuple[int, dict[str, Any]]], list[str]]:
        """Per file path, the copy with the latest completed write (its ``mtime``) across the nodes' manifests;
        equal times: the later upload (``written_at``), then the higher node. Returns (path -> (node, entry),
        conflicts): a path whose newest copies were written at the same time with different contents."""
        copies: dict[str, list[tuple[float, float, int, dict[str, Any]]]] = {}
        for node, m in self.manifests.items():
            for f in m["files"]:
                copies.setdefault(str(f["path"]), []).append(
                    (float(f.get("mtime") or m.get("mtime") or 0), float(m.get("written_at") or 0), node, f))
        wanted: dict[str, tuple[int, dict[str, Any]]] = {}
        conflicts: list[str] = []
        for rel, cs in sorted(copies.items()):
            cs.sort(key=lambda c: (c[0], c[1], c[2]))
            mtime, _w, node, f = cs[-1]
            rivals = sorted({c[2] for c in cs if c[0] == mtime and c[3]["sha256"] != f["sha256"]})
            if rivals:
                conflicts.append(f"{rel}: node-{node} and node-{','.join(map(str, rivals))} wrote different "
                                 f"contents at the same time; took node-{node}'s (uploaded last)")
            wanted[rel] = (node, f)
        return wanted, conflicts

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "complete": self.complete, "nodes": sorted(self.manifests),
                "bytes": self.bytes, "mtime": self.mtime,
                "written_at": max((float(m.get("written_at") or 0) for m in self.manifests.values()), default=0.0)}


class Store:
    """One job's part of the checkpoint store."""

    def __init__(self, store_url: str, key: str, *, backend: Backend | None = None, workers: int = 16) -> None:
        from gtrain.sync.objstore import make_backend, parse_location

        base = parse_location(store_url, "job.checkpoint_store")
        if not isinstance(base, RemoteURL):
            raise SyncError(f"job.checkpoint_store {store_url!r} is not an s3://, gs:// or az:// URL")
        self.url = RemoteURL(base.scheme, base.bucket, f"{base.key_prefix}{key.strip('/')}")
        self.where = f"{store_url.rstrip('/')}/{key.strip('/')}"
        self.workers = workers
        self.backend = backend or make_backend(self.url, fld="job.checkpoint_store", workers=workers)
        self._listed: dict[str, RemoteObject] | None = None  # the last listing of checkpoints()
        self.conflicts: list[str] = []  # what the last restore() found: same-time copies that differ
        self.listing: list[Checkpoint] = []  # what the last checkpoints() found
        self.pointed: list[str] = []  # the pointer files the last restore_newest() made name its checkpoint

    def close(self) -> None:
        self.backend.close()

    # ---- writing ---------------------------------------------------------------------------------

    def _put_bytes(self, key: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".gtrain-ckpt-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.backend.upload(Path(tmp), self.url, self.url.key(key), size=len(data),
                                digests=hash_file(Path(tmp)), expect=None, progress=_noop)
        finally:
            os.unlink(tmp)

    def probe(self, node: int) -> None:
        """Write (and delete) one object: a store that refuses writes fails here, at launch."""
        key = f".probe-node-{node}"
        self._put_bytes(key, f"gtrain write probe {time.time()}\n".encode())
        self.backend.delete(self.url, [self.url.key(key)])

    def mark_fresh(self) -> float:
        """``--fresh``: the run starts over; checkpoints whose files were written before now stop counting
        (they stay in the store). The time is this node's clock, as the manifests' write times are."""
        since = time.time()
        self._put_bytes(FRESH, json.dumps({"since": since, "files": []}).encode())
        return since

    def upload(self, node: int, root: Path, name: str, files: list[str], *, attempt: int = 0,
               points_to: str | None = None, requires: list[str] | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Upload checkpoint ``name`` (``files``: paths relative to ``root``), each verified by checksum on the
        wire, then its manifest (``points_to``: it is a pointer file naming that step folder; ``requires``: every
        file of the whole step, across the nodes, as this part's DCP ``.metadata`` or ZeRO model states name
        them; ``extra``: the fields :func:`gtrain.checkpoints.sharded.describe` gives). A file that changes while
        it is uploaded fails the checkpoint (SyncError)."""
        entries: list[dict[str, Any]] = []
        mtime = 0.0
        upload_md5: bool = getattr(self.backend, "upload_md5", True)

        def one(rel: str) -> dict[str, Any]:
            path = root / rel
            st = path.stat()
            digests = hash_file(path, md5=upload_md5)  # the md5 only for a backend that uses it (not S3's, GCS's)
            self.backend.upload(path, self.url, self.url.key(f"node-{node}/{rel}"), size=st.st_size,
                                digests=digests, expect=None, progress=_noop)
            after = path.stat()
            if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                raise SyncError(f"{path} changed while it was uploaded")
            return {"path": rel, "size": st.st_size, "sha256": digests.sha256, "mtime": st.st_mtime}

        with ThreadPoolExecutor(max_workers=4) as pool:
            entries = list(pool.map(one, sorted(files)))
        mtime = max((e["mtime"] for e in entries), default=0.0)
        doc = {"name": name, "node": node, "files": entries, "mtime": mtime, "written_at": time.time(),
               "attempt": attempt}
        if points_to:
            doc["points_to"] = points_to
        if requires is not None:
            doc["requires"] = requires
        for k, v in (extra or {}).items():
            doc.setdefault(k, v)
        # compact: a 64-rank coordinator-less DCP step's pieces are most of it (docs/durable.md, manifest size)
        self._put_bytes(f"node-{node}/{META_DIR}/{name}.json", json.dumps(doc, separators=(",", ":")).encode())
        return doc

    # ---- reading ---------------------------------------------------------------------------------

    def _get_json(self, obj: RemoteObject) -> dict[str, Any] | None:
        fd, tmp = tempfile.mkstemp(prefix=".gtrain-ckpt-")
        os.close(fd)
        try:
            self.backend.download(self.url, obj, Path(tmp), progress=_noop)
            doc = json.loads(Path(tmp).read_text())
            return doc if isinstance(doc, dict) and isinstance(doc.get("files"), list) else None
        except (ValueError, SyncError):
            return None
        finally:
            os.unlink(tmp)

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint of the job in the store, oldest first (by the time its files were written)."""
        found: dict[str, Checkpoint] = {}
        metas: list[tuple[int, str, RemoteObject]] = []
        objs = {o.key: o for o in self.backend.list(self.url)}
        since = 0.0
        if (fresh := objs.get(self.url.key(FRESH))) is not None:
            since = float((self._get_json(fresh) or {}).get("since") or 0)
        for obj in objs.values():
            rel = obj.key[len(self.url.key_prefix):]
            parts = rel.split("/")
            if len(parts) < 2 or not parts[0].startswith("node-") or not parts[0][5:].isdigit():
                continue
            node = int(parts[0][5:])
            if parts[1] == META_DIR:
                if len(parts) == 3 and parts[2].endswith(".json"):
                    metas.append((node, parts[2][:-5], obj))
                continue
            found.setdefault(parts[1], Checkpoint(parts[1])).writers.add(node)
        # one GET per manifest: in parallel (a long run has hundreds; in series they were most of a restore)
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(metas)))) as pool:
            docs = list(pool.map(lambda m: self._get_json(m[2]), metas))
        for (node, name, _obj), doc in zip(metas, docs, strict=True):
            if doc is not None and float(doc.get("mtime") or 0) >= since:
                found.setdefault(name, Checkpoint(name)).manifests[node] = doc
            elif doc is not None and name in found:  # written before --fresh: not the run's any more
                found[name].writers.discard(node)
        for name in [n for n, c in found.items() if since and not c.manifests and not c.writers]:
            del found[name]
        self._listed = objs
        ordered = sorted(found.values(), key=lambda c: (c.mtime, c.name))
        # a step folder is whole once every node that wrote the previous one wrote it (per-rank files, ZeRO
        # shards: a node slower to write has not yet); the first folder of a run has no previous to go by
        prev: Checkpoint | None = None
        for c in ordered:
            if c.manifests and c.folder:
                c.expected = set(prev.manifests) if prev is not None else set()
                prev = c
        self.listing = ordered
        return ordered

    def newest_complete(self) -> Checkpoint | None:
        done = restorable(self.checkpoints())
        return done[-1] if done else None

    def problem(self, ckpt: Checkpoint) -> str | None:
        """Why ``ckpt`` cannot be restored as its manifests describe it (a tampered or torn store), or None:
        an unsafe name or file path (absolute, ``..``, outside the checkpoint), a malformed entry, or an
        object missing from the listing or of another size than its manifest says."""
        if ckpt.name in ("", ".", "..") or "/" in ckpt.name or "\\" in ckpt.name:
            return f"its name {ckpt.name!r} is not a checkpoint name"
        objs = self._listed or {}
        for node, doc in sorted(ckpt.manifests.items()):
            if not doc["files"]:
                return f"node {node}'s manifest lists no file"
            for f in doc["files"]:
                if not isinstance(f, dict):
                    return f"node {node}'s manifest has a malformed entry"
                rel, size, sha = f.get("path"), f.get("size"), f.get("sha256")
                if not isinstance(rel, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0 \
                        or not isinstance(sha, str) or len(sha) != 64:
                    return f"node {node}'s manifest has a malformed entry for {rel!r}"
                mtime = f.get("mtime")
                if mtime is not None and (isinstance(mtime, bool) or not isinstance(mtime, int | float)
                                          or not 0 <= mtime < 1e11):
                    return f"node {node}'s manifest has a malformed write time for {rel!r}"
                parts = rel.split("/")
                if rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts) \
                        or parts[0] != ckpt.name:
                    return f"node {node}'s manifest names an unsafe path {rel!r}"
                obj = objs.get(self.url.key(f"node-{node}/{rel}"))
                if objs and obj is None:
                    return f"node-{node}/{rel} is missing from the store"
                if obj is not None and obj.size != size:
                    return f"node-{node}/{rel} is {obj.size} bytes, its manifest says {size} (truncated or altered)"
        return None

    def restore_newest(self, dest: Path, *, skip: list[tuple[str, str]] | None = None, only: str | None = None,
                       select: Callable[[Checkpoint], set[str] | None] | None = None
                       ) -> tuple[Checkpoint | None, list[str], list[str], int]:
        """Restore the newest complete checkpoint that is intact: one whose manifests are unsafe or whose files
        do not match them (truncated, altered, missing) is refused and the next older one is tried. Each one
        refused is appended to ``skip`` as (name, why). ``only``: that checkpoint or none (an elastic round's
        agreed step). ``select``: which of its files this node needs (None: every file; see
        :func:`gtrain.checkpoints.node.cmd_restore`). Returns (checkpoint or None, downloaded, kept, bytes)."""
        skipped = skip if skip is not None else []
        for ckpt in reversed(restorable(self.checkpoints())):
            if only is not None and ckpt.name != only:
                continue
            why = self.problem(ckpt)
            if why is None:
                try:
                    got, kept, nbytes = self.restore(ckpt, dest, files=select(ckpt) if select else None)
                    self.pointed = point(dest, ckpt, self.listing)
                    return ckpt, got, kept, nbytes
                except SyncError as e:
                    why = e.message
            skipped.append((ckpt.name, why))
        return None, [], [], 0

    def restore(self, ckpt: Checkpoint, dest: Path, *, no_links: bool = False, files: set[str] | None = None
                ) -> tuple[list[str], list[str], int]:
        """Put the newest copy of every file of ``ckpt`` under ``dest`` (:meth:`Checkpoint.newest_files`; verified
        by sha256, through a temp file and a rename, keeping the write's mtime; files already there and identical
        are kept). Same-time copies that differ are named in :attr:`conflicts`. Returns (downloaded, kept, bytes).
        A differing local copy is replaced even when newer: it may be the half of a write a kill cut short. With
        ``no_links`` (``gtrain pull``), a symlink under ``dest`` on any file's way stops it (:class:`LinkInDest`).
        ``files``: only those of its files (paths relative to checkpoint_dir; one the checkpoint lacks: SyncError)."""
        wanted, self.conflicts = ckpt.newest_files()
        if files is not None:
            if lacking := sorted(files - set(wanted)):
                raise SyncError(f"{self.where}: {ckpt.name} has no {lacking[0]}")
            wanted = {rel: v for rel, v in wanted.items() if rel in files}
        for rel in wanted:
            if rel.startswith("/") or ".." in rel.split("/"):
                raise SyncError(f"{self.where}: manifest of {ckpt.name} names an unsafe path {rel!r}")
        if no_links:
            for rel in wanted:
                _no_link(dest, rel)
        # the listing checkpoints() made (what it found complete has all its objects), else a fresh one
        objs = self._listed or {}
        if any(self.url.key(f"node-{node}/{rel}") not in objs for rel, (node, _f) in wanted.items()):
            objs = {o.key: o for o in self.backend.list(self.url)}

        written: list[Path] = []

        def one(item: tuple[str, tuple[int, dict[str, Any]]]) -> int:
            rel, (node, f) = item
            final = dest / rel
            if final.is_file() and final.stat().st_size == f["size"] and hash_file(final).sha256 == f["sha256"]:
                return -1
            obj = objs.get(self.url.key(f"node-{node}/{rel}"))
            if obj is None:
                raise SyncError(f"{self.where}/node-{node}/{rel} is missing from the store")
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = tmp_path(final)
            try:
                got, digests = self.backend.download(self.url, obj, tmp, progress=_noop)
                sha = digests.sha256 if digests is not None else hash_file(tmp).sha256
                if sha != f["sha256"]:
                    raise SyncError(f"{self.where}/node-{node}/{rel}: content does not match its manifest's sha256")
                if f.get("mtime"):  # the time of the write it is, not of this download: the rule compares it
                    os.utime(tmp, (float(f["mtime"]), float(f["mtime"])))
                if no_links:
                    _no_link(dest, rel)
                os.replace(tmp, final)
                written.append(final)
            finally:
                unlink_tmp(tmp)
            return int(f["size"])

        rels = sorted(wanted)
        # as many files at once as `gtrain sync` takes (a sharded checkpoint is many mid-size files, each one
        # stream below the multipart threshold); large files are fetched in parallel ranges by the backend
        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(rels)))) as pool:
            futures = [pool.submit(one, item) for item in sorted(wanted.items())]
        try:
            sizes = [fut.result() for fut in futures]
        except BaseException:  # a checkpoint restored in part is no checkpoint: take back what this call wrote
            for path in written:
                path.unlink(missing_ok=True)
            raise
        got = [r for r, n in zip(rels, sizes, strict=True) if n >= 0]
        kept = [r for r, n in zip(rels, sizes, strict=True) if n < 0]
        return got, kept, sum(n for n in sizes if n > 0)

    def read_newest(self, ckpt: Checkpoint, rel: str, limit: int) -> bytes | None:
        """The newest copy of file ``rel`` of ``ckpt`` (at most ``limit`` bytes), checked against its manifest's
        sha256; None when the checkpoint has no such file, it is larger, or it cannot be fetched intact."""
        node, f = ckpt.newest_files()[0].get(rel, (None, None))
        if f is None or not isinstance(f.get("size"), int) or f["size"] > limit:
            return None
        obj = (self._listed or {}).get(self.url.key(f"node-{node}/{rel}"))
        if obj is None:
            return None
        fd, tmp = tempfile.mkstemp(prefix=".gtrain-ckpt-")
        os.close(fd)
        try:
            self.backend.download(self.url, obj, Path(tmp), progress=_noop)
            data = Path(tmp).read_bytes()
        except (SyncError, OSError):
            return None
        finally:
            os.unlink(tmp)
        return data if hashlib.sha256(data).hexdigest() == f.get("sha256") else None


def restorable(ckpts: list[Checkpoint]) -> list[Checkpoint]:
    """The complete checkpoints a restore may pick, oldest first: no pointer file; only step folders when the
    run keeps a pointer beside them (then a helper file written after a step, as DeepSpeed's copy of
    ``zero_to_fp32.py``, is no step of its own)."""
    done = [c for c in ckpts if c.complete and c.pointer is None]
    if any(c.pointer for c in ckpts):
        done = [c for c in done if c.folder]
    return done


def pointer_target(path: Path, names: set[str]) -> str | None:
    """The entry of ``names`` the small file at ``path`` names (its whole text, stripped), else None."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > POINTER_MAX:
            return None
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text in names and text != path.name else None


def point(dest: Path, ckpt: Checkpoint, ckpts: list[Checkpoint]) -> list[str]:
    """After ``ckpt`` (a step folder) was restored or pulled into ``dest``: every pointer file there (the store's,
    and a small file of dest naming a step folder) names it, so a trainer resuming by its pointer (DeepSpeed's
    ``latest``) loads the step that is there and whole, never a partial or missing one. Returns those rewritten."""
    if not ckpt.folder:
        return []
    names = {c.name for c in ckpts} | {p.name for p in dest.iterdir() if p.is_dir()}
    pointers = {c.name for c in ckpts if c.pointer}
    pointers |= {p.name for p in dest.iterdir() if pointer_target(p, names)}
    out = []
    for name in sorted(pointers - {ckpt.name}):
        path = dest / name
        if path.is_symlink() or path.is_dir():
            continue
        if path.is_file() and pointer_target(path, names | {ckpt.name}) == ckpt.name:
            continue
        tmp = dest / f".{name}.gtrain-tmp"
        tmp.write_text(ckpt.name)  # as DeepSpeed writes its tag: the name alone
        os.replace(tmp, path)
        out.append(name)
    return out
