"""A real 2-node local job logs metrics through gtrain.metrics -> its archive -> `gtrain down` -> `gtrain report`
and `gtrain plot` from what gtrain kept. The report is opened in real headless Chromium (chromedriver): the
charts are drawn with the right number of points, no request leaves the page, no console errors, a screenshot
is taken. `gtrain plot` is read off a real terminal (tmux) at 80 and 200 columns."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gtrain
from gtrain.context import Context
from gtrain.runlog import archive

JOBS = Path(__file__).parent / "jobs"
STEPS = 20
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,2600"]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=cwd)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Two jobs on a 2-node x 2-process local cluster, archived, then the cluster torn down."""
    home = tmp_path_factory.mktemp("report-home")
    work = tmp_path_factory.mktemp("report-work")
    shutil.copy(JOBS / "metrics_job.py", work / "metrics_job.py")
    old = os.environ.get("GTRAIN_HOME")
    os.environ["GTRAIN_HOME"] = str(home)
    spec = work / "rep.yaml"
    spec.write_text(json.dumps({"name": "rep", "provider": "local", "num_nodes": 2, "job": {
        "workdir": str(work), "run": f"metrics_job.py --steps {STEPS}", "nproc_per_node": 2,
        "env": {"OMP_NUM_THREADS": "1"}}}))
    try:
        gtrain.up(spec)
        jobs = []
        for _ in range(2):
            launched = gtrain.launch(cluster="rep")
            final = gtrain.wait("rep", job_id=launched.job_id)
            assert (final.status, final.exit_code) == ("succeeded", 0)
            jobs.append(launched.job_id)
        # a third, slower job followed live by `gtrain plot --follow` (piped: one frame after another)
        slow = work / "slow.yaml"
        slow.write_text(spec.read_text().replace(f"--steps {STEPS}", f"--steps {STEPS} --step-sleep 0.25"))
        live = gtrain.launch(slow, cluster="rep").job_id
        follow = cli("plot", "rep", "--job", live, "--follow")
        assert follow.returncode == 0, follow.stderr
        frames = [f for f in follow.stdout.split("\n\n") if f.strip()]
        ctx = Context()
        c = ctx.cluster("rep")
        assert ctx.store.get_job(live).status == "succeeded"  # it ended with the job
        # what the lead wires into launch/recovery/down: events, and the archive before the nodes go
        archive.record_event(ctx.store.home, c.id, "recovery", node=1, job=jobs[0], msg="node 1 preempted")
        for res in archive.archive_cluster(ctx, c):
            assert not res.warnings, res.warnings
        assert archive.archive_cluster(ctx, c) == []  # kept once they ended
        ctx.store.close()
        gtrain.down("rep")
        yield {"home": home, "work": work, "jobs": jobs, "cluster_id": c.id, "live": live, "frames": frames}
    finally:
        os.environ["GTRAIN_HOME"] = str(home)
        gtrain.down("rep")
        if old is None:
            os.environ.pop("GTRAIN_HOME", None)
        else:
            os.environ["GTRAIN_HOME"] = old


