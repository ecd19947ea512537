"""gtrain sync: data between this machine and S3 / GCS."""

from __future__ import annotations

import typer

from gtrain.cli import output as out
from gtrain.cli.params import JSON


def register(app: typer.Typer) -> None:
    app.command("sync")(sync)


def sync(
    src: str = typer.Argument(..., metavar="SRC", help="A local folder, s3://bucket/prefix or gs://bucket/prefix.",
                              show_default=False),
    dst: str = typer.Argument(..., metavar="DST", show_default=False,
                              help="The other side: one of SRC and DST is local, the other a bucket URL."),
    delete: bool = typer.Option(False, "--delete", help="Mirror: delete destination files the source lacks."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would move; change nothing."),
    workers: int = typer.Option(16, "--workers", min=1, max=128, metavar="N", help="Parallel transfers."),
    json_: bool = JSON,
) -> None:
    """Incremental, parallel, checksum-verified sync; an interrupted sync resumes."""
    import sys

    from gtrain.sync.objstore import sync as do_sync

    out.set_json(json_)
    bar = _Bar() if sys.stderr.isatty() and not json_ else None
    res = do_sync(src, dst, delete=delete, dry_run=dry_run, workers=workers, on_progress=bar)
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
