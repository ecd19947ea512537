"""``gtrain sync``: mirror a local directory to or from an object store (``s3://`` or ``gs://``).

The engine here knows nothing about any SDK: each store is a :class:`Backend` (``gtrain.sync.s3``,
``gtrain.sync.gcs``), imported only when a sync needs it, which translates its own SDK's errors into
gtrain's. What the engine guarantees, whichever the store:

* **incremental** -- a manifest under ``$GTRAIN_HOME/sync/`` (sqlite, one per (local dir, remote URL))
  records, per file, what the local file was (size, mtime_ns, sha256, md5) when it last matched a remote
  object, and that object's version (S3 ETag / GCS generation). A file whose size+mtime_ns and whose
  listed remote size+version still match is skipped without being read; one listing of the prefix, no
  per-file request. A file present on both sides with the same size but not vouched for by the manifest is
  read once and compared with the store's md5 / the ``gtrain-sha256`` metadata before anything moves.
* **parallel** -- one thread pool over files; large files go through each SDK's own multipart (S3
  TransferConfig) or chunked resumable (GCS) machinery.
* **integrity** -- uploads carry ``gtrain-sha256`` metadata and the SDK's wire checksums (see the backends);
  downloads land in a temp file next to the final name, are checked against sha256 (else md5) while
  streaming or after, and only then renamed: never a partial or unverified file under a final name.
  Leftover temp files of an interrupted sync are removed by the next one; the manifest is committed as
  files complete, so a re-run moves only what is missing.
* **key safety** -- a remote key that would land outside the destination (``..``, absolute, empty
  components) refuses the whole download before anything is written; ``--delete`` never touches anything
  outside the prefix / the destination directory.
* **progress** -- ``on_progress`` receives :class:`ProgressEvent` s (throttled); the engine never prints.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from gtrain.errors import ConfigError, SyncError

META_SHA256 = "gtrain-sha256"
"""Object metadata key holding the hex sha256 of the content, written on upload, checked on download."""

TMP_TAG = ".gtrain-part"
"""Temp downloads are ``.<name>.<random>.gtrain-part`` (plus the SDK's own suffix) next to the final file."""
_TMP_RE = re.compile(r"^\..+\.[0-9a-f]{8}\.gtrain-part(\.[A-Za-z0-9]+)?$")
_SKIP_DIRS = {".gtrain-partial"}  # gtrain pull's staging folder

MiB = 1024 * 1024
DEFAULT_WORKERS = 16
DEFAULT_MULTIPART_THRESHOLD = 32 * MiB
DEFAULT_PART_SIZE = 16 * MiB
_HASH_CHUNK = 1 * MiB
_MANIFEST_FLUSH_S = 0.5
_PROGRESS_INTERVAL_S = 0.1

_SCHEMES = {"s3": "S3", "gs": "GCS"}
_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_LOOKS_LIKE_URL_RE = re.compile(r"^(s3|gs|gcs|s3a|s3n):(?!//)", re.IGNORECASE)
_S3_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GCS_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_IP_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_BAD_CHARS_RE = re.compile(r"[\x00-\x1f\x7f\\]")


# ---------------------------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class RemoteURL:
    """``scheme://bucket/prefix``; ``prefix`` has no leading or trailing slash ("" = the whole bucket)."""

    scheme: str
    bucket: str
    prefix: str = ""

    @property
    def key_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def key(self, rel: str) -> str:
        return self.key_prefix + rel

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class RemoteObject:
    """One object as a listing (or a HEAD) shows it. ``version`` changes whenever the object is rewritten
    (S3: ETag; GCS: generation). ``md5`` (hex) only where the store vouches it is the content's md5;
    ``sha256`` (hex) from ``gtrain-sha256`` metadata where the call returned metadata."""

    key: str
    size: int
    version: str
    md5: str | None = None
    crc32c: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Digests:
    sha256: str
    md5: str
    """hex; "" where a download did not compute it (the object's sha256 was known)"""


class Backend(Protocol):
    """What the engine needs from a store. Every method raises only gtrain errors: a missing bucket is a
    ConfigError naming it, bad/no credentials a CredentialsError, anything else a SyncError."""

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        """Every object under ``url.key_prefix`` (one paginated listing)."""
        ...

    def head(self, url: RemoteURL, key: str) -> RemoteObject | None:
        """One object with its metadata (``sha256``), or None when it does not exist."""
        ...

    def upload(self, path: Path, url: RemoteURL, key: str, *, size: int, digests: Digests,
               expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        """Upload ``path`` (``size`` bytes, ``digests`` already computed) with ``gtrain-sha256`` metadata;
        ``expect`` is the object the listing showed under ``key`` (None: none). Returns the new object."""
        ...

    def download(self, url: RemoteURL, obj: RemoteObject, dest: Path, *,
                 progress: Callable[[int], None]) -> tuple[RemoteObject, Digests | None]:
        """Write ``obj``'s content to ``dest`` (a temp path). Returns the object as the GET saw it
        (metadata filled in) and the content's digests when computed while streaming (else None)."""
        ...

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        """Delete these keys (at most 1000)."""
        ...

    def close(self) -> None:
        ...


@dataclass(frozen=True)
class ProgressEvent:
    phase: Literal["list", "transfer", "delete", "done"]
    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int
    rate: float
    """bytes per second since the transfer phase began"""
    elapsed: float
    current: str | None = None


@dataclass(frozen=True)
class Action:
    kind: Literal["upload", "download", "delete-remote", "delete-local"]
    path: str
    """relative path (``/``-separated) under the local dir / remote prefix"""
    size: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "size": self.size, "reason": self.reason}


@dataclass
class SyncResult:
    src: str
    dst: str
    direction: Literal["upload", "download"]
    dry_run: bool = False
    uploaded: int = 0
    downloaded: int = 0
    skipped: int = 0
    deleted: int = 0
    hashed: int = 0
    """files read only to compare with the remote (not vouched for by the manifest)"""
    bytes: int = 0
    """bytes transferred (dry run: that would be)"""
    seconds: float = 0.0
    actions: list[Action] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "direction": self.direction, "dry_run": self.dry_run,
                "uploaded": self.uploaded, "downloaded": self.downloaded, "skipped": self.skipped,
                "deleted": self.deleted, "hashed": self.hashed, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "actions": [a.to_dict() for a in self.actions]}


