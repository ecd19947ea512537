"""The transfer engine: plans what moves (from one listing, the local scan and the manifest), runs the
transfers on a thread pool, commits the manifest as files complete, deletes last, and reports progress.

A sync of many small files is bound by the Python work per file (and, with many threads, by the GIL handing
over at every syscall), so the per-file path is kept short: ``workers`` threads pull paths from one queue and
record their own results (no Future per file, no waiter over every pending file), the main thread only
commits the manifest every half second; a small file to upload is read once, through one descriptor, and
hashed from memory, and where the backend offers ``upload_data(data, url, key, *, digests, expect,
progress)`` (GCS) those same bytes are what is sent; a backend with ``upload_md5 = False`` (GCS) is handed
no md5 for a larger file (md5 is the slowest of the hashes; it checks the upload its own way); a download is
stat'ed once, in its temp file, before the rename.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from gtrain.errors import SyncError
from gtrain.sync.local import LocalFile, clean_tmp, hash_file, safe_rel_from_key, scan_local, tmp_path, unlink_tmp
from gtrain.sync.manifest import Entry, Manifest
from gtrain.sync.model import META_SHA256, Action, Backend, Digests, ProgressEvent, RemoteObject, RemoteURL, SyncResult

_MANIFEST_FLUSH_S = 0.5
_PROGRESS_INTERVAL_S = 0.1
_INLINE_MAX = 1024 * 1024
"""uploads of at most this many bytes are read into memory once (hash and body from the same bytes)"""
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block us


class Progress:
    """Counts bytes and files across the worker threads; calls ``cb`` with throttled :class:`ProgressEvent` s."""

    def __init__(self, cb: Callable[[ProgressEvent], None] | None) -> None:
        self.cb = cb
        self.lock = threading.Lock()
        self.emit_lock = threading.Lock()
        self.bytes_done = self.bytes_total = self.files_done = self.files_total = 0
        self.t0 = time.monotonic()
        self.last = 0.0
        self.phase: Literal["list", "transfer", "delete", "done"] = "list"

    def plan(self, files: int, nbytes: int) -> None:
        with self.lock:
            self.files_total += files
            self.bytes_total += nbytes

    def add_bytes(self, n: int, current: str | None = None) -> None:
        with self.lock:
            self.bytes_done += n
        self.emit(current=current)

    def file_done(self, current: str | None, *, skipped_bytes: int | None = None) -> None:
        with self.lock:
            if skipped_bytes is not None:  # found identical after all: out of the totals
                self.files_total -= 1
                self.bytes_total -= skipped_bytes
            else:
                self.files_done += 1
        self.emit(current=current, force=True)

    def emit(self, *, current: str | None = None, force: bool = False,
             phase: Literal["list", "transfer", "delete", "done"] | None = None) -> None:
        if self.cb is None:
            return
        now = time.monotonic()
        with self.lock:
            if phase is not None:
                self.phase = phase
            if not force and now - self.last < _PROGRESS_INTERVAL_S:
                return
            self.last = now
            elapsed = now - self.t0
            ev = ProgressEvent(self.phase, self.bytes_done, max(self.bytes_total, self.bytes_done), self.files_done,
                               max(self.files_total, self.files_done), self.bytes_done / elapsed if elapsed else 0.0,
                               elapsed, current)
        with self.emit_lock:
            self.cb(ev)


class Engine:
    """One sync between ``local`` and ``url`` in one ``direction``: :meth:`run` plans, transfers, deletes."""

    def __init__(self, local: Path, url: RemoteURL, direction: str, backend: Backend, manifest: Manifest,
                 result: SyncResult, *, delete: bool, dry_run: bool, workers: int, progress: Progress) -> None:
        self.local, self.url, self.direction, self.backend = local, url, direction, backend
        self.manifest, self.result, self.delete, self.dry_run = manifest, result, delete, dry_run
        self.workers, self.progress = workers, progress
        self.lock = threading.Lock()
        self.remote: dict[str, RemoteObject] = {}
        self.local_files: dict[str, LocalFile] = {}
        self.real_root = os.path.realpath(local)
        self.safe_dirs: set[Path] = set()
        self.upload_data: Callable[..., RemoteObject] | None = getattr(backend, "upload_data", None)
        self.upload_md5: bool = getattr(backend, "upload_md5", True)

    # -- planning

    def run(self) -> None:
        upload = self.direction == "upload"
        remote_objs = list(self.backend.list(self.url))
        for obj in remote_objs:
            if obj.key.endswith("/"):  # "folder" markers made by consoles
                continue
            # a key that would escape the destination refuses the whole download before any write
            rel = obj.key[len(self.url.key_prefix):] if upload else safe_rel_from_key(self.url, obj.key)
            self.remote[rel] = obj
        if not upload and not self.dry_run:
            clean_tmp(self.local)
        self.local_files = scan_local(self.local)

        source = self.local_files if upload else self.remote
        work: list[str] = []
        for rel in sorted(source):
            lf, maybe_obj, entry = self.local_files.get(rel), self.remote.get(rel), self.manifest.entries.get(rel)
            if lf is not None and maybe_obj is not None and entry is not None and self._unchanged(lf, maybe_obj, entry):
                self.result.skipped += 1
                continue
            work.append(rel)
        self.progress.plan(len(work), sum(self._size(rel) for rel in work))
        self.progress.emit(phase="transfer", force=True)
        if not upload:
            work = _across_folders(work)

        failures = self._run_pool(work)

        # deletes only after every transfer went through: a failed sync never removes anything
        extra = sorted(set(self.remote if upload else self.local_files) - set(source))
        if self.delete and extra and not failures:
            self.progress.emit(phase="delete", force=True)
            self._delete(extra)
        for rel in list(self.manifest.entries):
            if rel not in source:
                self.manifest.remove(rel)
        self.manifest.flush()
        self.progress.emit(phase="done", force=True)
        if failures:
            rel, first = failures[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise SyncError(f"{len(failures)} file(s) failed to sync{more}; first: {rel}: {first.message}",
                            hint=first.hint or "re-run the same command: it only moves what is still missing")

    @staticmethod
    def _unchanged(lf: LocalFile, obj: RemoteObject, e: Entry) -> bool:
        return (lf.size == e.size and lf.mtime_ns == e.mtime_ns
                and obj.size == e.remote_size and obj.version == e.remote_version)

    def _size(self, rel: str) -> int:
        if self.direction == "upload":
            return self.local_files[rel].size
        return self.remote[rel].size

    def _run_pool(self, work: list[str]) -> list[tuple[str, SyncError]]:
        failures: list[tuple[str, SyncError]] = []
        if not work:
            return failures
        task = self._upload_one if self.direction == "upload" else self._download_one
        todo = deque(work)  # popleft() is atomic: the workers' only shared queue
        fatal: list[BaseException] = []
        finished = threading.Event()
        live = [min(self.workers, len(work))]
        lock, manifest = self.lock, self.manifest

        def worker() -> None:
            try:
                while True:
                    try:
                        rel = todo.popleft()
                    except IndexError:
                        return
                    try:
                        entry = task(rel)
                    except SyncError as e:  # this file failed; the others go on
                        with lock:
                            failures.append((rel, e))
                        continue
                    except BaseException as e:  # noqa: BLE001 - re-raised by the main thread: stop everything
                        with lock:
                            fatal.append(e)
                        todo.clear()
                        return
                    if entry is not None:
                        with lock:
                            manifest.put(rel, entry)
            finally:
                with lock:
                    live[0] -= 1
                    if live[0] == 0:
                        finished.set()

        threads = [threading.Thread(target=worker, name=f"gtrain-sync-{i}", daemon=True) for i in range(live[0])]
        try:
            for t in threads:
                t.start()
            while not finished.wait(_MANIFEST_FLUSH_S):  # commit what completed, twice a second
                with lock:
                    manifest.flush()
        finally:
            todo.clear()  # on an interrupt: the files in flight finish, no new one starts
            for t in threads:
                if t.ident is not None:  # started
                    t.join()
            with lock:
                manifest.flush()
        if fatal:
            raise fatal[0]
        failures.sort(key=lambda f: f[0])
        return failures

    # -- per file

    def _same(self, digests: Digests, obj: RemoteObject) -> bool:
        if obj.sha256 is None and obj.md5 is None:
            head = self.backend.head(self.url, obj.key)
            if head is None:
                return False
            obj = head
        if obj.sha256 is not None:
            return obj.sha256 == digests.sha256
        return obj.md5 is not None and obj.md5 == digests.md5

    def _action(self, kind: Literal["upload", "download"], rel: str, size: int, reason: str) -> None:
        with self.lock:
            self.result.actions.append(Action(kind, rel, size, reason))
            self.result.bytes += size
            if kind == "upload":
                self.result.uploaded += 1
            else:
                self.result.downloaded += 1

    def _compared_same(self, rel: str, path: Path, obj: RemoteObject) -> tuple[Digests, bool]:
        # the md5 (the slowest hash) only where it is used: to compare with an object that shows no sha256, or for
        # the upload that may follow to a backend that takes it
        digests = hash_file(path, md5=obj.sha256 is None or (self.direction == "upload" and self.upload_md5))
        with self.lock:
            self.result.hashed += 1
        return digests, self._same(digests, obj)

    def _upload_one(self, rel: str) -> Entry | None:
        path = self.local / rel
        key = self.url.key(rel)
        obj = self.remote.get(rel)
        if self.upload_data is not None and not self.dry_run and self.local_files[rel].size <= _INLINE_MAX:
            done = self._upload_small(rel, path, key, obj, self.upload_data)
            if done is not False:
                return done
        try:
            st0 = os.stat(path)
            if obj is not None and obj.size == st0.st_size:
                digests, same = self._compared_same(rel, path, obj)
                if same:
                    self._skip(rel, st0.st_size)
                    return self._entry(st0, digests, obj)
                reason = "changed"
            else:
                digests, reason = None, "new" if obj is None else "changed"
            if self.dry_run:
                self._action("upload", rel, st0.st_size, reason)
                self.progress.file_done(rel)
                return None
            if digests is None:  # a backend may do without the md5 (GCS: crc32c), a large file's costliest hash
                digests = hash_file(path, md5=self.upload_md5)
            st1 = os.stat(path)
            if (st1.st_size, st1.st_mtime_ns) != (st0.st_size, st0.st_mtime_ns):
                raise SyncError(f"{path} changed while it was being read", hint="re-run once it is no longer written")
            new = self.backend.upload(path, self.url, key, size=st0.st_size, digests=digests, expect=obj,
                                      progress=lambda n: self.progress.add_bytes(n, rel))
            st2 = os.stat(path)
        except FileNotFoundError as e:
            raise SyncError(f"{path} disappeared during the sync", hint="re-run to sync what is there now") from e
        except OSError as e:
            raise SyncError(f"cannot read {path}: {e.strerror or e}") from e
        if (st2.st_size, st2.st_mtime_ns) != (st0.st_size, st0.st_mtime_ns):
            raise SyncError(f"{path} changed while it was being uploaded",
                            hint="re-run once it is no longer written; the uploaded copy will be replaced")
        if new.size != st0.st_size:
            raise SyncError(f"{self.url.scheme}://{self.url.bucket}/{key} has {new.size} bytes after upload, "
                            f"expected {st0.st_size}")
        self._action("upload", rel, st0.st_size, reason)
        self.progress.file_done(rel)
        return self._entry(st0, digests, new)

    def _upload_small(self, rel: str, path: Path, key: str, obj: RemoteObject | None,
                      upload_data: Callable[..., RemoteObject]) -> Entry | None | Literal[False]:
        """A small file read once (open, fstat, read, fstat, close), hashed from memory and, where it must go
        up, sent from the same bytes. False: it is no longer small, the general path takes it."""
        try:
            fd = os.open(path, _O_READ)
            try:
                st0 = os.fstat(fd)
                size = st0.st_size
                if not stat.S_ISREG(st0.st_mode):
                    raise SyncError(f"{path} is no longer a regular file", hint="re-run to sync what is there now")
                if size > _INLINE_MAX:
                    return False
                data = os.read(fd, size + 1) if size else b""  # size + 1: a file that grew reads long
                while 0 < len(data) < size:  # a short read: go on to EOF (the fstat below sees growth)
                    more = os.read(fd, size + 1 - len(data))
                    if not more:
                        break
                    data += more
                st1 = os.fstat(fd)
            finally:
                os.close(fd)
        except FileNotFoundError as e:
            raise SyncError(f"{path} disappeared during the sync", hint="re-run to sync what is there now") from e
        except OSError as e:
            raise SyncError(f"cannot read {path}: {e.strerror or e}") from e
        if len(data) != size or (st1.st_size, st1.st_mtime_ns) != (size, st0.st_mtime_ns):
            raise SyncError(f"{path} changed while it was being read", hint="re-run once it is no longer written")
        digests = Digests(hashlib.sha256(data).hexdigest(), hashlib.md5(data, usedforsecurity=False).hexdigest())
        if obj is not None and obj.size == size:
            with self.lock:
                self.result.hashed += 1
            if self._same(digests, obj):
                self._skip(rel, size)
                return self._entry(st0, digests, obj)
            reason = "changed"
        else:
            reason = "new" if obj is None else "changed"
        # the bytes sent are the bytes hashed: a later change of the file only makes the next sync look again
        new = upload_data(data, self.url, key, digests=digests, expect=obj,
                          progress=lambda n: self.progress.add_bytes(n, rel))
        if new.size != size:
            raise SyncError(f"{self.url.scheme}://{self.url.bucket}/{key} has {new.size} bytes after upload, "
                            f"expected {size}")
        self._action("upload", rel, size, reason)
        self.progress.file_done(rel)
        return self._entry(st0, digests, new)

    def _download_one(self, rel: str) -> Entry | None:
        obj = self.remote[rel]
        final = self.local / rel
        lf = self.local_files.get(rel)
        where = f"{self.url.scheme}://{self.url.bucket}/{obj.key}"
        reason = "new" if lf is None else "changed"
        try:
            if lf is not None and lf.size == obj.size:
                st0 = os.stat(final)
                local_digests, same = self._compared_same(rel, final, obj)
                if same:
                    self._skip(rel, obj.size)
                    return self._entry(st0, local_digests, obj)
            if self.dry_run:
                self._action("download", rel, obj.size, reason)
                self.progress.file_done(rel)
                return None
            parent = final.parent
            if parent not in self.safe_dirs:  # each folder made and checked once per sync
                parent.mkdir(parents=True, exist_ok=True)
                real_parent = os.path.realpath(parent)
                if real_parent != self.real_root and not real_parent.startswith(self.real_root + os.sep):
                    raise SyncError(f"refusing to write {final}: a symlinked directory leads outside {self.local}")
                self.safe_dirs.add(parent)
            tmp = tmp_path(final)
            renamed = False
            try:
                got, digests = self.backend.download(self.url, obj, tmp,
                                                     progress=lambda n: self.progress.add_bytes(n, rel))
                st = os.stat(tmp)  # a rename keeps size and mtime: this is the final file's stat
                size = st.st_size
                if size != obj.size:
                    raise SyncError(f"{where}: downloaded {size} bytes, expected {obj.size}: it changed during the "
                                    "sync or the transfer broke", hint="re-run to sync what is there now")
                if digests is None:
                    digests = hash_file(tmp)
                if got.sha256 is not None and got.sha256 != digests.sha256:
                    raise SyncError(f"{where}: downloaded content does not match its {META_SHA256} metadata "
                                    f"(got sha256 {digests.sha256[:16]}…, expected {got.sha256[:16]}…)",
                                    hint="the object is corrupt or was rewritten without gtrain; nothing was kept")
                if got.sha256 is None and got.md5 is not None and digests.md5 and got.md5 != digests.md5:
                    raise SyncError(f"{where}: downloaded content does not match its md5",
                                    hint="the object is corrupt or the transfer broke; nothing was kept")
                os.replace(tmp, final)
                renamed = True
            finally:
                if not renamed:
                    unlink_tmp(tmp)
        except OSError as e:
            raise SyncError(f"cannot write {final}: {e.strerror or e}") from e
        self._action("download", rel, obj.size, reason)
        self.progress.file_done(rel)
        return self._entry(st, digests, got if got.version == obj.version else obj)

    def _skip(self, rel: str, size: int) -> None:
        with self.lock:
            self.result.skipped += 1
        self.progress.file_done(rel, skipped_bytes=size)

    @staticmethod
    def _entry(st: os.stat_result, digests: Digests, obj: RemoteObject) -> Entry:
        return Entry(st.st_size, st.st_mtime_ns, digests.sha256, digests.md5, obj.version, obj.size, obj.crc32c)

    # -- deletes

    def _delete(self, rels: list[str]) -> None:
        upload = self.direction == "upload"
        for rel in rels:
            size = self.remote[rel].size if upload else self.local_files[rel].size
            self.result.actions.append(Action("delete-remote" if upload else "delete-local", rel, size,
                                              "not in source"))
        if self.dry_run:
            self.result.deleted += len(rels)
            return
        if upload:
            keys = [self.remote[rel].key for rel in rels]
            for k in keys:  # belt and braces: only what the listing of this prefix showed
                if not k.startswith(self.url.key_prefix):
                    raise SyncError(f"refusing to delete {k!r}: outside {self.url}")
            batches = [keys[i:i + 1000] for i in range(0, len(keys), 1000)]
            from concurrent.futures import ThreadPoolExecutor  # here: a no-change re-sync need not import it

            with ThreadPoolExecutor(max_workers=min(self.workers, len(batches))) as pool:
                for _ in pool.map(lambda b: self.backend.delete(self.url, b), batches):
                    pass
            self.result.deleted += len(keys)
            return
        root = os.path.realpath(self.local)
        dirs: set[Path] = set()
        for rel in rels:
            path = self.local / rel
            real_parent = os.path.realpath(path.parent)
            if real_parent != root and not real_parent.startswith(root + os.sep):
                raise SyncError(f"refusing to delete {path}: outside {self.local}")
            try:
                os.unlink(path)  # a symlink is removed, never its target
            except FileNotFoundError:
                pass
            except OSError as e:
                raise SyncError(f"cannot delete {path}: {e.strerror or e}") from e
            self.result.deleted += 1
            dirs.update(p for p in path.parents if p != self.local and self.local in p.parents)
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):  # prune emptied folders, deepest first
            with contextlib.suppress(OSError):
                d.rmdir()


def _across_folders(rels: list[str]) -> list[str]:
    """``rels`` reordered to take one file from each folder in turn: workers that create files in the same
    folder at the same time queue on its lock in the kernel (spinning on it: CPU the transfers need)."""
    groups: dict[str, deque[str]] = {}
    for rel in rels:
        groups.setdefault(rel.rpartition("/")[0], deque()).append(rel)
    if len(groups) < 2:
        return rels
    out: list[str] = []
    queues = list(groups.values())
    while queues:
        for q in queues:
            out.append(q.popleft())
        queues = [q for q in queues if q]
    return out