@pytest.fixture
def env_home(ran: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GTRAIN_HOME", str(ran["home"]))
    monkeypatch.setenv("NO_COLOR", "1")
    return Path(str(ran["home"]))


def test_plot_follow_redraws_a_live_job_until_it_ends(ran: dict[str, object], env_home: Path) -> None:
    frames = list(ran["frames"])  # type: ignore[call-overload]
    assert len(frames) >= 2, frames  # redrawn while it ran
    assert "┌" in frames[-1] and "loss" in frames[-1].splitlines()[0]
    d = archive.job_dir(env_home, str(ran["cluster_id"]), str(ran["live"]))
    assert len((d / "metrics" / "rank-0.jsonl").read_text().splitlines()) == STEPS  # the last frame had it all


def test_archive_keeps_logs_metrics_and_telemetry_after_down(ran: dict[str, object], env_home: Path) -> None:
    jobs = list(ran["jobs"])  # type: ignore[call-overload]
    d = archive.job_dir(env_home, str(ran["cluster_id"]), jobs[0])
    assert sorted(p.name for p in (d / "metrics").iterdir()) == [f"rank-{r}.jsonl" for r in range(4)]
    assert sorted(p.name for p in (d / "telemetry").iterdir()) == ["node-0.jsonl", "node-1.jsonl"]
    assert len((d / "metrics" / "rank-0.jsonl").read_text().splitlines()) == STEPS
    from gtrain.state import StateStore

    lines = []
    store = StateStore()
    try:
        job = archive.logs_from_archive(store, "rep", job_id=jobs[0], on_line=lines.append)
    finally:
        store.close()
    assert job.id == jobs[0]
    assert {ln.rank for ln in lines if ln.text.endswith(" done")} == {0, 1, 2, 3}
    assert sum(1 for ln in lines if ln.text.startswith("step ")) == STEPS


def test_report_of_a_gone_cluster_opened_in_chromium(ran: dict[str, object], env_home: Path, tmp_path: Path) -> None:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver are not installed (.ci/install-deps installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    jobs = list(ran["jobs"])  # type: ignore[call-overload]
    out = tmp_path / "report.html"
    r = cli("report", "rep", "--job", jobs[0], "--out", str(out), "--log-keys", "tok_s")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        drv.get(out.as_uri())
        charts = {c.get_attribute("data-title"): c for c in drv.find_elements(By.CSS_SELECTOR, "svg.chart")}
        assert {"loss", "lr", "tok_s"} <= set(charts), list(charts)
        # the browser's own parse of each line's points (SVGPointList), one line per rank, every step drawn
        counts = drv.execute_script(
            "return [...document.querySelectorAll('svg.chart[data-kind=metric]')].map(s => [s.dataset.title,"
            " [...s.querySelectorAll('polyline')].map(p => [p.dataset.label, p.points.numberOfItems,"
            " p.getBBox().width])])")
        by = {title: lines for title, lines in counts}
        assert [(lb, n) for lb, n, _w in by["loss"]] == [(f"rank {r}", STEPS) for r in range(4)]
        assert [(lb, n) for lb, n, _w in by["tok_s"]] == [("rank 0", STEPS)]
        assert all(w > 100 for _t, lines in counts for _lb, _n, w in lines)  # really drawn across the plot
        cost = drv.execute_script(
            "const s = document.querySelector('svg.chart[data-kind=cost]');"
            "return [s.querySelectorAll('polyline').length, s.querySelectorAll('g.marker').length]")
        assert cost[0] == 2 and cost[1] >= 2  # a line per node; launch + the recovery marked
        gpu = drv.execute_script("return [...document.querySelectorAll('svg.chart[data-kind=gpu]')].map("
                                 "s => [...s.querySelectorAll('polyline')].map(p => p.points.numberOfItems))")
        assert gpu == [[6, 6, 6, 6], [6, 6, 6, 6]]  # util and memory: 2 nodes x 2 GPUs x 6 samples
        power = drv.execute_script("return [...document.querySelectorAll('svg.chart[data-kind=power]')].map("
                                   "s => [...s.querySelectorAll('polyline')].map(p => p.points.numberOfItems))")
        assert power == [[6, 6, 6, 6]]  # the stub's recorded power.draw, one line per GPU
        energy = drv.find_element(By.ID, "energy").text
        assert "kWh" in energy and "GPU power only" in energy, energy
        kinds = [e.get_attribute("data-kind") for e in drv.find_elements(By.CSS_SELECTOR, "tr.event")]
        assert kinds[:2] == ["up", "launch"] and "recovery" in kinds and kinds[-1] == "down"
        assert "metrics_job.py" in drv.find_element(By.ID, "spec-json").text
        png = tmp_path / "report.png"
        assert drv.save_screenshot(str(png)) and png.stat().st_size > 20_000
        resources = drv.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert resources == []
        requested = [json.loads(e["message"])["message"] for e in drv.get_log("performance")]
        sent = [m["params"] for m in requested if m["method"] == "Network.requestWillBeSent"]
        ours = [p["request"]["url"] for p in sent if p.get("documentURL") == out.as_uri()]
        assert ours == [out.as_uri()]  # the page itself, and nothing it asked for
        assert not [p["request"]["url"] for p in sent if p["request"]["url"].split(":")[0] in ("http", "https", "ws",
                                                                                               "wss", "ftp")]
        console = [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert console == []
    finally:
        drv.quit()


def _tmux_plot(tmp_path: Path, home: Path, width: int, *args: str) -> str:
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed (.ci/install-deps installs it)")
    sock = f"gtrain-plot-{os.getpid()}-{width}"
    env = {"GTRAIN_HOME": str(home), "NO_COLOR": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "TERM": "xterm-256color"}
    cmd = " ".join([sys.executable, "-m", "gtrain", "plot", "rep", *args]) + "; echo __EXIT=$?; sleep 60"
    conf = tmp_path / "tmux.conf"  # a fixed window size from the start (a detached one may resize later)
    conf.write_text(f"set -g default-size {width}x30\n")
    base = ["tmux", "-L", sock, "-f", str(conf)]
    subprocess.run([*base, "new-session", "-d", "-x", str(width), "-y", "30",
                    *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], cmd], check=True, timeout=30)
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            text = subprocess.run([*base, "capture-pane", "-p", "-t", "0"], capture_output=True, text=True,
                                  timeout=30).stdout
            if "__EXIT=" in text:
                break
            time.sleep(0.2)
        assert "__EXIT=0" in text, text
        return text.split("__EXIT=")[0]
    finally:
        subprocess.run([*base, "kill-server"], timeout=30, check=False)


@pytest.mark.parametrize("width", [80, 200])
def test_plot_in_a_real_terminal(ran: dict[str, object], env_home: Path, tmp_path: Path, width: int) -> None:
    jobs = list(ran["jobs"])  # type: ignore[call-overload]
    screen = _tmux_plot(tmp_path, env_home, width, "--job", jobs[0], "--job", jobs[1], "--metric", "loss")
    rows = [r.rstrip() for r in screen.splitlines() if r.strip()]
    border = [r for r in rows if "┌" in r and "┐" in r]
    assert border, screen
    assert width - 8 <= len(border[0]) <= width  # the chart fills the terminal's width, and no more
    assert all(len(r) <= width for r in rows)
    assert any("loss" in r for r in rows[:2])
    assert all(any(j in r for r in rows) for j in jobs)  # both jobs overlaid, each in the legend
    assert sum(ch in "⠁⠂⠄⡀⢀⠈⠐⠠⣀⣿" or 0x2800 <= ord(ch) <= 0x28FF for r in rows for ch in r) > width // 4