@dataclass(frozen=True)
class _LocalFile:
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class _Entry:
    size: int
    mtime_ns: int
    sha256: str
    md5: str
    remote_version: str
    remote_size: int
    crc32c: str | None = None


# ---------------------------------------------------------------------------------------------- parsing


def parse_location(value: str, fld: str) -> Path | RemoteURL:
    """A local path, or ``s3://bucket[/prefix]`` / ``gs://bucket[/prefix]`` checked strictly."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{fld} is empty", hint="give a local directory or s3://BUCKET/PREFIX or gs://BUCKET/PREFIX",
                          field=fld)
    m = _URL_RE.match(value)
    if m is None:
        if _LOOKS_LIKE_URL_RE.match(value):
            raise ConfigError(f"{fld} {value!r} looks like a bucket URL but is malformed",
                              hint="write s3://BUCKET/PREFIX or gs://BUCKET/PREFIX", field=fld)
        if "\x00" in value:
            raise ConfigError(f"{fld} contains a NUL byte", field=fld)
        return Path(value).expanduser()
    scheme, rest = m.group(1), m.group(2)
    if scheme not in _SCHEMES:
        hint = "gtrain sync speaks s3:// and gs://"
        if scheme.lower() in _SCHEMES:
            hint = f"write the scheme in lower case: {scheme.lower()}://"
        elif scheme.lower() == "gcs":
            hint = "Google Cloud Storage URLs are gs://BUCKET/PREFIX"
        raise ConfigError(f"{fld} {value!r}: unsupported URL scheme {scheme!r}", hint=hint, field=fld)
    bucket, _, prefix = rest.partition("/")
    store = _SCHEMES[scheme]
    if not bucket:
        raise ConfigError(f"{fld} {value!r} has no bucket name", hint=f"write {scheme}://BUCKET/PREFIX", field=fld)
    ok = _S3_BUCKET_RE.match(bucket) if scheme == "s3" else _GCS_BUCKET_RE.match(bucket)
    if (not ok or ".." in bucket or _IP_RE.match(bucket)
            or (scheme == "gs" and any(len(p) > 63 for p in bucket.split(".")))):
        raise ConfigError(
            f"{fld} {value!r}: {bucket!r} is not a valid {store} bucket name",
            hint="bucket names are 3-63 lower-case letters, digits, '-' and '.'"
            + (" (and '_' on GCS)" if scheme == "gs" else ""), field=fld)
    if prefix.endswith("/"):
        prefix = prefix[:-1]
    if prefix:
        if _BAD_CHARS_RE.search(prefix):
            raise ConfigError(f"{fld} {value!r}: the prefix holds a control character or a backslash",
                              field=fld)
        parts = prefix.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"{fld} {value!r}: the prefix may not hold empty, '.' or '..' components",
                              hint=f"write {scheme}://{bucket}/some/prefix", field=fld)
    return RemoteURL(scheme, bucket, prefix)


def safe_rel_from_key(url: RemoteURL, key: str) -> str:
    """The relative local path for ``key``; SyncError for a key that would escape the destination."""
    rel = key[len(url.key_prefix):]
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or "\\" in rel or "\x00" in rel):
        raise SyncError(f"refusing remote key {key!r} in {url}: it would land outside the destination "
                        f"(empty, '.', '..' or absolute path components)",
                        hint="rename or remove the object; nothing was downloaded")
    return rel


# ---------------------------------------------------------------------------------------------- local side


def gtrain_home() -> Path:
    return Path(os.environ.get("GTRAIN_HOME") or Path.home() / ".gtrain").expanduser()


def hash_file(path: Path) -> Digests:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return Digests(sha.hexdigest(), md5.hexdigest())


def _is_tmp(name: str) -> bool:
    return TMP_TAG in name and bool(_TMP_RE.match(name))


def _scan_local(root: Path) -> dict[str, _LocalFile]:
    """Regular files under ``root`` (symlinks to files followed, symlinked directories not entered,
    our own temp files and gtrain pull's staging folder left out), keyed by ``/``-separated relative path."""
    out: dict[str, _LocalFile] = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        base = os.path.relpath(dirpath, root)
        for name in filenames:
            if _is_tmp(name):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:  # vanished, or a dangling symlink
                continue
            if not _stat_is_file(st):
                continue
            rel = name if base == "." else f"{base.replace(os.sep, '/')}/{name}"
            out[rel] = _LocalFile(st.st_size, st.st_mtime_ns)
    return out


def _stat_is_file(st: os.stat_result) -> bool:
    import stat as _stat

    return _stat.S_ISREG(st.st_mode)


def _clean_tmp(root: Path) -> int:
    n = 0
    if not root.is_dir():
        return 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in filenames:
            if _is_tmp(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))
                    n += 1
    return n


