"""``gtrain pull``: bring a job's checkpoint_dir back from the nodes, every file verified by sha256.

Unchanged files (same size and sha256 as the node's) are skipped; a file is fetched into
``DEST/.gtrain-partial/<path>.part`` and renamed into place only once its sha256 matches, so an interrupted
pull resumes from the bytes it already has and never leaves a partial file under a final name.

Nothing is written outside DEST: a name from the node that would land outside it (``../x``, absolute) is
refused, and every folder and file under DEST is opened without following symlinks (``O_NOFOLLOW``, one
directory at a time), so a symlink already in DEST (``DEST/sub -> /elsewhere``, a linked ``.gtrain-partial``
or a linked file) stops the pull with its name instead of being written through. DEST itself may be a link:
the user named it. On the node, a ``checkpoint_dir`` that is (or lies under) a symlink is refused too: it
is a path inside the workdir by contract, and a link would pull whatever it points at (``~``, ``/``).
Symlinks inside it are not followed. Any other name is legal, backslashes included.

torchrun's c10d rendezvous assigns global ranks by its own order, so "rank 0 saves" may happen on any
node: by default every node's checkpoint_dir is listed and merged. A name that holds the same bytes on
several nodes (DDP replicas) is one file. A name whose contents differ between nodes is a *conflict*: no
version is picked (the newest is not always the good one); each distinct version is kept as
``DEST/node-K/<name>`` (K: the lowest node holding it) and listed in ``PullResult.conflicts``.

DEST is created only when there is a file to write, and marked with a ``.gtrain-pull`` file so that a pull
folder inside a workdir is never synced back to the nodes (:mod:`gtrain.sync.workdir`). A DEST this pull
created that ends empty is removed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, SyncError
from gtrain.remote.fanout import parallel
from gtrain.sync.workdir import PULL_MARKER

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.remote.base import Runner

PARTIAL = ".gtrain-partial"
MARKER = PULL_MARKER
MARKER_TEXT = b"Made by `gtrain pull`. A folder holding this file is never synced to the nodes.\n"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


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
    #: names whose contents differ between nodes: {"path", "nodes", "kept": [DEST-relative names]}
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    #: checkpoints of the store not pulled: {"name", "why"} (a tampered or torn checkpoint)
    refused: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        doc = {"dest": self.dest, "nodes": self.nodes, "files": self.files, "transferred": self.transferred,
               "skipped": self.skipped, "resumed": self.resumed, "bytes": self.bytes,
               "seconds": round(self.seconds, 3), "conflicts": self.conflicts}
        if self.refused:
            doc["refused"] = self.refused
        return doc


def default_pull_dest(cluster: str, checkpoint_dir: str) -> Path:
    """``./<cluster>-<last part of checkpoint_dir>``; ``./<cluster>-checkpoints`` when that part is empty
    (``checkpoint_dir: .``)."""
    last = posixpath.basename(posixpath.normpath(checkpoint_dir.replace(os.sep, "/")))
    return Path.cwd() / f"{cluster}-{last if last not in ('', '.', '/') else 'checkpoints'}"


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return _sha256_fd(f.fileno())


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def safe_rel(name: str) -> str:
    norm = posixpath.normpath(name)
    if not name or name.startswith("/") or norm.startswith("../") or norm in ("..", ".") or "\x00" in name:
        raise SyncError(f"refusing to pull {name!r}: it would land outside the destination")
    return norm


def check_dest(path: Path) -> None:
    """Refuse (exit 2, naming ``--to``) a destination a pull could not write: one that exists and is not a
    folder, lies under a file, or whose nearest existing folder is not writable. Cheap: `run` calls it before
    anything is created."""
    text = str(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ConfigError(f"--to {text!r}: exists and is not a folder", field="--to",
                          hint="name a folder (it is created if missing)")
    probe = Path(os.path.abspath(path))
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--to {text!r}: a part of it ({str(probe)!r}) is a file, not a folder", field="--to",
                          hint="name a folder (it is created if missing)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--to {text!r}: {str(probe)!r} is not writable", field="--to",
                          hint="name a folder you can write")


class _Dest:
    """DEST, opened one directory at a time without following a symlink anywhere below it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.created = not os.path.lexists(path)
        self._fd: int | None = None
        self._lock = threading.Lock()
        check_dest(path)

    def root(self, create: bool) -> int | None:
        with self._lock:
            if self._fd is None and (create or not self.created):
                try:
                    self.path.mkdir(parents=True, exist_ok=True)
                except (FileExistsError, NotADirectoryError):
                    raise ConfigError(f"--to {str(self.path)!r}: a part of it is a file, not a folder",
                                      field="--to", hint="name a folder (it is created if missing)") from None
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
                if self.created:
                    self._write_marker(self._fd)
            return self._fd

    def _write_marker(self, fd: int) -> None:
        m = os.open(MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        try:
            os.write(m, MARKER_TEXT)
        finally:
            os.close(m)

    def refuse(self, rel: str, what: str) -> SyncError:
        return SyncError(f"refusing to pull into {self.path}: {self.path / rel} {what}",
                         hint="gtrain never writes through a symlink under the destination: remove it, "
                              "or pull --to another folder")

    def open_dir(self, parts: list[str], *, create: bool) -> int | None:
        """An fd of DEST/parts (the caller closes it); None when missing and not ``create``."""
        root = self.root(create)
        if root is None:
            return None
        fd = os.dup(root)
        try:
            for i, name in enumerate(parts):
                rel = "/".join(parts[:i + 1])
                try:
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nfd = self._open_checked(name, fd, rel)
                except OSError as e:
                    raise self._why(name, fd, rel, e) from None
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _open_checked(self, name: str, fd: int, rel: str) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            raise self._why(name, fd, rel, e) from None

    def _why(self, name: str, fd: int, rel: str, e: OSError) -> SyncError:
        try:
            st = os.lstat(name, dir_fd=fd)
        except OSError:
            return SyncError(f"cannot open {self.path / rel}: {e.strerror}")
        if stat.S_ISLNK(st.st_mode):
            return self.refuse(rel, f"is a symlink (to {os.readlink(name, dir_fd=fd)!r})")
        if e.errno == errno.ENOTDIR:
            return self.refuse(rel, "is a file where the node has a folder")
        return SyncError(f"cannot open {self.path / rel}: {e.strerror}")

    def finish(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        _prune_empty(self.path / PARTIAL)
        if self.created and self.path.is_dir() and not os.path.islink(self.path):
            left = set(os.listdir(self.path))
            if left <= {MARKER}:
                (self.path / MARKER).unlink(missing_ok=True)
                try:
                    self.path.rmdir()
                except OSError:
                    pass


Source = tuple[int, "Runner", str]
Chosen = tuple[dict[str, Any], "Runner", str, int, str]  # entry, runner, remote_dir, node, remote name


def _manifests(sources: list[Source]) -> list[list[dict[str, Any]]]:
    def one(src: Source) -> list[dict[str, Any]]:
        node, runner, remote_dir = src
        got = runner.call("pull_manifest", remote_dir, runner.root, timeout=3600)
        if got.get("refused"):
            raise SyncError(f"node {node}: {got['refused']}",
                            hint="gtrain pulls only from inside the node's workdir: make checkpoint_dir a real "
                                 "folder there (mount a big disk at it rather than linking it)")
        return list(got["files"])

    return parallel(one, sources)


def _merge(sources: list[Source], manifests: list[list[dict[str, Any]]],
           res_conflicts: list[dict[str, Any]]) -> dict[str, Chosen]:
    """One entry per DEST name: identical copies are one file, differing ones are kept as ``node-K/<name>``."""
    by_name: dict[str, list[Chosen]] = {}
    for (node, runner, remote_dir), entries in zip(sources, manifests, strict=True):
        for e in entries:
            rel = safe_rel(str(e["path"]))
            by_name.setdefault(rel, []).append((e, runner, remote_dir, node, rel))
    chosen: dict[str, Chosen] = {}
    for rel, copies in sorted(by_name.items()):
        distinct: dict[str, Chosen] = {}
        for c in sorted(copies, key=lambda c: c[3]):
            distinct.setdefault(str(c[0]["sha256"]), c)
        if len(distinct) == 1:
            chosen[rel] = next(iter(distinct.values()))
            continue
        kept = []
        for c in sorted(distinct.values(), key=lambda c: c[3]):
            name = f"node-{c[3]}/{rel}"
            if name in by_name:
                raise SyncError(f"{rel!r} differs between nodes and {name!r} is taken by a file of the job's own",
                                hint="pull one node at a time: gtrain pull CLUSTER --node K --to DIR")
            chosen[name] = c
            kept.append(name)
        res_conflicts.append({"path": rel, "nodes": sorted(c[3] for c in copies), "kept": kept})
    return chosen


def pull_dir(sources: list[tuple[int, Runner, str]], dest: Path, *, workers: int = 8,
             report: Reporter | None = None) -> PullResult:
    """Pull from ``(node, runner, remote_dir)`` sources into ``dest``."""
    t0 = time.monotonic()
    target = _Dest(dest)
    conflicts: list[dict[str, Any]] = []
    chosen = _merge(sources, _manifests(sources), conflicts)
    res = PullResult(str(dest), sorted({c[3] for c in chosen.values()}), files=len(chosen), conflicts=conflicts)
    for c in conflicts:
        if report is not None:
            report.warn(f"{c['path']} differs between nodes {c['nodes']}: kept each version, as "
                        + ", ".join(c["kept"]))
    lock = threading.Lock()

    def one(item: tuple[str, Chosen]) -> None:
        rel, (entry, runner, remote_dir, _node, remote_name) = item
        parts = rel.split("/")
        size, want = int(entry["size"]), str(entry["sha256"])
        if _unchanged(target, parts, size, want):
            with lock:
                res.skipped.append(rel)
            return
        pfd = target.open_dir([PARTIAL, *parts[:-1]], create=True)
        assert pfd is not None
        try:
            got, resumed = _fetch(target, pfd, parts[-1] + ".part", rel, runner, f"{remote_dir}/{remote_name}",
                                  size, want)
            ffd = target.open_dir(parts[:-1], create=True)
            assert ffd is not None
            try:
                try:
                    os.replace(parts[-1] + ".part", parts[-1], src_dir_fd=pfd, dst_dir_fd=ffd)
                except IsADirectoryError:
                    raise target.refuse(rel, "is a folder where the node has a file") from None
                mtime = float(entry.get("mtime") or time.time())
                os.utime(parts[-1], (mtime, mtime), dir_fd=ffd, follow_symlinks=False)
            finally:
                os.close(ffd)
        finally:
            os.close(pfd)
        with lock:
            res.bytes += got
            res.transferred.append(rel)
            if resumed:
                res.resumed.append(rel)

    try:
        parallel(one, sorted(chosen.items()), max_workers=workers)
    finally:
        target.finish()
    res.transferred.sort()
    res.skipped.sort()
    res.resumed.sort()
    res.seconds = time.monotonic() - t0
    return res


def _unchanged(target: _Dest, parts: list[str], size: int, want: str) -> bool:
    dfd = target.open_dir(parts[:-1], create=False)
    if dfd is None:
        return False
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise target.refuse("/".join(parts), f"is a symlink (to {os.readlink(parts[-1], dir_fd=dfd)!r})") from e
        return False  # a folder where the node has a file: the rename says so
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and st.st_size == size and _sha256_fd(fd) == want
    finally:
        os.close(fd)


def _fetch(target: _Dest, pfd: int, name: str, rel: str, runner: Runner, remote: str, size: int,
           want: str) -> tuple[int, bool]:
    """Fetch into ``name`` in the open partial folder, resuming its bytes; (bytes moved, resumed?)."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=pfd)
    except OSError as e:
        raise target.refuse(f"{PARTIAL}/{rel}.part", f"cannot be opened without following a link ({e.strerror})"
                            ) from None
    moved = 0
    with os.fdopen(fd, "r+b") as f:
        offset = os.fstat(fd).st_size
        if offset > size:
            offset = 0
        resumed = offset > 0
        for attempt in (1, 2):
            f.seek(offset)
            f.truncate()
            moved += runner.fetch(remote, f, offset)
            f.flush()
            if _sha256_fd(fd) == want:
                return moved, resumed
            offset = 0  # the resumed bytes were stale: start this file over
            if attempt == 2:
                os.unlink(name, dir_fd=pfd)
    raise SyncError(f"{rel}: sha256 does not match the node's after two tries (is the job still writing it?)",
                    hint="pull again after the job's next save")


def _prune_empty(root: Path) -> None:
    if not root.is_dir() or root.is_symlink():
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda x: -len(x[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass
