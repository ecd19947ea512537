"""Secret values never leave gtrain in anything it stores, prints or writes.

A process-wide set of secret *values*: ``register_secrets(names)`` adds the values that ``job.secrets`` names
have in this process's environment (gtrain is launched with them there). :func:`scrub` replaces each value,
and its URL-encoded, JSON-escaped and base64 forms, with ``***``; :func:`scrub_obj` does that to every string
in a JSON-like object (keys too). The state store scrubs every row it writes, every :class:`GtrainError`
scrubs its message and hint, and :class:`RedactingReporter` scrubs every line shown to the user.

Values shorter than :data:`MIN_LEN` characters are not registered: replacing every ``1`` or ``ab`` in logs
would mangle them and hide nothing (a 3-character secret is not one). Redaction is by exact text: a value a
program transforms some other way (hex, hashed, split over lines) is not recognised.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.events import Reporter

if TYPE_CHECKING:
    import re

MIN_LEN = 4
MASK = "***"

_lock = threading.Lock()
_values: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _forms(value: str) -> set[str]:
    import base64
    import json
    import urllib.parse

    forms = {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value, safe=""),
             urllib.parse.quote(value), json.dumps(value)[1:-1]}
    raw = value.encode()
    for enc in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        b64 = enc.decode()
        forms.add(b64)
        forms.add(b64.rstrip("="))
    return {f for f in forms if len(f) >= MIN_LEN}


def register(value: str | None) -> bool:
    """Add one secret value; False (and nothing registered) when it is empty or shorter than MIN_LEN."""
    global _pattern
    if not value or len(value) < MIN_LEN:
        return False
    with _lock:
        if value not in _values:
            _values.add(value)
            _pattern = None
    return True


def register_secrets(names: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Register the values the environment variables ``names`` hold; returns the names registered."""
    env = os.environ if environ is None else environ
    return [n for n in names if register(env.get(n))]


def clear() -> None:
    """Forget every registered value (tests; a long-lived process between unrelated jobs)."""
    global _pattern
    with _lock:
        _values.clear()
        _pattern = None


def active() -> bool:
    return bool(_values)


def _compiled() -> re.Pattern[str] | None:
    import re

    global _pattern
    with _lock:
        if _pattern is None and _values:
            forms = set().union(*(_forms(v) for v in _values))
            # longest first: a secret that contains another is masked whole
            _pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=lambda f: (-len(f), f))))
        return _pattern


def scrub(text: str) -> str:
    """``text`` with every registered secret (and its encoded forms) replaced by ``***``."""
    if not _values or not text or not isinstance(text, str):
        return text
    pat = _compiled()
    return pat.sub(MASK, text) if pat is not None else text


def scrub_bytes(data: bytes) -> bytes:
    """``data`` with every registered secret's forms (as UTF-8 bytes) replaced by ``***``: files gtrain keeps
    as bytes (the metric files it archives)."""
    if not _values or not data:
        return data
    import re

    pat = _compiled()
    if pat is None:
        return data
    bpat = re.compile(pat.pattern.encode())
    return bpat.sub(MASK.encode(), data)


def scrub_obj(obj: Any) -> Any:
    """A copy of a JSON-like object with :func:`scrub` applied to every string in it, keys included."""
    if not _values:
        return obj
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, Mapping):
        return {scrub(k) if isinstance(k, str) else k: scrub_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_obj(v) for v in obj]
    return obj


def secure_home(home: Path, db: Path) -> None:
    """``home`` 0700 and the database files 0600 (created so before SQLite opens them)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        st = home.stat()
        mine = st.st_uid == os.geteuid()
        shared = st.st_mode & 0o1000 or home.resolve() == Path.home().resolve()
        if mine and not shared and st.st_mode & 0o077:
            os.chmod(home, 0o700)
    except OSError:
        pass  # not ours to change; the files below are still made private
    if not db.exists():
        os.close(os.open(db, os.O_RDWR | os.O_CREAT, 0o600))
    for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        try:
            if p.stat().st_mode & 0o077:
                os.chmod(p, 0o600)
        except OSError:
            pass


class RedactingReporter(Reporter):
    """Wraps a reporter so that nothing it is handed shows a secret."""

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner

    def info(self, msg: str) -> None:
        self.inner.info(scrub(msg))

    def warn(self, msg: str) -> None:
        self.inner.warn(scrub(msg))

    def node(self, rank: int, msg: str) -> None:
        self.inner.node(rank, scrub(msg))

    def line(self, node: int, rank: int | None, text: str) -> None:
        self.inner.line(node, rank, scrub(text))

    def __getattr__(self, name: str) -> Any:  # anything else a CLI reporter offers (progress bars, …)
        return getattr(self.inner, name)
