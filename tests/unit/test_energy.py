"""kWh from GPU telemetry: the recorded nvidia-smi rows of an 8-GPU node (tests/fixtures/nvidia_smi) at a known
constant draw over a known time; gaps, TDP estimates, CPU nodes, the carbon table; the report and the cost
report carry it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gtrain.health import energy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_smi"


def _recorded(name: str) -> list[tuple[int, float | None, float | None]]:
    """(gpu, util, power) of each row of a recorded `--query-gpu=index,utilization.gpu,...,power.draw` capture."""
    out = []
    for line in (FIXTURES / name).read_text().splitlines():
        cells = [c.strip() for c in line.split(",")]
        num = [None if c.startswith("[") else float(c) for c in cells]
        out.append((int(cells[0]), num[1], num[5]))
    return out


def _write(path: Path, rows: list[tuple[int, float | None, float | None]], t0: float, seconds: float,
           every: float = 10.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        n = int(seconds / every)
        for k in range(n + 1):
            for gpu, util, power in rows:
                f.write(json.dumps({"t": t0 + k * every, "gpu": gpu, "util": util, "power": power}) + "\n")


def test_eight_gpus_at_a_known_draw_match_to_one_percent(tmp_path: Path) -> None:
    rows = _recorded("a100_telemetry.csv")  # 8 GPUs, 387.12 .. 394.12 W
    assert len(rows) == 8
    _write(tmp_path / "telemetry" / "node-0.jsonl", rows, 1_700_000_000.0, 3600.0)
    e = energy.from_folders([tmp_path / "telemetry"], gpu_name="A100", region="us-east4")
    expected = sum(p for _, _, p in rows if p) * 3600 / 3.6e6  # W x s -> kWh
    assert e.kwh is not None and abs(e.kwh - expected) / expected < 0.01
    assert e.nodes[0].gpus == 8 and not e.estimate and e.nodes[0].gap_s == 0
    assert e.carbon and e.carbon["gco2_per_kwh"] == 323.05 and e.carbon["date"] == "2024"
    assert "region-carbon-info" in e.carbon["source"] and e.carbon["estimate"] is True
    assert abs(e.carbon["kg_co2e"] - expected * 0.32305) < 1e-3


def test_gap_is_left_out_and_said(tmp_path: Path) -> None:
    rows = [(0, 50.0, 300.0)]
    _write(tmp_path / "t" / "node-0.jsonl", rows, 0.0, 600.0)
    _write(tmp_path / "t2" / "node-0.jsonl", rows, 4000.0, 600.0)
    lines = (tmp_path / "t" / "node-0.jsonl").read_text() + (tmp_path / "t2" / "node-0.jsonl").read_text()
    (tmp_path / "t" / "node-0.jsonl").write_text(lines)
    n = energy.node_energy(0, energy.read_samples(tmp_path / "t" / "node-0.jsonl"))
    assert n.kwh is not None and abs(n.kwh - 300 * 1200 / 3.6e6) < 1e-9 and n.gap_s == 3400


def test_no_power_reading_is_estimated_from_tdp_and_marked(tmp_path: Path) -> None:
    rows = [(g, 50.0, None) for g in range(2)]
    _write(tmp_path / "telemetry" / "node-0.jsonl", rows, 0.0, 3600.0)
    e = energy.from_folders([tmp_path / "telemetry"], gpu_name="H100", region=None)
    assert e.estimate and abs((e.kwh or 0) - 2 * 350 / 1000) < 1e-6 and "TDP" in e.note()
    assert e.carbon is None  # no region, no override


def test_cpu_nodes_have_no_energy_data_never_zero(tmp_path: Path) -> None:
    (tmp_path / "telemetry").mkdir()
    e = energy.from_folders([tmp_path / "telemetry"], region="us-east4")
    assert e.kwh is None and e.to_dict()["kwh"] is None and e.note().startswith("no energy data")
    assert e.carbon is None


def test_spec_override_of_grid_intensity() -> None:
    c = energy.carbon(2.0, "us-east4", {"grid_gco2_per_kwh": 100, "grid_source": "our PPA, 2025"})
    assert c == {"kg_co2e": 0.2, "gco2_per_kwh": 100.0, "estimate": True, "source": "our PPA, 2025", "date": None,
                 "region": "us-east4"}
    assert energy.carbon(1.0, "us-east-1")["source"].endswith("the grid of us-east4 (Northern Virginia) as a proxy")


def test_report_has_power_chart_and_energy_line(tmp_path: Path) -> None:
    from gtrain.runlog.html import render_report
    from gtrain.runlog.model import load_run

    _write(tmp_path / "telemetry" / "node-0.jsonl", _recorded("a100_telemetry.csv"), 1_700_000_000.0, 600.0)
    cluster = {"id": "c-1", "name": "c", "provider": "gcp", "region": "us-central1", "created_at": 1_700_000_000.0,
               "spec": {"resources": {"accelerators": "A100:8"}}}
    job = {"id": "j-1", "status": "succeeded", "exit_code": 0, "created_at": 1_700_000_000.0,
           "ended_at": 1_700_000_600.0}
    run = load_run(tmp_path, cluster, job)
    assert run.summary()["energy"]["kwh"] > 0.5
    html = render_report(run)
    assert 'data-kind="power"' in html and "GPU power draw (W)" in html
    assert "kWh" in html and "kg CO2e" in html and "412.72" in html


def test_integral_is_cached_until_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "telemetry" / "node-0.jsonl"
    _write(path, [(0, 50.0, 100.0)], 0.0, 100.0)
    first = energy.from_folders([tmp_path / "telemetry"]).kwh
    assert (tmp_path / ".cache" / energy.CACHE).is_file()
    assert energy.from_folders([tmp_path / "telemetry"]).kwh == first
    _write(path, [(0, 50.0, 1000.0)], 0.0, 100.0)  # rewritten (another size): counted again
    assert energy.from_folders([tmp_path / "telemetry"]).kwh == pytest.approx(10 * first, rel=1e-3)  # type: ignore[operator]


def test_rapl_counters_integrate_through_a_wrap_and_stay_out_of_the_gpu_charts(tmp_path: Path) -> None:
    from gtrain.runlog.model import read_gpus

    top = 1_000_000_000  # max_energy_range_uj
    path = tmp_path / "telemetry" / "node-0.jsonl"
    _write(path, [(0, 50.0, 100.0)], 0.0, 20.0)
    with open(path, "a") as f:  # 30 W per package, two packages; package 1 wraps between t=10 and t=20
        for t, a, b in ((0.0, 0, top - 100_000_000), (10.0, 300_000_000, top - 100_000_000 + 300_000_000 - top),
                        (20.0, 600_000_000, 500_000_000)):
            f.write(json.dumps({"t": t, "host": "rapl", "uj": [a, b], "max_uj": [top, top]}) + "\n")
    e = energy.from_folders([tmp_path / "telemetry"], region="us-west1")
    assert e.host_kwh == pytest.approx(2 * 30 * 20 / 3.6e6, rel=1e-3) and "RAPL" in e.note()
    assert e.carbon and e.carbon["kg_co2e"] == pytest.approx((e.kwh + e.host_kwh) * 0.07923, rel=1e-3)  # type: ignore[operator]
    assert [(g.node, g.gpu, len(g.t)) for g in read_gpus(tmp_path / "telemetry")] == [(0, 0, 3)]


def test_top_shows_each_nodes_kwh_so_far_beside_the_watts() -> None:
    """`gtrain top`: node 0 (8 GPUs at 300 W for 10 min = 0.4 kWh) and node 1 (RAPL only: host CPU, marked)
    show their kWh so far in the column after the watts; a node without data shows "-", never 0."""
    from gtrain.cli.health_cmds import TOP_COLUMNS, with_kwh
    from gtrain.health import telemetry
    from gtrain.health.energy import Energy, node_energy

    samples = [{"t": float(t), "gpu": g, "power": 300.0, "util": 90.0} for t in range(0, 601, 10) for g in range(8)]
    rapl = [{"t": float(t), "host": "rapl", "uj": [60 * t * 10**6], "max_uj": [10**12]}  # 60 W for 600 s
            for t in range(0, 601, 10)]
    doc = Energy([node_energy(0, samples), node_energy(1, rapl), node_energy(2, [])]).to_dict()
    tele = [telemetry.NodeTelemetry(0, samples[-8:]), telemetry.NodeTelemetry(1, []), telemetry.NodeTelemetry(2, [])]
    rows = with_kwh(telemetry.rows(tele, now=601.0), doc)
    assert all(len(r) == len(TOP_COLUMNS) for r in rows) and TOP_COLUMNS[5:7] == ["power", "energy"]
    assert [r[5:7] for r in rows if r[0] == 0] == [["300 W", "0.4 kWh"]] * 8
    assert [r[6] for r in rows if r[0] == 1] == ["0.01 kWh (incl. CPU)"]  # 60 W x 600 s = 0.01 kWh
    assert [r[6] for r in rows if r[0] == 2] == ["-"]
