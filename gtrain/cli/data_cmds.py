"""gtrain sync: data between this machine and S3 / GCS / Azure Blob. The Typer signature only: the body is
``gtrain/cli/sync_run.py``, which the fast path (``gtrain/cli/fast.py``) calls too."""

from __future__ import annotations

import typer

from gtrain.cli.params import JSON


def register(app: typer.Typer) -> None:
    app.command("sync")(sync)


def sync(
    src: str = typer.Argument(..., metavar="SRC", show_default=False,
                              help="A local folder, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix."),
    dst: str = typer.Argument(..., metavar="DST", show_default=False,
                              help="The other side: one of SRC and DST is local, the other a bucket URL."),
    delete: bool = typer.Option(False, "--delete", help="Mirror: delete destination files the source lacks."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would move; change nothing."),
    workers: int = typer.Option(16, "--workers", min=1, max=128, metavar="N", help="Parallel transfers."),
    json_: bool = JSON,
) -> None:
    """Incremental, parallel, checksum-verified sync; an interrupted sync resumes."""
    from gtrain.cli.sync_run import run_sync

    run_sync(src, dst, delete=delete, dry_run=dry_run, workers=workers, json_=json_)
