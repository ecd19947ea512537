"""`gtrain report` and `gtrain plot` on a cluster that is gone (from the archive), their bad input (exit 2, one
line naming the flag), and plotext missing (exit 2 naming the extra)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtrain.errors import install_hint
from gtrain.runlog import archive
from gtrain.runlog.service import default_report_path
from gtrain.state import StateStore


def gone_cluster(home: Path, steps: int = 30) -> tuple[str, str]:
    """A terminated 2-node cluster with one finished job whose metrics are in the archive."""
    store = StateStore(home)
    c = store.create_cluster(name="gone", provider="local", num_nodes=2, spec={"name": "gone", "num_nodes": 2},
                             market="spot", price_per_hour=1.0)
    t0 = time.time() - 600
    for rank in range(2):
        store.open_interval(c.id, rank, instance_type="x", market="spot", price_per_hour=1.0, started_at=t0)
    store.create_job(c.id, "gone-job-1", {"run": "train.py"})
    store.update_job("gone-job-1", status="succeeded", exit_code=0)
    store.close_intervals(c.id)
    for iv in store.intervals(c.id):
        store.set_interval_cost(iv.id, 0.1, estimate=False)
    store.update_cluster(c.id, status="terminated", terminated_at=time.time())
    store.close()
    d = archive.job_dir(home, c.id, "gone-job-1") / "metrics"
    d.mkdir(parents=True)
    (d / "rank-0.jsonl").write_text("".join(json.dumps({"t": t0 + i, "step": i, "loss": 1 / (i + 1), "lr": 0.1}) + "\n"
                                            for i in range(steps)))
    return "gone", c.id


def gtrain(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=cwd)


def test_report_of_a_gone_cluster(gtrain_home: Path, tmp_path: Path) -> None:
    name, _ = gone_cluster(gtrain_home)
    r = gtrain("report", name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "gone-report.html"  # the default: ./CLUSTER-report.html
    assert r.stdout.strip() == str(out)
    html = out.read_text()
    assert re.findall(r'data-title="loss"', html) and 'data-points="30"' in html
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "$0.2000" in html  # the cost `down` priced
    r = gtrain("report", name, "--out", str(tmp_path / "x" / "r.html"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["report"] == str(tmp_path / "x" / "r.html") and doc["bytes"] > 1000


def test_plot_of_a_gone_cluster_piped(gtrain_home: Path) -> None:
    name, _ = gone_cluster(gtrain_home)
    r = gtrain("plot", name, env={"COLUMNS": "100", "LINES": "20"})
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert "loss" in rows[0] and max(len(x) for x in rows) == 100 and len(rows) == 18
    r = gtrain("plot", name, "--metric", "lr", "--x", "time", env={"COLUMNS": "60", "LINES": "15"})
    assert r.returncode == 0 and "lr" in r.stdout.splitlines()[0] and "minutes" in r.stdout


@pytest.mark.parametrize(("args", "flag"), [
    (["plot", "gone", "--metric", "nope"], "--metric nope"),
    (["plot", "gone", "--x", "epoch"], "--x epoch"),
    (["plot", "gone", "--log-keys", "a b"], "--log-keys"),
    (["report", "gone", "--job", "someone-elses"], "someone-elses"),
    (["report", "never-was"], "never-was"),
])
def test_bad_input_exits_2_naming_the_flag(gtrain_home: Path, args: list[str], flag: str) -> None:
    gone_cluster(gtrain_home)
    r = gtrain(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert flag in r.stderr.splitlines()[0] and "Traceback" not in r.stderr


def test_plot_without_plotext_names_the_extra(gtrain_home: Path, tmp_path: Path) -> None:
    gone_cluster(gtrain_home)
    site = tmp_path / "blocker"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'plotext':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Block())\n")
    r = gtrain("plot", "gone", env={"PYTHONPATH": os.pathsep.join([str(site), *sys.path])})
    assert r.returncode == 2, r.stderr
    assert "plotext" in r.stderr and install_hint("plot") in r.stderr and "Traceback" not in r.stderr


def test_report_goes_next_to_the_pulled_checkpoints(tmp_path: Path) -> None:
    assert default_report_path("demo", next_to=tmp_path / "demo-ckpt") == tmp_path / "demo-report.html"
    assert default_report_path("demo") == Path.cwd() / "demo-report.html"


def test_report_out_folder_fifo_and_unwritable(gtrain_home: Path, tmp_path: Path) -> None:
    import stat
    import threading

    name, _ = gone_cluster(gtrain_home)
    folder = tmp_path / "reports"
    folder.mkdir()
    r = gtrain("report", name, "-o", str(folder), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(folder / "gone-report.html")
    assert "data-title" in (folder / "gone-report.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no .reports.tmp
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    r = gtrain("report", name, "-o", str(fifo), cwd=tmp_path)
    reader.join(60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and b"data-title" in got[0]  # written through, never replaced
    (tmp_path / "afile").write_text("x")
    r = gtrain("report", name, "-o", str(tmp_path / "afile" / "r.html"), cwd=tmp_path)
    assert r.returncode == 1 and "cannot write the report" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "afile").read_text() == "x"
