"""GPU checks from recorded nvidia-smi outputs (tests/fixtures/nvidia_smi), served by the stub nvidia-smi on
PATH and read by the real node-side probe (a subprocess, as on a node)."""

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


@pytest.fixture
def smi_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin folder holding the stub nvidia-smi, first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(FIXTURES / "nvidia-smi")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return bindir


def node_probe(fixture: str | None, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    env = dict(os.environ)
    if fixture is None:
        env["PATH"] = "/nonexistent"
    else:
        env["GTRAIN_SMI_FIXTURE"] = fixture
    out = subprocess.run([sys.executable, "-", "health", str(tmp_path / "ckpt"), "", "0"], input=PROBE.read_text(),
                         capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out)


def by_name(checks: list) -> dict:  # type: ignore[type-arg]
    return {c.name: c for c in checks}


def test_healthy_a100_node_passes_every_check(smi_path: Path, tmp_path: Path) -> None:
    p = node_probe("a100_8_healthy", tmp_path)
    assert p["gpu"]["cuda"] == "12.2" and p["gpu"]["fields"] == "full"
    rows = gpu.parse_csv(p["gpu"]["csv"])
    assert len(rows) == 8 and rows[0]["memory.total"] == "40960" and rows[0]["power.draw"] == "52.30"
    assert rows[0]["retired_pages.pending"] is None  # [N/A]
    checks = by_name(gpu.node_checks(0, p, "A100", 8))
    assert checks["gpu.count"].verdict is Verdict.OK and checks["gpu.count"].figure == "8/8"
    for name in ("gpu.ecc", "gpu.pages", "gpu.throttle", "gpu.persistence"):
        assert checks[name].verdict is Verdict.OK, checks[name]


def test_a_missing_gpu_fails_the_count_with_the_numbers(smi_path: Path, tmp_path: Path) -> None:
    c = by_name(gpu.node_checks(1, node_probe("h100_7_missing", tmp_path), "H100", 8))["gpu.count"]
    assert c.verdict is Verdict.FAIL and c.node == 1 and c.figure == "7/8"
    assert "spec asks H100:8, nvidia-smi lists 7 GPU(s)" in c.reason


def test_another_model_fails_the_count(smi_path: Path, tmp_path: Path) -> None:
    c = by_name(gpu.node_checks(0, node_probe("t4_1_healthy", tmp_path), "A100", 1))["gpu.count"]
    assert c.verdict is Verdict.FAIL and "Tesla T4" in c.reason


def test_ecc_volatile_fails_and_aggregate_only_warns(smi_path: Path, tmp_path: Path) -> None:
    p = node_probe("a100_8_ecc", tmp_path)
    c = by_name(gpu.node_checks(0, p, "A100", 8))["gpu.ecc"]
    assert c.verdict is Verdict.FAIL and "GPU 3 (serial 1320420010003): 2" in c.reason
    # the same node without GPU 3: only GPU 5's lifetime (aggregate) error is left -> a warning
    rows = [r for r in gpu.parse_csv(p["gpu"]["csv"]) if r["index"] != "3"]
    w = gpu._ecc(0, rows)
    assert w.verdict is Verdict.WARN and "GPU 5" in w.reason and w.figure == "1 uncorrectable (aggregate)"


def test_thermal_throttle_and_persistence_off_warn(smi_path: Path, tmp_path: Path) -> None:
    h = by_name(gpu.node_checks(0, node_probe("h100_8_thermal", tmp_path), "H100", 8))
    assert h["gpu.throttle"].verdict is Verdict.WARN and "GPU 2" in h["gpu.throttle"].reason
    assert "HW thermal slowdown" in h["gpu.throttle"].reason
    t = by_name(gpu.node_checks(0, node_probe("t4_1_healthy", tmp_path), "T4", 1))
    assert t["gpu.count"].verdict is Verdict.OK
    assert t["gpu.persistence"].verdict is Verdict.WARN and "nvidia-smi -pm 1" in t["gpu.persistence"].reason


def test_no_gpu_asked_none_found_is_skipped_but_asked_is_a_failure(tmp_path: Path) -> None:
    p = node_probe(None, tmp_path)
    assert p["gpu"]["present"] is False
    assert gpu.node_checks(0, p, None, 0)[0].verdict is Verdict.SKIPPED
    c = gpu.node_checks(0, p, "A100", 8)[0]
    assert c.verdict is Verdict.FAIL and "no nvidia-smi" in c.reason


def test_versions_must_match_across_nodes(smi_path: Path, tmp_path: Path) -> None:
    a, h = node_probe("a100_8_healthy", tmp_path), node_probe("h100_8_healthy", tmp_path)
    assert gpu.version_check({0: a, 1: a}).verdict is Verdict.OK  # type: ignore[union-attr]
    c = gpu.version_check({0: a, 1: h})
    assert c is not None and c.verdict is Verdict.WARN and "driver 550.90.07 on node(s) 1" in c.reason


def test_serial_found_by_uuid_or_index(smi_path: Path, tmp_path: Path) -> None:
    p = node_probe("h100_8_healthy", tmp_path)
    assert gpu.serial_of(p, 2, None) == "1652923010002"
    assert gpu.serial_of(p, None, "a91e2d47-0005-4b1c-8e2f-0d3c4b5a6978") == "1652923010005"


@pytest.mark.parametrize(("spec", "smi", "ok"), [
    ("A100", "NVIDIA A100-SXM4-40GB", True), ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
    ("A100-80GB", "NVIDIA A100-SXM4-40GB", False), ("H100", "NVIDIA H100 80GB HBM3", True),
    ("T4", "Tesla T4", True), ("L4", "NVIDIA L40S", False), ("L40S", "NVIDIA L40S", True),
])
def test_model_names(spec: str, smi: str, ok: bool) -> None:
    assert gpu.model_matches(spec, smi) is ok


def test_fatal_xid_fails_other_xid_warns_unreadable_is_unknown() -> None:
    line = "[ 1234.5] NVRM: Xid (PCI:0000:07:00): 79, pid=1234, GPU has fallen off the bus."
    assert gpu._xid(0, {"readable": True, "source": "dmesg", "count": 1, "lines": [line]}).verdict is Verdict.FAIL
    other = line.replace(": 79,", ": 13,")
    assert gpu._xid(0, {"readable": True, "source": "dmesg", "count": 1, "lines": [other]}).verdict is Verdict.WARN
    c = gpu._xid(0, {"readable": False})
    assert c.verdict is Verdict.SKIPPED and c.figure == "unknown"
