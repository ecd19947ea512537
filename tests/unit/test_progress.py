"""Progress in sight (issue 37, item 5): the total steps hint of gtrain.metrics, the node-side scan of a job's
metrics files, and the pure figures (step, rate, ETA, percent, world size) from recorded samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.state import progress as pg

#: a recorded run (rank 0's (t, step), 2 s a step with jitter): it crashed after step 37, was resumed from its
#: step-30 checkpoint 95 s later, and ran on at the same pace
T0 = 1_767_225_600.0
BEFORE = [(T0 + 2.0 * s + (0.13 * (s % 3)), float(s)) for s in range(38)]
RESUMED = [(BEFORE[-1][0] + 95.0 + 2.0 * i, float(30 + i)) for i in range(12)]


def test_a_steady_run_gives_step_rate_eta_and_percent() -> None:
    p = pg.progress(BEFORE, 100, now=BEFORE[-1][0] + 1)
    assert p.step == 37 and p.total == 100 and p.restarts == 0
    assert p.rate == pytest.approx(0.5, rel=0.02)
    assert p.eta_s == pytest.approx(63 / 0.5, rel=0.02) and p.percent == pytest.approx(37.0)
    assert p.age_s == pytest.approx(1.0) and p.eta_at == pytest.approx(BEFORE[-1][0] + (p.eta_s or 0))
    assert p.mean_rate == pytest.approx(0.5, rel=0.02)


def test_a_resume_where_the_step_falls_back_is_measured_from_the_resume_on() -> None:
    p = pg.progress(BEFORE + RESUMED, 100, now=RESUMED[-1][0])
    assert p.step == 41 and p.restarts == 1
    assert p.rate == pytest.approx(0.5, rel=0.01)  # not dragged down by the 95 s gap, nor negative by the fall
    assert p.eta_s == pytest.approx(59 / 0.5, rel=0.01)
    segs = pg.segments(BEFORE + RESUMED)
    assert [len(s) for s in segs] == [38, 12]
    # the whole run's pace counts the steps done in each segment over the time spent training in it
    assert p.mean_rate == pytest.approx((37 + 11) / (BEFORE[-1][0] - BEFORE[0][0] + RESUMED[-1][0] - RESUMED[0][0]))


def test_the_first_step_after_a_resume_keeps_the_rate_of_before() -> None:
    p = pg.progress([*BEFORE, RESUMED[0]], 100, now=RESUMED[0][0])
    assert p.step == 30 and p.restarts == 1 and p.rate == pytest.approx(0.5, rel=0.02)


def test_a_resume_at_the_same_step_after_a_long_pause_is_a_new_segment() -> None:
    later = [(BEFORE[-1][0] + 600 + 2.0 * i, 37.0 + i) for i in range(1, 6)]
    segs = pg.segments(BEFORE + later)
    assert len(segs) == 2 and pg.progress(BEFORE + later).restarts == 0  # a pause, not a fall back
    assert pg.progress(BEFORE + later).rate == pytest.approx(0.5)


def test_the_window_is_recent_time_and_at_least_a_few_points() -> None:
    fast_then_slow = [(T0 + i, float(10 * i)) for i in range(200)] + [(T0 + 200 + 10 * i, 2000.0 + i)
                                                                      for i in range(1, 20)]
    assert pg.progress(fast_then_slow).rate == pytest.approx(0.1, rel=0.05)  # the last 2 minutes
    sparse = [(T0 + 600 * i, float(i)) for i in range(4)]  # a step every 10 min: the last points
    assert pg.progress(sparse).rate == pytest.approx(1 / 600)


def test_done_unknown_and_hostile_inputs() -> None:
    done = pg.progress([(T0, 98.0), (T0 + 1, 100.0), (T0 + 2, 101.0)], 100)
    assert done.eta_s == 0 and done.percent == 100
    assert pg.progress([]) == pg.Progress() and not pg.progress([]).known
    assert pg.progress([], 10).total == 10
    one = pg.progress([(T0, 5.0)], 10, now=T0 + 5)
    assert (one.step, one.rate, one.eta_s, one.percent) == (5, None, None, 50)
    junk = pg.progress([(float("nan"), 1.0), (T0, float("inf")), (T0, 3.0), (T0, 4.0)], -5)
    assert junk.step == 4 and junk.total is None and junk.rate is None  # same time: no rate, never a division
    assert pg.progress([(T0, 1.0), (T0 + 1, 2.0)], 0).total is None


def test_world_sizes_recorded_absent_and_malformed() -> None:
    info = {"world_sizes": [[T0 + 60, 1, 4], [T0, 2, 8], "x", [None, 1, 1], [T0 + 90, "3", None], [T0 + 120, 3, 12]]}
    got = pg.world_sizes(info, num_nodes=5, nproc_per_node=4)
    assert [(w.since, w.nodes, w.ranks) for w in got] == [(T0, 2, 8), (T0 + 60, 1, 4), (T0 + 120, 3, 12)]
    const = pg.world_sizes({"nproc_per_node": 4}, num_nodes=2, started_at=T0)
    assert [w.to_dict() for w in const] == [{"since": T0, "nodes": 2, "ranks": 8}]
    assert pg.world_sizes(None, num_nodes=2) == [pg.WorldSize(None, 2, None)]
    assert pg.world_sizes({"world_sizes": "bad"}) == []
    assert pg.world_line(got[-1]) == "3 nodes, 12 ranks" and pg.world_line({"nodes": 1, "ranks": 1}) == "1 node, 1 rank"
    assert pg.world_line(None) == "-"


def test_words() -> None:
    p = pg.progress(BEFORE + RESUMED, 100, now=RESUMED[-1][0] + 300)
    line = pg.describe(p)
    assert line.startswith("step 41/100 (41.0%) · 0.5 steps/s · ETA 1m 58s · 1 resume(s)")
    assert line.endswith("last step 5m 00s ago")
    assert pg.describe(p.to_dict(), live=False) == "step 41/100 (41.0%) · 0.5 steps/s · 1 resume(s)"
    assert pg.describe(None) == "-" and pg.describe(pg.Progress()) == "-"
    assert pg.describe(pg.progress([(T0, 0.0), (T0 + 600, 1.0)], now=T0 + 600)) == "step 1 · 0.1 steps/min"
    assert [pg.duration(s) for s in (None, 5, 65, 3725, 90000)] == ["-", "5s", "1m 05s", "1h 02m", "1d 01h"]


# ---- the files -------------------------------------------------------------------------------------------

def _write(path: Path, recs: list[dict[str, object]], torn: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
        if torn:
            f.write('{"t": 1, "st')


def test_scan_finds_the_total_in_the_head_of_a_long_file_and_skips_torn_lines(tmp_path: Path) -> None:
    m = tmp_path / "metrics"
    _write(m / "rank-0.jsonl", [{"t": T0, "rank": 0, "total_steps": 5000}])
    _write(m / "rank-0.jsonl", [{"t": T0 + i, "step": i, "loss": 1.0 / (i + 1), "pad": "x" * 80}
                                for i in range(2000)], torn=True)
    _write(m / "rank-1.jsonl", [{"t": T0 + i, "step": i} for i in range(2000)])
    _write(m / "rank-10.jsonl", [{"t": T0, "step": 3, "total_steps": 7000}])
    (m / "other.jsonl").write_text('{"t": 1, "step": 99999}\n')
    doc = pg.scan(str(m))
    assert os.path.getsize(m / "rank-0.jsonl") > pg.TAIL_BYTES
    r0 = doc["ranks"]["0"]
    assert r0["total"] == 5000 and 100 < len(r0["samples"]) <= pg.MAX_SAMPLES and r0["samples"][-1] == [T0 + 1999, 1999]
    assert doc["ranks"]["1"]["samples"] == [[T0 + 1999, 1999]]  # the others: their newest only
    assert sorted(doc["ranks"]) == ["0", "1", "10"]
    samples, total = pg.combine([doc])
    assert samples[-1] == (T0 + 1999, 1999) and total == 5000  # rank 0's own total before any other rank's
    assert pg.scan(str(tmp_path / "nowhere")) == {"ranks": {}, "time": pytest.approx(doc["time"], abs=60)}


def test_combine_merges_rank_0_over_nodes_and_falls_back_to_the_lowest_rank() -> None:
    a = {"ranks": {"0": {"samples": [[T0, 1], [T0 + 2, 2]], "total": 10, "total_t": T0}}}
    b = {"ranks": {"0": {"samples": [[T0 + 1, 1.5]]}, "4": {"samples": [[T0 + 9, 99]], "total": 20, "total_t": T0 + 5}}}
    assert pg.combine([a, None, b]) == ([(T0, 1), (T0 + 1, 1.5), (T0 + 2, 2)], 10)  # rank 0's own total
    a["ranks"]["0"].pop("total")
    assert pg.combine([a, b])[1] == 20  # else the newest of any rank
    assert pg.combine([{"ranks": {"3": {"samples": [[T0, 7]]}, "2": {"samples": []}}}]) == ([(T0, 7)], None)
    assert pg.combine([{"ranks": {"x": {}, "1": "bad", "2": {"samples": [[1], "z", [T0, None]]}}}]) == ([], None)


def test_the_scan_runs_on_a_node_as_source_on_stdin(tmp_path: Path) -> None:
    """As gtrain.runlog.progress.ask sends it: `python3 - scan FOLDER`, this file's source, nothing else."""
    _write(tmp_path / "m" / "rank-0.jsonl", [{"t": T0 + i, "step": i, "total_steps": 9} for i in range(3)])
    src = Path(pg.__file__).read_text()
    r = subprocess.run([sys.executable, "-S", "-", "scan", str(tmp_path / "m")], input=src, text=True,
                       capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ranks"]["0"]["samples"] == [[T0, 0], [T0 + 1, 1], [T0 + 2, 2]]


# ---- gtrain.metrics: the total steps hint ------------------------------------------------------------------

@pytest.fixture
def metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    import gtrain.metrics as m

    monkeypatch.setattr(m, "_total", {})
    monkeypatch.setattr(m, "_state", {})
    monkeypatch.setenv("GTRAIN_METRICS_FILE", str(tmp_path / "rank-0.jsonl"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("GTRAIN_TOTAL_STEPS", raising=False)
    monkeypatch.delenv("GTRAIN_METRICS_FORWARD", raising=False)

    def recs() -> list[dict[str, object]]:
        m.flush()
        return [json.loads(x) for x in (tmp_path / "rank-0.jsonl").read_text().splitlines()]

    yield m, recs
    f = m._state.get("file")
    if f is not None and not isinstance(f, str):
        f.close()


def test_total_steps_from_log_the_call_and_the_env(metrics, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    m, recs = metrics
    m.log(step=0, loss=1.0)
    m.log(step=1, loss=0.5, total_steps=300)
    m.log(step=2, loss=0.4)
    m.total_steps(400)
    m.total_steps(0)  # not a total: ignored
    got = recs()
    assert [r.get("total_steps") for r in got] == [None, 300, None, 400]
    assert "total_steps" not in got[3] or got[3].get("step") is None
    monkeypatch.setattr(m, "_total", {})
    monkeypatch.setenv("GTRAIN_TOTAL_STEPS", "1000")
    for s in range(3, 3 + m.TOTAL_EVERY + 1):
        m.log(step=s, loss=0.1)
    every = [r for r in recs()[4:] if "total_steps" in r]
    assert [r["step"] for r in every] == [3, 3 + m.TOTAL_EVERY]  # the process's first record, then again
    assert all(r["total_steps"] == 1000 for r in every)


def test_total_steps_is_no_metric(tmp_path: Path) -> None:
    from gtrain.runlog.model import load_metrics

    _write(tmp_path / "metrics" / "rank-0.jsonl", [{"t": T0, "step": 1, "loss": 0.5, "total_steps": 10}])
    assert [s.metric for s in load_metrics(tmp_path)] == ["loss"]
