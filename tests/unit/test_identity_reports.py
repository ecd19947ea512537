"""Who ran it (gtrain.state.identity) in the cost report (`gtrain down`'s table, `gtrain cost`, --json) and in the HTML
report of `gtrain report`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gtrain.state import StateStore

CI = {"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "team/model",
      "GITHUB_RUN_ID": "4711"}
RUN_URL = "https://github.com/team/model/actions/runs/4711"


def _cluster_by_alice_job_by_ci(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[StateStore, str, str]:
    for k in CI:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("GITLAB_CI", raising=False)
    monkeypatch.setenv("GTRAIN_IDENTITY", "alice@laptop")
    store = StateStore(home)
    c = store.create_cluster(name="team-run", provider="local", num_nodes=1, spec={"name": "team-run"})
    store.open_interval(c.id, 0, instance_type="local", market="local", price_per_hour=0.0, started_at=1000.0)
    for k, v in CI.items():
        monkeypatch.setenv(k, v)
    store.create_job(c.id, "team-run-1", {"run": "train.py"})
    return store, c.id, "team-run-1"


def test_cost_report_says_who_started_and_who_launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from gtrain.cli import output as out
    from gtrain.cli.cost_cmds import cost
    from gtrain.costs.report import cluster_cost
    from gtrain.providers.local import LocalProvider

    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path))
    store, cid, _ = _cluster_by_alice_job_by_ci(tmp_path, monkeypatch)
    rep = cluster_cost(store, store.get_cluster_by_id(cid), LocalProvider(store))
    assert (rep.by, rep.launched_by) == ("alice@laptop", [RUN_URL])
    assert rep.to_dict()["by"] == "alice@laptop" and rep.to_dict()["launched_by"] == [RUN_URL]
    out.cost_table(rep)  # what `gtrain down` prints
    assert f"started by alice@laptop; jobs launched by {RUN_URL}" in capsys.readouterr().out
    store.close()
    monkeypatch.setenv("COLUMNS", "300")
    cost(json_=False)  # `gtrain cost`: a column
    table = capsys.readouterr().out
    assert "started by" in table.splitlines()[1] and "alice@laptop" in table


def test_html_report_says_who_ran_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gtrain.runlog.html import render_report
    from gtrain.runlog.model import load_run
    from gtrain.runlog.service import _cluster_dict, _job_dict

    store, cid, jid = _cluster_by_alice_job_by_ci(tmp_path, monkeypatch)
    cluster, job = _cluster_dict(store.get_cluster_by_id(cid)), _job_dict(store.get_job(jid))
    html = render_report(load_run(tmp_path / "run", cluster, job))
    assert (f'<td id="run-by">alice@laptop (started the cluster) &middot; <a href="{RUN_URL}" rel="noreferrer">'
            f"{RUN_URL}</a> (launched the job)</td>") in html
    same = render_report(load_run(tmp_path / "run", {**cluster, "by": "bob@<ws>"}, {**job, "by": "bob@<ws>"}))
    assert '<td id="run-by">bob@&lt;ws&gt;</td>' in same  # once, and escaped
    none = render_report(load_run(tmp_path / "run", {**cluster, "by": None}, {**job, "by": None}))
    assert 'id="run-by"' not in none  # records made before identity: no row
    store.close()
