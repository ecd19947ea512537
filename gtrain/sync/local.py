"""The local side of a sync: scanning a directory, hashing files, our temp files (named so that only we
match them, cleaned up by the next sync) and the check that keeps a remote key inside the destination."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

from gtrain.errors import SyncError
from gtrain.sync.model import Digests, RemoteURL

TMP_TAG = ".gtrain-part"
"""Temp downloads are ``.<name>.<random>.gtrain-part`` next to the final file (older versions let an SDK add a
suffix of its own: such leftovers are still recognised and cleaned)."""
_TMP_RE = re.compile(r"^\..+\.[0-9a-f]{8}\.gtrain-part(\.[A-Za-z0-9]+)?$")
_SKIP_DIRS = {".gtrain-partial"}  # gtrain pull's staging folder
_HASH_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class LocalFile:
    size: int
    mtime_ns: int


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


def hash_file(path: Path, *, md5: bool = True) -> Digests:
    """sha256 and (unless ``md5=False``: then "") md5 of a file (one descriptor, unbuffered reads: few
    syscalls for a small file)."""
    sha, m = hashlib.sha256(), hashlib.md5(usedforsecurity=False) if md5 else None
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        while chunk := os.read(fd, _HASH_CHUNK):
            sha.update(chunk)
            if m is not None:
                m.update(chunk)
    finally:
        os.close(fd)
    return Digests(sha.hexdigest(), m.hexdigest() if m is not None else "")


def is_tmp(name: str) -> bool:
    return TMP_TAG in name and bool(_TMP_RE.match(name))


def scan_local(root: Path) -> dict[str, LocalFile]:
    """Regular files under ``root`` (symlinks to files followed, symlinked directories not entered,
    our own temp files and gtrain pull's staging folder left out), keyed by ``/``-separated relative path."""
    out: dict[str, LocalFile] = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        base = os.path.relpath(dirpath, root)
        for name in filenames:
            if is_tmp(name):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:  # vanished, or a dangling symlink
                continue
            if not _stat_is_file(st):
                continue
            rel = name if base == "." else f"{base.replace(os.sep, '/')}/{name}"
            out[rel] = LocalFile(st.st_size, st.st_mtime_ns)
    return out


def _stat_is_file(st: os.stat_result) -> bool:
    import stat as _stat

    return _stat.S_ISREG(st.st_mode)


def clean_tmp(root: Path) -> int:
    n = 0
    if not root.is_dir():
        return 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in filenames:
            if is_tmp(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))
                    n += 1
    return n


def tmp_path(final: Path) -> Path:
    """A fresh temp path next to ``final`` that :func:`is_tmp` recognises."""
    return final.parent / f".{final.name}.{random.getrandbits(32):08x}{TMP_TAG}"  # no syscall, unlike urandom


def unlink_tmp(tmp: Path) -> None:
    """Remove a temp download (gone already after a successful rename: one failed syscall, no scan)."""
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
