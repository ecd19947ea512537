"""What of the launcher's lines reaches the screen while following a job."""

from __future__ import annotations

from gtrain.cli.screen import Screen

# node 1's torchrun when node 0 (which held the c10d store) ended first: a chained traceback through
# torch/distributed, as seen in a failed 2-node run
STORE_GONE = """Traceback (most recent call last):
  File "/venv/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 114
    return getattr(self._store, store_op)(*args, **kwargs)
torch.distributed.DistNetworkError: Connection reset by peer

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 900, in main
    run(args)
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed.
after the report""".splitlines()


def test_torchruns_own_chained_traceback_is_one_line_per_exception() -> None:
    s = Screen()
    shown = [t for line in STORE_GONE for t in s.feed(1, None, line)]
    assert not any("Traceback" in t or "File " in t or "above exception" in t for t in shown), shown
    assert shown[-1] == "after the report"
    assert any("DistNetworkError: Connection reset by peer" in t for t in shown)
    assert any("RendezvousConnectionError" in t for t in shown)
    kept = s.last_lines(1, None)
    assert kept == shown


def test_a_users_traceback_is_shown_whole() -> None:
    s = Screen()
    lines = ["Traceback (most recent call last):", '  File "/work/train.py", line 3, in <module>',
             "    main()", "ValueError: bad batch", "next"]
    assert [t for line in lines for t in s.feed(0, None, line)] == lines


def test_without_collapse_every_line_shows() -> None:
    s = Screen(collapse=False)
    assert [t for line in STORE_GONE for t in s.feed(1, None, line)] == STORE_GONE


# torchrun's agent logging "Received 15 death signal" as gtrain stopped the surviving node, its stderr closed:
# CPython's logging.Handler.handleError block (the shape of a real one, Python 3.11)
LOGGING_ERROR = """--- Logging error ---
Traceback (most recent call last):
  File "/usr/lib/python3.11/logging/__init__.py", line 1113, in emit
    stream.write(msg + self.terminator)
BrokenPipeError: [Errno 32] Broken pipe
Call stack:
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/torch/distributed/elastic/multiprocessing/api.py", line 84, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
Message: 'Received %s death signal, shutting down workers'
Arguments: (<Signals.SIGTERM: 15>,)
after the block""".splitlines()


def test_a_launchers_logging_error_block_is_one_line_and_the_log_keeps_it() -> None:
    s = Screen()
    shown = [t for line in LOGGING_ERROR for t in s.feed(0, None, line)]
    assert shown == ["launcher: could not log 'Received %s death signal, shutting down workers' (BrokenPipeError: "
                     "its output was closed under it); the traceback is in the log", "after the block"]
    # two in a row, and a rank's own lines are never held back
    again = [t for line in LOGGING_ERROR[:-1] * 2 for t in s.feed(1, None, line)]
    assert len(again) == 2
    assert s.feed(1, 3, "--- Logging error ---") == ["--- Logging error ---"]
    # without collapse (`logs`), every line as the log has it
    plain = Screen(collapse=False)
    assert [t for line in LOGGING_ERROR for t in plain.feed(0, None, line)] == LOGGING_ERROR


def test_an_unfinished_logging_error_block_is_flushed_whole() -> None:
    s = Screen()
    assert [t for line in LOGGING_ERROR[:4] for t in s.feed(0, None, line)] == []
    assert s.flush() == LOGGING_ERROR[:4]
