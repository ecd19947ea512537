"""What gtrain keeps of a run and shows of it: metric parsers (:mod:`.parse`), the archive under
``$GTRAIN_HOME/runs/`` (:mod:`.archive`), the report's data model (:mod:`.model`), the HTML report
(:mod:`.html`, :mod:`.svg`), terminal charts (:mod:`.plot`) and the calls the commands make (:mod:`.service`).

Entry points for the rest of gtrain: :func:`gtrain.runlog.archive.archive_job`,
:func:`gtrain.runlog.archive.record_event`, :func:`gtrain.runlog.archive.logs_from_archive`,
:func:`gtrain.runlog.service.write_report`. What a node
needs to ``import gtrain.metrics`` is :func:`gtrain.jobs.render.metrics_files`.
"""
