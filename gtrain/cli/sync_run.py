"""The body of ``gtrain sync``, with no typer in it: the Typer command (``gtrain/cli/data_cmds.py``) and the fast
path (``gtrain/cli/fast.py``) both call :func:`run_sync`. Errors are raised as they come (``gtrain/cli/app.py``
turns them into messages and exit codes).

Progress goes to stderr: a bar (bytes, files, rate, ETA) on a terminal (rich, imported only then); otherwise (CI
logs, a pipe) one line every ``GTRAIN_PROGRESS_SECONDS`` (default 5) seconds and one at the end, never silence."""

from __future__ import annotations

import os
import sys
import time

from gtrain.cli import output as out


def run_sync(src: str, dst: str, *, delete: bool, dry_run: bool, workers: int, json_: bool) -> None:
    """`gtrain sync SRC DST [--delete] [--dry-run] [--workers N] [--json]`."""
    from gtrain.sync.objstore import sync as do_sync

    out.set_json(json_)
    bar: _Bar | _Lines | None = None
    if not json_:
        bar = _Bar() if sys.stderr.isatty() else _Lines(_interval())
    try:
        res = do_sync(src, dst, delete=delete, dry_run=dry_run, workers=workers, on_progress=bar)
    finally:
        if bar:
            bar.close()
    if json_:
        out.emit_json(res.to_dict())
        return
    if dry_run:
        for a in res.actions:
            out.say(f"would {a.kind} {a.path} ({a.size:,} bytes): {a.reason}")
    verb = "would move" if dry_run else "moved"
    out.say(
        f"{verb}: {res.uploaded} up, {res.downloaded} down, {res.deleted} deleted, {res.skipped} unchanged; "
        f"{res.bytes:,} bytes in {res.seconds:.2f}s")


class _Bar:
    """A rich progress bar on stderr (TTY only): bytes, files and rate."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.p = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                          TextColumn("{task.fields[files]}"), TimeRemainingColumn(), transient=True,
                          console=out.rich_console(stderr=True))
        self.task = self.p.add_task("sync", total=None, files="")
        self.p.start()

    def __call__(self, ev: object) -> None:
        self.p.update(self.task, completed=getattr(ev, "bytes_done", 0), total=getattr(ev, "bytes_total", None) or None,
                      description=str(getattr(ev, "phase", "sync")),
                      files=f"{getattr(ev, 'files_done', 0)}/{getattr(ev, 'files_total', 0)} files")

    def close(self) -> None:
        self.p.stop()


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("GTRAIN_PROGRESS_SECONDS", "5")))
    except ValueError:
        return 5.0


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def progress_line(ev: object) -> str:
    """``sync: transfer 12.0 MiB / 200.0 MiB (6%), 120/1001 files, 45.6 MiB/s, ETA 4s``"""
    done, total = getattr(ev, "bytes_done", 0), getattr(ev, "bytes_total", 0)
    rate = getattr(ev, "rate", 0.0)
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    eta = f", ETA {(total - done) / rate:.0f}s" if rate > 0 and total > done else ""
    return (f"sync: {getattr(ev, 'phase', '?')} {fmt_bytes(done)} / {fmt_bytes(total)}{pct}, "
            f"{getattr(ev, 'files_done', 0)}/{getattr(ev, 'files_total', 0)} files, {fmt_bytes(rate)}/s{eta}")


class _Lines:
    """Not a terminal (CI logs, a pipe): one progress line on stderr every ``interval`` seconds and one for
    the end of the transfers."""

    def __init__(self, interval: float) -> None:
        self.interval, self.clock = interval, time.monotonic
        self.next = self.clock() + interval
        self.last: object | None = None

    def __call__(self, ev: object) -> None:
        self.last = ev
        now = self.clock()
        if getattr(ev, "phase", "") == "done" or now >= self.next:
            self.next = now + self.interval
            out.err(progress_line(ev))
            self.last = None

    def close(self) -> None:
        if self.last is not None:  # interrupted or failed: where it got to
            out.err(progress_line(self.last))