# ---------------------------------------------------------------------------------------------- manifest


class _Manifest:
    """Per (local dir, remote URL) record of files known to match their remote object. A cache: a lost or
    unreadable manifest only costs a re-read of local files, never a wrong skip."""

    def __init__(self, local: Path, url: RemoteURL, *, readonly: bool) -> None:
        ident = f"{os.path.realpath(local)}\x00{url}"
        digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        self.dir = gtrain_home() / "sync"
        self.path = self.dir / f"{digest}.sqlite"
        self.readonly = readonly
        self.entries: dict[str, _Entry] = {}
        self._pending: dict[str, _Entry | None] = {}
        self._lock_fd: int | None = None
        self._db: sqlite3.Connection | None = None
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
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                       [("local", os.path.realpath(local)), ("remote", str(url)), ("schema", "1")])
        self._load(db)
        return db

    def _load(self, db: sqlite3.Connection) -> None:
        rows = db.execute("SELECT rel, size, mtime_ns, sha256, md5, remote_version, remote_size, crc32c FROM files")
        self.entries = {r[0]: _Entry(*r[1:]) for r in rows}

    def put(self, rel: str, entry: _Entry) -> None:
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

    def close(self) -> None:
        try:
            if self._db is not None:
                self.flush()
                self._db.close()
        finally:
            self._db = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


