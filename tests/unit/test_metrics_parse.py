"""The report's parsers (JSON lines, key=value in log lines, TensorBoard when installed), its data model, the
archive's reading side (events, kept logs, the size bound) and the SVG charts."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from gtrain.costs.report import CostLine
from gtrain.runlog import archive
from gtrain.runlog.model import cost_curves, derived_events, downsample, load_run, read_gpus, series_from_points
from gtrain.runlog.parse import ParseStats, parse_jsonl, parse_kv_lines


def test_jsonl_points_skip_torn_and_foreign_lines() -> None:
    lines = ['{"t": 1.5, "step": 3, "rank": 2, "loss": 0.5, "lr": 1e-3, "tag": "x", "ok": true, "gap": null}',
             "not json", "[1, 2]", '{"loss": 0.25}', '{"step": 4, "loss": 0.1', ""]
    st = ParseStats()
    pts = list(parse_jsonl(lines, rank=7, stats=st))
    assert [(p.metric, p.step, p.value, p.t, p.rank) for p in pts] == [
        ("loss", 3.0, 0.5, 1.5, 2), ("lr", 3.0, 1e-3, 1.5, 2), ("ok", 3.0, 1.0, 1.5, 2), ("gap", 3.0, None, 1.5, 2),
        ("loss", None, 0.25, None, 7)]
    assert (st.lines, st.points, st.skipped) == (6, 5, 4)
    s = {(x.metric, x.rank): x for x in series_from_points(pts)}
    assert s[("loss", 7)].x == [0.0]  # no step: the record's index


def test_key_value_patterns_only_for_the_keys_asked() -> None:
    lines = ["epoch 1 step 10 loss=0.52 lr: 3e-4 acc 0.9", "step=11 | loss: 0.48 | grad_norm=2", "no numbers here",
             "loss 0.40", "val_loss=9 closs=8 loss=nan", "iter: 14, Loss = 0.30"]
    pts = list(parse_kv_lines(lines, ["loss", "lr"]))
    got = [(p.metric, p.step, p.value) for p in pts]
    assert got == [("loss", 10.0, 0.52), ("lr", 10.0, 3e-4), ("loss", 11.0, 0.48), ("loss", 3.0, 0.40),
                   ("loss", 4.0, None), ("loss", 14.0, 0.30)]
    assert list(parse_kv_lines(lines, [])) == []


def test_tensorboard_event_files_when_the_reader_is_installed(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter  # writes real event files

    from gtrain.runlog.parse import read_tensorboard

    w = SummaryWriter(str(tmp_path))
    for i in range(5):
        w.add_scalar("train/loss", 1.0 / (i + 1), i)
    w.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    pts = read_tensorboard(path)
    assert [(p.metric, p.step) for p in pts] == [("train/loss", float(i)) for i in range(5)]
    assert pts[-1].value == pytest.approx(0.2)


def _archive(tmp_path: Path, n: int = 50) -> Path:
    d = tmp_path / "job"
    (d / "metrics").mkdir(parents=True)
    t0 = 1_700_000_000.0
    with open(d / "metrics" / "rank-0.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"t": t0 + i, "step": i, "loss": 1 / (i + 1), "lr": 0.1}) + "\n")
    (d / "metrics" / "rank-1.jsonl").write_text('{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.0}\n{"step"')
    (d / "telemetry").mkdir()
    (d / "telemetry" / "node-1.jsonl").write_text(
        "".join(json.dumps({"t": t0 + i, "gpu": g, "util": 50 + g, "mem_used": 1e9, "mem_total": 8e9}) + "\n"
                for i in range(4) for g in range(2)) + "garbage\n")
    (d / "logs").mkdir()
    (d / "logs" / "node-0.log").write_text(
        "-\tsetup done\n0\tstep 1 tok_s=100\n1\tstep 1 tok_s=999\n0\tstep 2 tok_s=120\n")
    return d


def test_load_run_model_summary_and_gpus(tmp_path: Path) -> None:
    d = _archive(tmp_path)
    t0 = 1_700_000_000.0
    costs = [CostLine(0, "g", "spot", t0 - 10, t0 + 3590, 1.0, 2.0, 2.0, False, None),
             CostLine(1, "g", "on-demand", t0 - 10, t0 + 1790, 0.5, 4.0, 2.0, True, None)]
    run = load_run(d, {"name": "c", "id": "cid", "created_at": t0 - 10, "spec": {"name": "c"}},
                   {"id": "j", "status": "succeeded", "exit_code": 0, "created_at": t0, "ended_at": t0 + 60},
                   costs=costs, events=[{"t": t0 + 30, "kind": "recovery", "node": 1, "job": "j"},
                                        {"t": t0 + 31, "kind": "recovery", "job": "other-job"}],
                   log_keys=["tok_s"])
    assert run.metrics() == ["loss", "lr", "tok_s"]
    assert [(s.rank, len(s)) for s in run.of("loss")] == [(0, 50), (1, 2)]
    tok = run.of("tok_s")[0]
    assert (tok.x, tok.y) == ([1.0, 2.0], [100.0, 120.0])  # rank 0's lines only
    summ = run.summary()
    assert summ["metrics"]["loss"]["last"] == pytest.approx(1 / 50) and summ["metrics"]["loss"]["points"] == 50
    assert summ["total_usd"] == 4.0 and summ["estimate"] and summ["duration_s"] == 60
    assert [e["kind"] for e in run.events] == ["up", "launch", "recovery", "end"]  # the other job's event: not here
    assert [(g.node, g.gpu, len(g.t), g.mem_total) for g in run.gpus] == [(1, 0, 4, 8e9), (1, 1, 4, 8e9)]
    assert read_gpus(tmp_path / "nothing") == []
    curves = cost_curves(costs)
    assert curves[(0, "spot")] == [(t0 - 10, 0.0), (t0 + 3590, 2.0)]


def test_derived_events_never_duplicate_recorded_ones() -> None:
    rec = [{"t": 5.0, "kind": "up"}, {"t": 9.0, "kind": "down"}]
    ev = derived_events({"created_at": 1.0, "terminated_at": 10.0}, {"id": "j", "created_at": 6.0}, rec)
    assert [(e["kind"], e.get("derived", False)) for e in ev] == [("up", False), ("launch", True), ("down", False)]


def test_downsample_keeps_extremes_and_bounds_points() -> None:
    x = [float(i) for i in range(100_000)]
    y: list[float | None] = [1.0] * 100_000
    y[54_321] = 50.0  # a spike
    y[7] = None
    dx, dy = downsample(x, y, 1000)
    assert len(dx) <= 1000 and max(dy) == 50.0 and dx == sorted(dx)
    assert downsample([1.0, 2.0], [None, 3.0], 10) == ([2.0], [3.0])


def test_svg_chart_points_and_escaping() -> None:
    from gtrain.runlog import svg

    chart = svg.Chart("<loss>", [svg.Line("rank 0", [0, 1, 2], [3.0, 2.0, 1.0]), svg.Line("r&1", [0], [5.0])],
                      markers=[svg.Marker(1, "recovery node 1")])
    out = svg.render(chart)
    assert "<loss>" not in out and "&lt;loss&gt;" in out and "r&amp;1" in out
    polys = re.findall(r'<polyline[^>]*data-points="(\d+)"[^>]*points="([^"]*)"', out)
    assert [(int(n), len(p.split())) for n, p in polys] == [(3, 3), (1, 1)]
    assert 'class="marker"' in out
    assert "no data" in svg.render(svg.Chart("empty", []))
    assert svg.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_events_round_trip_and_are_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gtrain import redact

    monkeypatch.setenv("TOK", "hunter2-secret")
    redact.register_secrets(["TOK"])
    try:
        archive.record_event(tmp_path, "cid", "launch", t=2.0, job="j1")
        archive.record_event(tmp_path, "cid", "preflight", t=1.0, ok=False, msg="token hunter2-secret rejected")
    finally:
        redact.clear()
    with (archive.cluster_dir(tmp_path, "cid") / "events.jsonl").open("a") as f:
        f.write("torn {\n")
    ev = archive.read_events(tmp_path, "cid")
    assert [e["kind"] for e in ev] == ["preflight", "launch"]
    assert "hunter2" not in json.dumps(ev)
    assert archive.read_events(tmp_path, "nope") == []


def test_kept_logs_read_back_by_node_rank_and_tail(tmp_path: Path) -> None:
    logs = archive.job_dir(tmp_path, "cid", "j") / "logs"
    logs.mkdir(parents=True)
    (logs / "node-0.log").write_text("-\tsetup\n0\ta\n1\tb\n0\tc\twith tab\n")
    (logs / "node-1.log").write_text("2\td\n")
    got = [(ln.node, ln.rank, ln.text) for ln in archive.archived_log_lines(tmp_path, "cid", "j")]
    assert got == [(0, None, "setup"), (0, 0, "a"), (0, 1, "b"), (0, 0, "c\twith tab"), (1, 2, "d")]
    assert [ln.text for ln in archive.archived_log_lines(tmp_path, "cid", "j", rank=0, tail=1)] == ["c\twith tab"]
    assert [ln.text for ln in archive.archived_log_lines(tmp_path, "cid", "j", nodes=[1])] == ["d"]
    assert list(archive.archived_log_lines(tmp_path, "cid", "j", tail=0)) == []


def test_prune_deletes_the_oldest_jobs_first_never_the_kept_one(tmp_path: Path) -> None:
    import os

    dirs = []
    for i in range(4):
        d = archive.job_dir(tmp_path, "c", f"j{i}")
        d.mkdir(parents=True)
        (d / "blob").write_bytes(b"x" * 400_000)
        os.utime(d, (time.time() - 1000 + i, time.time() - 1000 + i))
        dirs.append(d)
    os.utime(dirs[0], (time.time(), time.time()))  # j0 is the newest now
    deleted = archive.prune(tmp_path, max_mb=1.3, keep=dirs[1])
    assert deleted == [dirs[2]]  # 1.6 MB > 1.3 MB: the oldest (j1) is kept on request, the next oldest goes
    assert archive.prune(tmp_path, max_mb=0.5) == [dirs[1], dirs[3]]
    assert [p.name for p in (tmp_path / "runs" / "c" / "jobs").iterdir()] == ["j0"]


def test_parsed_columns_are_cached_and_grow_with_the_file(tmp_path: Path) -> None:
    from gtrain.runlog.model import load_metrics

    d = tmp_path / "job"
    (d / "metrics").mkdir(parents=True)
    f = d / "metrics" / "rank-0.jsonl"
    f.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": null}\n{"step": 2, "lo')  # a rank mid-write
    (s,) = load_metrics(d)
    assert (s.x, s.y) == ([0.0, 1.0], [1.0, None])
    assert list((d / ".cache").iterdir()) == [d / ".cache" / "rank-0.jsonl.cols"]
    with open(f, "a") as fh:
        fh.write('ss": 0.5}\n{"step": 3, "loss": 0.25, "acc": 0.9}\n')
    st = ParseStats()
    got = {x.metric: x for x in load_metrics(d, stats=st)}
    assert (got["loss"].x, got["loss"].y) == ([0.0, 1.0, 2.0, 3.0], [1.0, None, 0.5, 0.25])
    assert got["acc"].y == [0.9] and st.lines == 4
    f.write_text('{"step": 9, "loss": 7.0}\n')  # rewritten shorter: parsed again from the start
    assert [(x.x, x.y) for x in load_metrics(d)] == [([9.0], [7.0])]
    f.write_text('{"step": 5, "loss": 3.0}\n{"step": 6, "loss": 2.0}\n')  # rewritten longer: the same
    assert [(x.x, x.y) for x in load_metrics(d)] == [([5.0, 6.0], [3.0, 2.0])]
    (d / ".cache" / "rank-0.jsonl.cols").write_bytes(b"garbage")  # a broken cache is ignored
    assert [(x.x, x.y) for x in load_metrics(d)] == [([5.0, 6.0], [3.0, 2.0])]


def test_many_metrics_and_ranks_share_the_point_budget(tmp_path: Path) -> None:
    from gtrain.runlog.html import POINT_BUDGET, metric_charts, render_report

    d = tmp_path / "job"
    (d / "metrics").mkdir(parents=True)
    for rank in range(8):
        with open(d / "metrics" / f"rank-{rank}.jsonl", "w") as f:
            for s in range(5000):
                f.write(json.dumps({"step": s, **{f"m{k}": (s * (k + 1)) % 97 + rank for k in range(30)}}) + "\n")
    run = load_run(d, {"name": "c", "id": "cid"}, {"id": "j"})
    assert run.points == 8 * 30 * 5000
    drawn = sum(len(ln.x) for c in metric_charts(run) for ln in c.lines)
    assert drawn <= POINT_BUDGET
    assert len(render_report(run).encode()) <= 2 * 2**20


def test_node_listing_finds_metrics_telemetry_and_tensorboard_files(tmp_path: Path) -> None:
    """What fetch_files asks a node (a real bash on a local runner): sizes and archive paths."""
    from gtrain.remote.local import LocalRunner

    root = tmp_path / "node"
    jd = root / "jobs" / "j 1"
    (jd / "metrics").mkdir(parents=True)
    (jd / "metrics" / "rank-3.jsonl").write_text('{"loss": 1}\n')
    (jd / "telemetry").mkdir()
    (jd / "telemetry" / "node-1.jsonl").write_text("")
    tb = root / "workdir" / "runs" / "exp a"
    tb.mkdir(parents=True)
    (tb / "events.out.tfevents.1.host").write_bytes(b"x" * 7)
    (tb / "other.txt").write_text("no")
    got = archive._remote_files(LocalRunner(root), str(jd), str(root / "workdir" / "runs"))
    assert sorted(got) == [(0, str(jd / "telemetry" / "node-1.jsonl"), "telemetry/node-1.jsonl"),
                           (7, str(tb / "events.out.tfevents.1.host"), "tensorboard/node-{node}/exp a/"
                                                                      "events.out.tfevents.1.host"),
                           (12, str(jd / "metrics" / "rank-3.jsonl"), "metrics/rank-3.jsonl")]
    assert archive._remote_files(LocalRunner(root), str(root / "jobs" / "none"), None) == []
