"""The data of a sync: where the remote side is (:class:`RemoteURL`), what a store holds (:class:`RemoteObject`),
what a store must do (:class:`Backend`, implemented in ``gtrain.sync.s3`` / ``gtrain.sync.gcs``), and what a
sync reports (:class:`ProgressEvent`, :class:`Action`, :class:`SyncResult`). Pure data: no I/O, no SDK."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

META_SHA256 = "gtrain-sha256"
"""Object metadata key holding the hex sha256 of the content, written on upload, checked on download."""

MiB = 1024 * 1024
DEFAULT_WORKERS = 16
DEFAULT_MULTIPART_THRESHOLD = 32 * MiB
DEFAULT_PART_SIZE = 16 * MiB


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
