"""Identical lines of many ranks folded into one on the screen (gtrain.cli.fold), errors never."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from gtrain.cli.fold import Folder, is_error, ranges


def play(events: list[tuple[float, int, int | None, str]], folder: Folder | None = None,
         end: float | None = None) -> list[str]:
    """Feed (time, node, rank, text) in order, ticking at each; the screen's lines."""
    f = folder or Folder()
    shown = []
    for t, node, rank, text in events:
        shown += [o.line() for o in f.feed(node, rank, text, t)]
    if end is not None:
        shown += [o.line() for o in f.tick(end)]
    shown += [o.line() for o in f.flush()]
    return shown


def test_ranges_fold_like_a_nodeset() -> None:
    assert ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert ranges([5]) == "5"
    assert ranges(range(0, 40, 2), max_runs=3) == "0,2,4,... (20 in all)"


def test_64_ranks_printing_the_same_line_show_it_once() -> None:
    # 4 nodes x 16 ranks, arriving over 0.3 s in node order
    ev = [(r * 0.005, r // 16, r, "loss 2.31") for r in range(64)]
    assert play(ev) == ["[ranks 0-63] loss 2.31"]


def test_a_line_only_some_ranks_print_shows_with_those_ranks_and_rank_0_stays_whole() -> None:
    ev = [(0.0, 0, 0, "epoch 1 done"), (0.01, 0, 0, "saved checkpoint step-10")]
    ev += [(0.02 + r * 0.001, r // 8, r, "epoch 1 done") for r in range(1, 16)]
    ev += [(0.05, 1, 9, "data shard 9 slow: 3.1 s")]
    assert play(ev) == ["[ranks 0-15] epoch 1 done", "[node 0 rank 0] saved checkpoint step-10",
                        "[node 1 rank 9] data shard 9 slow: 3.1 s"]


def test_an_error_on_one_rank_shows_that_ranks_lines_in_full_in_order() -> None:
    f = Folder(start_s=0)
    for r in range(40):
        assert f.feed(r // 16, r, "step 10", 0.001 * r) == []
    tb = ["Traceback (most recent call last):", '  File "/w/train.py", line 9, in <module>', "    step()",
          "", "RuntimeError: CUDA error: an illegal memory access was encountered"]
    shown = [o.line() for line in tb for o in f.feed(2, 37, line, 0.1)]
    assert shown == []  # behind the group rank 37's earlier line is in: the order of its lines is kept
    for r in range(40, 64):  # the other ranks go on joining the open group: it is not cut short
        f.feed(r // 16, r, "step 10", 0.1 + 0.001 * r)
    shown = [o.line() for o in f.tick(0.7)]
    assert shown == ["[ranks 0-63] step 10"] + [f"[node 2 rank 37] {line}" for line in tb]
    assert [o.line() for o in f.feed(2, 37, "after", 0.8)] == []  # the traceback is over: folding again


def test_an_error_with_nothing_held_shows_at_once() -> None:
    f = Folder()
    assert [o.line() for o in f.feed(0, 3, "ValueError: x", 5.0)] == ["[node 0 rank 3] ValueError: x"]


def test_errors_from_every_rank_are_never_folded() -> None:
    ev = [(0.001 * r, r // 4, r, "torch.OutOfMemoryError: CUDA out of memory") for r in range(8)]
    assert play(ev) == [f"[node {r // 4} rank {r}] torch.OutOfMemoryError: CUDA out of memory" for r in range(8)]


@pytest.mark.parametrize("text", ["ValueError: bad", "Exception: x", "ERROR 12-06 NCCL", "error: cannot open",
                                  "worker exited with exit code 1", "[gtrain] node 1 python exited 1",
                                  "exit status: 2", "Segmentation fault (core dumped)", "Killed",
                                  "E1206 12:00:01.1 123 ProcessGroupNCCL.cpp] timeout", "x NCCL WARN y",
                                  "The above exception was the direct cause of the following exception:"])
def test_what_looks_like_an_error(text: str) -> None:
    assert is_error(text)


@pytest.mark.parametrize("text", ["loss 2.31 error_rate 0.1", "errors: 0", "exit code 0", "node 0 python exited 0",
                                  "epoch 3 done", "step 100/1000 [00:10<01:30]"])
def test_what_does_not(text: str) -> None:
    assert not is_error(text)


def test_only_identical_texts_fold_a_line_naming_its_rank_stays_its_own() -> None:
    ev = [(0.001 * r, 0, r, f"rank {r} ready") for r in range(4)] + [(0.01, 0, r, "ready") for r in range(4)]
    assert play(ev) == [f"[node 0 rank {r}] rank {r} ready" for r in range(4)] + ["[ranks 0-3] ready"]


def test_a_group_closes_after_its_window_and_late_ranks_form_their_own() -> None:
    f = Folder(window_s=0.5, hold_s=2.0, start_s=0)
    ev = [(0.0, 0, 0, "hello"), (0.1, 0, 1, "hello"), (0.2, 0, 2, "hello"), (1.5, 0, 3, "hello")]
    shown = [o.line() for t, n, r, x in ev for o in f.feed(n, r, x, t)]
    assert shown == ["[ranks 0-2] hello"]  # shown when rank 3's line came, 1.3 s after the last join
    assert [o.line() for o in f.tick(1.9)] == []
    assert [o.line() for o in f.tick(2.0)] == ["[node 0 rank 3] hello"]


def test_hold_bounds_a_group_that_keeps_growing_and_later_groups_keep_their_order() -> None:
    f = Folder(window_s=0.5, hold_s=2.0, start_s=0)
    for k in range(20):  # a rank joins every 0.1 s: the window never passes
        f.feed(0, k, "slow start", 0.1 * k)
        if k == 1:
            f.feed(0, 0, "next", 0.15)
    assert [o.line() for o in f.tick(1.99)] == []
    out = [o.line() for o in f.tick(2.0)]
    assert out[0].startswith("[ranks 0-19] slow start") and out[1] == "[node 0 rank 0] next"


def test_the_same_rank_repeating_a_line_ends_the_group_so_nothing_is_lost() -> None:
    ev = [(0.0, 0, 0, ""), (0.01, 0, 1, ""), (0.02, 0, 0, ""), (0.03, 0, 1, "")]
    assert play(ev) == ["[ranks 0-1] ", "[ranks 0-1] "]


def test_a_rank_missing_from_a_folded_line_is_named() -> None:
    f = Folder()
    for r in range(16):
        f.feed(r // 8, r, "warmup", 0.001 * r)
    f.flush()
    ev = [(1.0 + 0.001 * r, r // 8, r, "step 1 loss 2.30") for r in range(16) if r != 11]
    assert play(ev, f) == ["[ranks 0-10,12-15] step 1 loss 2.30  (missing: rank 11)"]


def test_nodes_own_lines_fold_by_node() -> None:
    ev = [(0.01 * n, n, None, "setup: installing requirements") for n in range(4)]
    assert play(ev) == ["[nodes 0-3] setup: installing requirements"]


def test_the_printer_folds_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from gtrain.cli import output

    for fold, want in ((True, ["[ranks 0-63] hi"]), (False, [f"[node {r // 16} rank {r}] hi" for r in range(64)])):
        buf = io.StringIO()
        monkeypatch.setattr("sys.stdout", buf)
        p = output.LinePrinter(fold=fold)
        for r in range(64):
            p(SimpleNamespace(node=r // 16, rank=r, text="hi"))
        p.close()
        assert buf.getvalue().splitlines() == want


def test_in_the_first_seconds_a_group_waits_for_streams_that_connect_later() -> None:
    f = Folder()  # node 1's stream (its backlog) comes 1.5 s after node 0's
    ev = [(0.001 * r, 0, r, "hello") for r in range(32)] + [(1.5 + 0.001 * r, 1, r, "hello") for r in range(32, 64)]
    shown = [o.line() for t, n, r, x in ev for o in f.feed(n, r, x, t)]
    assert shown == [] and [o.line() for o in f.tick(3.0)] == []
    assert [o.line() for o in f.tick(3.6)] == ["[ranks 0-63] hello"]
    f.feed(0, 0, "later", 10.0)  # past the first seconds: the short window
    assert [o.line() for o in f.tick(10.5)] == ["[node 0 rank 0] later"]
