"""A CPU-only node (no nvidia-smi) whose RAPL counters are readable still gets its power sampled: the sampler
starts for the host CPU alone, and the run's energy is the CPU packages', marked as such (never "no energy
data", never GPU). The powercap folder is a stand-in laid out as the kernel's (Documentation/power/powercap/
powercap.rst: intel-rapl:N/energy_uj, max_energy_range_uj), its counter advanced at a constant 40 W."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

import gtrain


def test_a_cpu_only_node_with_rapl_counts_its_host_cpu_energy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    assert shutil.which("nvidia-smi") is None  # a CPU node: no GPU power readings at all
    monkeypatch.delenv("GTRAIN_NVIDIA_SMI", raising=False)
    monkeypatch.setenv("GTRAIN_TELEMETRY_INTERVAL", "0.5")
    rapl = tmp_path / "powercap"
    for zone in ("intel-rapl:0", "intel-rapl:0:0"):
        (rapl / zone).mkdir(parents=True)
        (rapl / zone / "max_energy_range_uj").write_text("262143328850\n")
        (rapl / zone / "energy_uj").write_text("0\n")
    monkeypatch.setenv("GTRAIN_RAPL_DIR", str(rapl))
    stop = threading.Event()

    def count(t0: float = time.time()) -> None:
        while not stop.wait(0.05):
            tmp = rapl / "intel-rapl:0" / "energy_uj.tmp"
            tmp.write_text(f"{int((time.time() - t0) * 40e6)}\n")
            tmp.replace(rapl / "intel-rapl:0" / "energy_uj")

    threading.Thread(target=count, daemon=True).start()
    (tmp_path / "w.py").write_text("import time\ntime.sleep(4)\n")
    spec = tmp_path / "cpu.yaml"
    spec.write_text(json.dumps({"name": "cpu-rapl", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(tmp_path), "run": "w.py", "launcher": "python"}}))
    gtrain.up(spec)
    try:
        job = gtrain.launch(spec)
        assert gtrain.wait("cpu-rapl", job_id=job.job_id).status == "succeeded"
    finally:
        gone = gtrain.down("cpu-rapl")
        stop.set()
    e = gone.cost.energy
    assert e is not None and e["host_only"] is True and e["note"].startswith("host CPU packages only"), e
    node = e["nodes"][0]
    assert node["gpus"] == 0 and node["kwh"] is None and node["seconds"] == 0  # no GPU figure
    assert e["kwh"] == e["host_kwh"] and e["kwh"] > 0
    # 40 W over the span of the host samples (about the job's 4 s): 40 W x 2.5 to 5.5 s
    assert 40 * 2.5 / 3.6e6 <= e["kwh"] <= 40 * 5.5 / 3.6e6, e
