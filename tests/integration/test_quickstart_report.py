"""`make demo` (gtrain run examples/quickstart/spec.yaml) writes a report whose first page shows the loss curve:
the quickstart logs its loss with gtrain.metrics; the report is opened in real headless Chromium (chromedriver)
and the curve is drawn with one point per logged step."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1400,2600"]
# train.py --steps 40 logs the mean loss at steps 0, 5, ..., 35 and the last step (39)
LOGGED_STEPS = 9


def test_make_demo_report_draws_the_loss_curve(tmp_path: Path) -> None:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver are not installed (.ci/install-deps installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    r = subprocess.run([sys.executable, "-m", "gtrain", "run", str(ROOT / "examples/quickstart/spec.yaml"),
                        "--to", "quickstart-checkpoints"], capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    m = re.search(r"^report: (.+)$", r.stdout, re.M)
    assert m, r.stdout
    report = tmp_path / m.group(1)  # as printed: relative to where `run` ran
    assert report.is_file() and "No metrics were logged" not in report.read_text()

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        drv.get(report.as_uri())
        lines = drv.execute_script(
            "const s = document.querySelector('svg.chart[data-kind=metric][data-title=loss]');"
            "return s ? [...s.querySelectorAll('polyline')].map(p => [p.points.numberOfItems, p.getBBox().width,"
            " p.getBBox().height]) : null")
        assert lines is not None, "no loss chart in the report"
        assert len(lines) == 1  # rank 0 logs the mean over every rank
        points, width, height = lines[0]
        assert points == LOGGED_STEPS and width > 100 and height > 10  # drawn across the plot, and it falls
        text = drv.execute_script("return document.body.innerText")
        assert "No metrics were logged" not in text
    finally:
        drv.quit()
