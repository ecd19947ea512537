"""The sync manifest: per (local dir, remote URL), a sqlite file under ``$GTRAIN_HOME/sync/`` recording the
files known to match their remote object, held under an exclusive file lock while a sync runs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gtrain.errors import SyncError
from gtrain.sync.model import RemoteURL


@dataclass(frozen=True)
class Entry:
    size: int
    mtime_ns: int
    sha256: str
    md5: str
    remote_version: str
    remote_size: int
    crc32c: str | None = None


@dataclass(frozen=True)
class OpenUpload:
    """A multipart / resumable upload begun and not yet finished (a killed sync leaves one behind)."""

    key: str
    upload_id: str
    size: int
    mtime_ns: int
    part_size: int
    sha256: str


def gtrain_home() -> Path:
    return Path(os.environ.get("GTRAIN_HOME") or Path.home() / ".gtrain").expanduser()


class Manifest:
    """Per (local dir, remote URL) record of files known to match their remote object. A cache: a lost or
    unreadable manifest only costs a re-read of local files, never a wrong skip."""

    def __init__(self, local: Path, url: RemoteURL, *, readonly: bool) -> None:
        ident = f"{os.path.realpath(local)}\x00{url}"
        digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        self.dir = gtrain_home() / "sync"
        self.path = self.dir / f"{digest}.sqlite"
        self.readonly = readonly
        self.entries: dict[str, Entry] = {}
        self._pending: dict[str, Entry | None] = {}
        self._lock_fd: int | None = None
        self._db: sqlite3.Connection | None = None
        self._jdb: sqlite3.Connection | None = None  # the upload journal, written from worker threads
        self._jlock = threading.Lock()
        if readonly:
            if self.path.exists():
                with contextlib.suppress(sqlite3.Error):
                    db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
                    try:
                        self._load(db)
                    finally:
                        db.close()
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise SyncError(f"another gtrain sync between {local} and {url} is running",
                            hint="wait for it to finish; two syncs of the same pair would race") from None
        try:
            self._db = self._open(local, url)
        except sqlite3.Error:  # corrupt: it is only a cache, start afresh
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._db = self._open(local, url)

    def _open(self, local: Path, url: RemoteURL) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS files (rel TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
                   "sha256 TEXT, md5 TEXT, crc32c TEXT, remote_version TEXT, remote_size INTEGER, synced_at REAL)")
        db.execute("CREATE TABLE IF NOT EXISTS uploads (key TEXT PRIMARY KEY, upload_id TEXT, size INTEGER, "
                   "mtime_ns INTEGER, part_size INTEGER, sha256 TEXT, started_at REAL)")
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                       [("local", os.path.realpath(local)), ("remote", str(url)), ("schema", "1")])
        self._load(db)
        return db

    def _load(self, db: sqlite3.Connection) -> None:
        rows = db.execute("SELECT rel, size, mtime_ns, sha256, md5, remote_version, remote_size, crc32c FROM files")
        self.entries = {r[0]: Entry(*r[1:]) for r in rows}

    def put(self, rel: str, entry: Entry) -> None:
        self.entries[rel] = entry
        self._pending[rel] = entry

    def remove(self, rel: str) -> None:
        if self.entries.pop(rel, None) is not None or rel in self._pending:
            self._pending[rel] = None

    def flush(self) -> None:
        if self._db is None or not self._pending:
            self._pending.clear()
            return
        now = time.time()
        puts = [(rel, e.size, e.mtime_ns, e.sha256, e.md5, e.crc32c, e.remote_version, e.remote_size, now)
                for rel, e in self._pending.items() if e is not None]
        dels = [(rel,) for rel, e in self._pending.items() if e is None]
        self._db.execute("BEGIN")
        self._db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", puts)
        self._db.executemany("DELETE FROM files WHERE rel = ?", dels)
        self._db.execute("COMMIT")
        self._pending.clear()

    # -- the upload journal: recorded before the first part is sent, removed once the upload is complete or
    #    aborted; what a killed sync leaves here is resumed (same file) or aborted (anything else) next time

    def _journal(self) -> sqlite3.Connection | None:
        if self.readonly:
            return None
        if self._jdb is None:
            self._jdb = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        return self._jdb

    def open_uploads(self) -> list[OpenUpload]:
        with self._jlock:
            db = self._journal()
            if db is None:
                return []
            rows = db.execute("SELECT key, upload_id, size, mtime_ns, part_size, sha256 FROM uploads").fetchall()
        return [OpenUpload(*r) for r in rows]

    def upload_begun(self, up: OpenUpload) -> None:
        with self._jlock:
            db = self._journal()
            if db is not None:
                db.execute("INSERT OR REPLACE INTO uploads VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (up.key, up.upload_id, up.size, up.mtime_ns, up.part_size, up.sha256, time.time()))

    def upload_ended(self, key: str, upload_id: str) -> None:
        with self._jlock:
            db = self._journal()
            if db is not None:
                db.execute("DELETE FROM uploads WHERE key = ? AND upload_id = ?", (key, upload_id))

    def close(self) -> None:
        try:
            if self._jdb is not None:
                self._jdb.close()
                self._jdb = None
            if self._db is not None:
                self.flush()
                self._db.close()
        finally:
            self._db = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
