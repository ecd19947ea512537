"""What gtrain keeps of a run and shows of it: metric parsers (:mod:`.parse`), the archive under
``$GTRAIN_HOME/runs/`` (:mod:`.archive`), the report's data model (:mod:`.model`), the HTML report
(:mod:`.html`, :mod:`.svg`), terminal charts (:mod:`.plot`) and the calls the commands make (:mod:`.service`).

Entry points for the rest of gtrain: :func:`gtrain.runlog.archive.archive_job`,
:func:`gtrain.runlog.archive.record_event`, :func:`gtrain.runlog.archive.logs_from_archive`,
:func:`gtrain.runlog.service.write_report` and :func:`node_files` (what a node needs to ``import gtrain.metrics``).
"""

from __future__ import annotations

from pathlib import Path


def node_files() -> dict[str, str]:
    """Job-dir-relative path -> text: a copy of :mod:`gtrain.metrics` under ``py/gtrain/`` (rank.sh puts ``py`` at
    the end of PYTHONPATH). No ``__init__.py``: it is a namespace portion, so an installed gtrain wins over it."""
    import gtrain.metrics

    return {"py/gtrain/metrics.py": Path(gtrain.metrics.__file__).read_text(encoding="utf-8")}
