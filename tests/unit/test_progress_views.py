"""Progress in sight, shown: `status`'s line, `top`'s rows, the notifications' facts, the report's summary,
step chart and world size table, and `cost`'s world size timeline (gtrain.runlog.progress underneath)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gtrain.state import progress as pg

T0 = 1_767_225_600.0
ELASTIC = [[T0, 2, 8], [T0 + 600, 1, 4], [T0 + 900, 2, 8]]


def _job_folder(d: Path, *, resume: bool = True) -> Path:
    (d / "metrics").mkdir(parents=True)
    recs = [{"t": T0 + 2 * s, "step": s, "rank": 0, "loss": 1 / (s + 1)} for s in range(40)]
    recs[0]["total_steps"] = 100
    if resume:
        recs += [{"t": T0 + 200 + 2 * i, "step": 30 + i, "rank": 0, "loss": 0.1} for i in range(20)]
    (d / "metrics" / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def test_status_line_of_a_running_and_a_finished_job() -> None:
    from gtrain.cli.views import progress_line

    p = pg.progress([(T0, 10.0), (T0 + 10, 20.0)], 120, now=T0 + 12).to_dict()
    ws = [w.to_dict() for w in pg.world_sizes({"world_sizes": ELASTIC})]
    line = progress_line({"id": "j1", "status": "running", "progress": p, "world_sizes": ws})
    assert line == ("job j1: step 20/120 (16.7%) · 1 steps/s · ETA 1m 40s · world size 2 nodes, 8 ranks "
                    "(changed 2 times)")
    done = progress_line({"id": "j1", "status": "succeeded", "progress": p, "world_sizes": ws[:1]})
    assert done == "job j1: step 20/120 (16.7%) · 1 steps/s · world size 2 nodes, 8 ranks"
    assert progress_line({"id": "j1", "status": "running"}) is None


def test_fields_from_the_nodes_else_the_archive(tmp_path: Path) -> None:
    from gtrain.runlog.progress import fields, total_hint
    from gtrain.state import StateStore
    from gtrain.state.runs import job_dir

    s = StateStore(tmp_path / "home")
    c = s.create_cluster(name="c", provider="local", num_nodes=2, spec={"job": {"env": {"GTRAIN_TOTAL_STEPS": "50"}}},
                         price_per_hour=0.0)
    j = s.create_job(c.id, "j1", {"nproc_per_node": 4, "num_nodes": 2})
    answers = [{"ranks": {"0": {"samples": [[T0, 1], [T0 + 10, 11]]}}}, None]
    got = fields(c, j, answers, now=T0 + 10)
    assert got["progress_from"] == "nodes" and got["progress"]["step"] == 11 and got["progress"]["total"] == 50
    assert got["progress"]["rate"] == 1.0 and got["world_size"] == {"since": j.created_at, "nodes": 2, "ranks": 8}
    assert fields(c, j, None, home=tmp_path / "home")["progress"] is None  # nothing kept, no node answered
    _job_folder(job_dir(tmp_path / "home", c.id, "j1"))
    kept = fields(c, j, None, home=tmp_path / "home")
    assert kept["progress_from"] == "archive" and kept["progress"]["step"] == 49 and kept["progress"]["total"] == 100
    assert total_hint({"job": {"env": {"GTRAIN_TOTAL_STEPS": "x"}}}) is None and total_hint(None) is None


def test_notifications_say_step_rate_and_world_size() -> None:
    from gtrain.notify import message

    p = pg.progress([(T0, 10.0), (T0 + 10, 20.0)], 100, now=T0 + 10).to_dict()
    ev = message.event("preempted", cluster="c", job="j", state="running", progress={**p, "text": pg.describe(p)},
                       world_size={"nodes": 2, "ranks": 8, "text": "2 nodes, 8 ranks"})
    facts = dict(message.facts(ev))
    assert facts["progress"] == "step 20/100 (20.0%) · 1 steps/s · ETA 1m 20s"
    assert facts["world size"] == "2 nodes, 8 ranks"
    assert "step 20/100" in message.text(ev) and ev["progress"]["rate"] == 1.0  # the JSON has the figures too
    assert "step 20/100" in json.dumps(message.slack(ev)) and "step 20/100" in json.dumps(message.teams(ev))
    bare = message.event("succeeded", cluster="c", job="j")  # unknown: no line, as a node watcher's events
    assert "progress" not in dict(message.facts(bare)) and bare["progress"] is None


def test_job_event_reads_the_archive_when_the_cluster_is_not_up(tmp_path: Path) -> None:
    from gtrain.context import Context
    from gtrain.runs.notify import job_event
    from gtrain.state.runs import job_dir

    ctx = Context()
    c = ctx.store.create_cluster(name="c", provider="local", num_nodes=1, spec={}, price_per_hour=0.0)
    j = ctx.store.create_job(c.id, "j1", {"nproc_per_node": 2})
    ctx.store.update_job(j.id, status="succeeded", exit_code=0)
    _job_folder(job_dir(ctx.store.home, c.id, "j1"), resume=False)
    ev = job_event(ctx.store.get_cluster_by_id(c.id), ctx.store.get_job("j1"), ctx, "succeeded")
    assert ev["progress"]["text"] == "step 39/100 (39.0%) · 0.5 steps/s"
    assert ev["world_size"]["text"] == "1 node, 2 ranks"
    ctx.store.close()


def test_report_shows_progress_steps_and_the_world_size_over_time(tmp_path: Path) -> None:
    from gtrain.runlog.html import render_report
    from gtrain.runlog.model import load_run

    d = _job_folder(tmp_path / "job")
    ws = [w.to_dict() for w in pg.world_sizes({"world_sizes": ELASTIC})]
    run = load_run(d, {"name": "c", "id": "cid", "created_at": T0 - 60},
                   {"id": "j", "status": "succeeded", "created_at": T0, "ended_at": T0 + 240, "world_sizes": ws})
    assert run.progress is not None and run.progress["step"] == 49 and run.progress["restarts"] == 1
    summary = run.summary()
    assert summary["progress"]["total"] == 100 and summary["world_size"] == ws[-1] and summary["world_sizes"] == ws
    html = render_report(run)
    assert 'id="progress">step 49/100 (49.0%) · 0.5 steps/s · 1 resume(s)<' in html
    assert 'id="world-size">2 nodes, 8 ranks (changed 2 time(s)' in html
    assert html.count('<tr class="world">') == 3 and 'data-kind="progress"' in html and "total_steps" in html
    plain = load_run(tmp_path / "nothing", {"name": "c", "id": "cid"}, {"id": "j"})
    assert plain.progress is None and "No step was logged" in render_report(plain)


def test_cost_prints_an_elastic_jobs_world_size_over_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gtrain.cli.cost_cmds import cost
    from gtrain.context import Context

    ctx = Context()
    c = ctx.store.create_cluster(name="el", provider="local", num_nodes=2, spec={}, price_per_hour=0.0)
    ctx.store.create_job(c.id, "j-el", {"world_sizes": ELASTIC})
    ctx.store.create_job(c.id, "j-fixed", {"nproc_per_node": 1})
    ctx.store.close()
    cost(json_=False)
    text = capsys.readouterr().out
    assert "el: job j-el world size 2 nodes, 8 ranks (" in text and "→ 1 node, 4 ranks (" in text
    assert "j-fixed" not in text  # a constant world size is no news
    cost(json_=True)
    doc = json.loads(capsys.readouterr().out)["clusters"][0]["world_sizes"]
    assert doc[0]["job"] == "j-el" and len(doc[0]["world_sizes"]) == 3
    assert doc[1]["world_sizes"] == [{"since": pytest.approx(doc[1]["world_sizes"][0]["since"]), "nodes": 2,
                                      "ranks": 2}]


def test_top_rows_get_each_nodes_own_rate() -> None:
    from gtrain.runlog.progress import per_node_rates

    answers = [{"ranks": {"0": {"samples": [[T0, 0], [T0 + 10, 20]]}}}, None,
               {"ranks": {"1": {"samples": [[T0, 0], [T0 + 10, 5]]}}}, {"ranks": {"2": {"samples": [[T0, 3]]}}}]
    assert per_node_rates(answers) == {0: 2.0, 2: 0.5}
    assert per_node_rates(None) == {}
