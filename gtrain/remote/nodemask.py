"""Masks a job's secrets in its output at the source, on the node (stdlib only: shipped into the job folder as
``mask.py`` and run by ``rank.sh``/``launch.sh`` as ``python mask.py 3<RECORDS``, and imported by the Ray driver).

The secret values come on file descriptor 3 as the NUL-separated ``NAME=value`` records every node script reads
(never in argv, the environment or a file). Standard input is copied to standard output with every occurrence of
a value replaced by :data:`MASK`, in its raw form and these encodings (:func:`forms`): base64 (standard and
urlsafe, padded or not, at each of the three byte alignments it can have inside a longer encoded text), hex
(lower and upper case), URL percent-encoding (``quote``/``quote_plus``, upper or lower hex digits) and JSON
string escapes (ASCII-only or not). Values shorter than :data:`MIN_LEN` are not masked (as ``gtrain.redact``).

No added latency: whatever arrives is written at once, except a tail that could be the start of a form (held
until the next bytes decide it, or the end of input), so progress bars (``\\r``) and binary output pass through.
TERM/INT/HUP are ignored: the filter ends when its writers have closed the pipe, its last bytes written.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import urllib.parse

MASK = b"***"
MIN_LEN = 4


def _b64_cores(raw: bytes, encode: object) -> set[bytes]:
    """The base64 characters that depend only on ``raw``, for each alignment (0, 1, 2) it can have in a longer
    input, and the padded encoding of ``raw`` alone."""
    enc = encode  # base64.b64encode or urlsafe_b64encode
    out = {enc(raw)}  # type: ignore[operator]
    n = len(raw)
    for a in range(3):
        full = enc(b"\0" * a + raw + b"\0\0\0").rstrip(b"=")  # type: ignore[operator]
        start = -(-8 * a // 6)
        end = (8 * a + 8 * n) // 6
        out.add(full[start:end])
    return out


def forms(value: str | bytes) -> set[bytes]:
    """Every form of one secret value this module masks, as bytes (empty for a value under MIN_LEN)."""
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    if len(raw) < MIN_LEN:
        return set()
    text = raw.decode("utf-8", "surrogateescape")
    out = {raw, raw.hex().encode(), raw.hex().upper().encode()}
    out |= _b64_cores(raw, base64.b64encode) | _b64_cores(raw, base64.urlsafe_b64encode)
    for q in (urllib.parse.quote(raw, safe=""), urllib.parse.quote_plus(raw, safe=""), urllib.parse.quote(raw)):
        out.add(q.encode())
        out.add(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), q).encode())
    for ascii_only in (True, False):
        try:
            out.add(json.dumps(text, ensure_ascii=ascii_only)[1:-1].encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            pass
    return {f for f in out if len(f) >= MIN_LEN}


class Masker:
    """Streams bytes through, masking every form of the given values (see the module's docstring)."""

    def __init__(self, values: list[str] | list[bytes]) -> None:
        found: set[bytes] = set()
        for v in values:
            found |= forms(v)
        self.forms = sorted(found, key=len, reverse=True)
        self.pattern = re.compile(b"|".join(re.escape(f) for f in self.forms)) if self.forms else None
        self.buf = b""

    def _hold(self, data: bytes, start: int) -> int:
        """Where the tail that could begin a form (or continue the last match into a longer one) starts."""
        for i in range(max(start, len(data) - (len(self.forms[0]) - 1)), len(data)):
            tail = data[i:]
            if any(len(f) > len(tail) and f.startswith(tail) for f in self.forms):
                return i
        return len(data)

    def feed(self, chunk: bytes) -> bytes:
        if self.pattern is None:
            return chunk
        data = self.buf + chunk
        last = 0
        for m in self.pattern.finditer(data):
            last = m.start()
        cut = self._hold(data, last)
        self.buf = data[cut:]
        return self.pattern.sub(MASK, data[:cut])

    def text(self, line: str) -> str:
        """One complete piece of text, masked (the Ray driver's lines)."""
        if self.pattern is None:
            return line
        return self.pattern.sub(MASK, line.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def close(self) -> bytes:
        data, self.buf = self.buf, b""
        return self.pattern.sub(MASK, data) if self.pattern is not None else data


def read_records(fd: int) -> list[str]:
    """The values of the NUL-separated ``NAME=value`` records on ``fd`` (read to its end, then closed)."""
    chunks = []
    with os.fdopen(fd, "rb") as f:
        chunks.append(f.read())
    return [r.partition(b"=")[2].decode("utf-8", "surrogateescape") for r in b"".join(chunks).split(b"\0") if r]


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        values = read_records(3)
    except OSError:
        values = []
    masker = Masker(values)
    while True:
        try:
            chunk = os.read(0, 1 << 16)
        except InterruptedError:
            continue
        if not chunk:
            break
        _write(1, masker.feed(chunk))
    _write(1, masker.close())
    return 0


if __name__ == "__main__":
    sys.exit(main())