# ---------------------------------------------------------------------------------------------- progress


class _Progress:
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


# ---------------------------------------------------------------------------------------------- backends


def make_backend(url: RemoteURL, *, fld: str, client_factory: Callable[[], Any] | None = None,
                 workers: int = DEFAULT_WORKERS, multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
                 part_size: int = DEFAULT_PART_SIZE) -> Backend:
    client = client_factory() if client_factory is not None else None
    if url.scheme == "s3":
        from gtrain.sync.s3 import S3Backend

        return S3Backend(client, fld=fld, workers=workers, multipart_threshold=multipart_threshold,
                         part_size=part_size)
    from gtrain.sync.gcs import GCSBackend

    return GCSBackend(client, fld=fld, workers=workers, multipart_threshold=multipart_threshold,
                      part_size=part_size)


# ---------------------------------------------------------------------------------------------- the engine


def sync(src: str, dst: str, *, delete: bool = False, dry_run: bool = False, workers: int = DEFAULT_WORKERS,
         on_progress: Callable[[ProgressEvent], None] | None = None, client_factory: Callable[[], Any] | None = None,
         multipart_threshold: int | None = None, part_size: int | None = None) -> SyncResult:
    """Make ``dst`` hold what ``src`` holds (one side a local directory, the other ``s3://``/``gs://``).

    ``delete`` also removes what ``dst`` holds beyond ``src`` (within the prefix / directory only);
    ``dry_run`` plans (and may read local files to compare) but changes nothing, the plan in
    ``result.actions``. ``client_factory`` returns the SDK client to use (boto3 S3 client or
    google.cloud.storage.Client); default: built from the environment. ``multipart_threshold`` /
    ``part_size`` tune the SDKs' multipart/chunked transfers (defaults 32 MiB / 16 MiB).
    """
    t0 = time.monotonic()
    s, d = parse_location(src, "SRC"), parse_location(dst, "DST")
    if isinstance(s, RemoteURL) and isinstance(d, RemoteURL):
        raise ConfigError(f"cannot sync {src} to {dst}: bucket-to-bucket sync is not supported",
                          hint="one side must be a local directory", field="DST")
    if not isinstance(s, RemoteURL) and not isinstance(d, RemoteURL):
        raise ConfigError(f"cannot sync {src} to {dst}: neither side is a bucket URL",
                          hint="one side must be s3://BUCKET/PREFIX or gs://BUCKET/PREFIX (use rsync for local copies)",
                          field="DST")
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, not {workers}", field="workers")
    threshold = DEFAULT_MULTIPART_THRESHOLD if multipart_threshold is None else multipart_threshold
    psize = DEFAULT_PART_SIZE if part_size is None else part_size
    if psize < 256 * 1024 or threshold < 1:
        raise ConfigError(f"part_size must be at least 256 KiB (got {psize})", field="part_size")

    if isinstance(d, RemoteURL):
        assert isinstance(s, Path)
        local, url, direction, rfld = s, d, "upload", "DST"
        if not local.exists():
            raise ConfigError(f"SRC {src!r} does not exist", field="SRC")
        if not local.is_dir():
            raise ConfigError(f"SRC {src!r} is not a directory", hint="gtrain sync mirrors directories", field="SRC")
    else:
        assert isinstance(s, RemoteURL) and isinstance(d, Path)
        local, url, direction, rfld = d, s, "download", "SRC"
        if local.exists() and not local.is_dir():
            raise ConfigError(f"DST {dst!r} exists and is not a directory", field="DST")

    result = SyncResult(src=src, dst=dst, direction=direction, dry_run=dry_run)  # type: ignore[arg-type]
    backend = make_backend(url, fld=rfld, client_factory=client_factory, workers=workers,
                           multipart_threshold=threshold, part_size=psize)
    try:
        manifest = _Manifest(local, url, readonly=dry_run)
        try:
            _Engine(local, url, direction, backend, manifest, result, delete=delete, dry_run=dry_run,
                    workers=workers, progress=_Progress(on_progress)).run()
        finally:
            manifest.close()
    finally:
        backend.close()
    result.actions.sort(key=lambda a: (a.kind, a.path))
    result.seconds = time.monotonic() - t0
    return result


