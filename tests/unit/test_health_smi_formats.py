"""Where real nvidia-smi output differs from what a hand-written fixture would suggest (sources in
tests/fixtures/nvidia_smi/README.md): every bracketed value means "no value", and an older driver refuses the
whole --query-gpu for one name it lacks -- the probe drops that name and keeps the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.health import gpu
from gtrain.health.model import Verdict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_smi"
PROBE = Path(__file__).resolve().parents[2] / "gtrain" / "health" / "nodeprobe.py"


def test_every_bracketed_value_is_no_value() -> None:
    # `[Requested functionality has been deprecated]` is what a 590 driver prints for display_mode on an H100
    text = ("index, display_mode, ecc.errors.uncorrected.volatile.total, retired_pages.pending, "
            "clocks_event_reasons.active, power.draw [W]\n"
            "0, [Requested functionality has been deprecated], [GPU requires reset], [Not Supported], "
            "0x00000000000000C8, 69.85 W\n")
    row = gpu.parse_csv(text)[0]
    assert row["display_mode"] is None and row["ecc.errors.uncorrected.volatile.total"] is None
    assert row["retired_pages.pending"] is None and row["power.draw"] == "69.85"
    assert row["clocks_throttle_reasons.active"] == "0x00000000000000C8"  # the current name, read as the old
    assert gpu._int(row["clocks_throttle_reasons.active"]) == 0xC8  # upper-case hex digits as printed


def probe(env: dict[str, str], tmp_path: Path) -> dict:  # type: ignore[type-arg]
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "nvidia-smi").exists():
        (bindir / "nvidia-smi").symlink_to(FIXTURES / "nvidia-smi")
    full = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", **env}
    out = subprocess.run([sys.executable, "-", "health", str(tmp_path), "", "0"], input=PROBE.read_text(),
                         capture_output=True, text=True, env=full, check=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("fixture", ["a100_8_ecc"])
def test_a_driver_without_remapped_rows_fields_keeps_ecc_and_pages(fixture: str, tmp_path: Path) -> None:
    old = probe({"GTRAIN_SMI_FIXTURE": fixture,
                 "GTRAIN_SMI_UNKNOWN": "remapped_rows.pending,remapped_rows.failure"}, tmp_path)["gpu"]
    assert old["rc"] == 0 and old["fields"] == "partial"
    assert old["dropped"] == ["remapped_rows.pending", "remapped_rows.failure"]
    rows = gpu.parse_csv(old["csv"])
    assert len(rows) == 8 and "remapped_rows.pending" not in rows[0]
    ecc = gpu._ecc(0, rows)  # still read: GPU 3's volatile uncorrectable errors fail the node
    assert ecc.verdict is Verdict.FAIL and "GPU 3 (serial 1320420010003): 2" in ecc.reason
    assert gpu._pages(0, rows).verdict is Verdict.OK
    new = probe({"GTRAIN_SMI_FIXTURE": fixture}, tmp_path)["gpu"]
    assert new["fields"] == "full" and new["dropped"] == []
