from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.state import SCHEMA_VERSION, StateStore


def test_schema_wal_and_no_db_until_used(gtrain_home: Path) -> None:
    s = StateStore()
    assert not (gtrain_home / "state.db").exists()  # opened on first use, never at import/construct
    assert s.schema_version() == SCHEMA_VERSION
    assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_live_name_unique_history_kept() -> None:
    s = StateStore()
    c1 = s.create_cluster(name="demo", provider="local", num_nodes=2, spec={"name": "demo"})
    with pytest.raises(ConfigError, match="already exists"):
        s.create_cluster(name="demo", provider="local", num_nodes=1, spec={})
    s.update_cluster(c1.id, status="terminated", terminated_at=1.0)
    c2 = s.create_cluster(name="demo", provider="local", num_nodes=1, spec={})
    assert c2.id != c1.id
    assert s.get_cluster("demo").id == c2.id
    assert [c.id for c in s.list_clusters(include_terminated=True)] == [c1.id, c2.id]
    assert [c.id for c in s.list_clusters()] == [c2.id]


def test_resources_recorded_before_and_marked_after() -> None:
    s = StateStore()
    c = s.create_cluster(name="r", provider="local", num_nodes=1, spec={})
    rid = s.record_resource(c.id, "instance", "pending-0", region="us-east-1")
    assert s.resources(c.id)[0].status == "creating"
    s.mark_resource(rid, "created", ref="i-123")
    s.mark_resource(rid, "deleted")
    r = s.resources(c.id)[0]
    assert (r.ref, r.status) == ("i-123", "deleted") and r.deleted_at is not None
    assert s.resources(c.id, live_only=True) == []


def test_jobs_and_intervals() -> None:
    s = StateStore()
    c = s.create_cluster(name="j", provider="local", num_nodes=1, spec={})
    s.create_job(c.id, "j-1", {"run": "t.py"})
    s.update_job("j-1", status="failed", exit_code=3)
    j = s.get_job("j-1")
    assert (j.status, j.exit_code, j.info["run"]) == ("failed", 3, "t.py") and j.ended_at is not None
    iid = s.open_interval(c.id, 0, instance_type="x", market="spot", price_per_hour=1.5, started_at=100.0)
    s.close_intervals(c.id, at=200.0)
    s.set_interval_cost(iid, 0.5, estimate=True, note="n")
    iv = s.intervals(c.id)[0]
    assert (iv.stopped_at, iv.cost_usd, iv.estimate) == (200.0, 0.5, True)


def test_no_pickle_only_json() -> None:
    s = StateStore()
    s.create_cluster(name="p", provider="local", num_nodes=1, spec={"a": [1, 2]})
    raw = s.conn.execute("SELECT spec_json FROM clusters").fetchone()[0]
    assert raw == '{"a":[1,2]}'


def _writer(home: str, n: int, who: int) -> None:
    s = StateStore(Path(home))
    c = s.create_cluster(name=f"w{who}", provider="local", num_nodes=1, spec={})
    for i in range(n):
        s.record_resource(c.id, "thing", f"{who}-{i}")
        s.create_job(c.id, f"w{who}-{i}", {})
    s.close()


def test_two_processes_at_once_never_corrupt(gtrain_home: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(gtrain_home), 60, k)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    conn = sqlite3.connect(gtrain_home / "state.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM resources").fetchone()[0] == 120
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 120