class _Engine:
    def __init__(self, local: Path, url: RemoteURL, direction: str, backend: Backend, manifest: _Manifest,
                 result: SyncResult, *, delete: bool, dry_run: bool, workers: int, progress: _Progress) -> None:
        self.local, self.url, self.direction, self.backend = local, url, direction, backend
        self.manifest, self.result, self.delete, self.dry_run = manifest, result, delete, dry_run
        self.workers, self.progress = workers, progress
        self.lock = threading.Lock()
        self.remote: dict[str, RemoteObject] = {}
        self.local_files: dict[str, _LocalFile] = {}
        self.real_root = os.path.realpath(local)
        self.safe_dirs: set[Path] = set()

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
            _clean_tmp(self.local)
        self.local_files = _scan_local(self.local)

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
    def _unchanged(lf: _LocalFile, obj: RemoteObject, e: _Entry) -> bool:
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
        last_flush = time.monotonic()
        pool = ThreadPoolExecutor(max_workers=min(self.workers, len(work)), thread_name_prefix="gtrain-sync")
        try:
            futures: dict[Future[_Entry | None], str] = {pool.submit(task, rel): rel for rel in work}
            pending: set[Future[_Entry | None]] = set(futures)
            while pending:
                done, pending = wait(pending, timeout=_MANIFEST_FLUSH_S, return_when=FIRST_COMPLETED)
                for fut in done:
                    rel = futures[fut]
                    exc = fut.exception()
                    if exc is None:
                        entry = fut.result()
                        if entry is not None:
                            self.manifest.put(rel, entry)
                    elif isinstance(exc, SyncError):
                        failures.append((rel, exc))
                    else:  # a missing bucket, bad credentials, a bug: stop everything
                        for f in pending:
                            f.cancel()
                        raise exc
                if time.monotonic() - last_flush >= _MANIFEST_FLUSH_S:
                    self.manifest.flush()
                    last_flush = time.monotonic()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self.manifest.flush()
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
        digests = hash_file(path)
        with self.lock:
            self.result.hashed += 1
        return digests, self._same(digests, obj)

    def _upload_one(self, rel: str) -> _Entry | None:
        path = self.local / rel
        key = self.url.key(rel)
        obj = self.remote.get(rel)
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
            if digests is None:
                digests = hash_file(path)
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

    def _download_one(self, rel: str) -> _Entry | None:
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
            tmp = parent / f".{final.name}.{os.urandom(4).hex()}{TMP_TAG}"
            try:
                got, digests = self.backend.download(self.url, obj, tmp,
                                                     progress=lambda n: self.progress.add_bytes(n, rel))
                size = os.stat(tmp).st_size
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
            finally:
                _unlink_tmp(tmp)
            st = os.stat(final)
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
    def _entry(st: os.stat_result, digests: Digests, obj: RemoteObject) -> _Entry:
        return _Entry(st.st_size, st.st_mtime_ns, digests.sha256, digests.md5, obj.version, obj.size, obj.crc32c)

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


def _unlink_tmp(tmp: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    # an SDK that stages into "<tmp>.<random>" (s3transfer) may leave its own temp behind on failure
    with contextlib.suppress(OSError):
        for leftover in tmp.parent.glob(tmp.name + ".*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


__all__ = ["Action", "Backend", "Digests", "ProgressEvent", "RemoteObject", "RemoteURL", "SyncResult",
           "hash_file", "parse_location", "safe_rel_from_key", "sync", "META_SHA256"]
