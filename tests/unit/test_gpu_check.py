"""bench/gpu_check.sh on a machine without a GPU (as in CI): one "no GPU" line, exit 0, its JSON says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def check(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    out = tmp_path / "gpu.json"
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "GPUCHECK_OUT": str(out), **env})
    return res, json.loads(out.read_text())


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs the real check")
def test_no_nvidia_smi_is_a_no_gpu_line_and_exit_0(tmp_path: Path) -> None:
    res, doc = check(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gpu_check: no GPU: nvidia-smi not found" in res.stdout
    assert doc["gpu"] is False and doc["reason"] == "nvidia-smi not found"


def test_an_nvidia_smi_without_a_driver_is_no_gpu_too(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"  # what it prints on a machine with the tools but no driver loaded
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the NVIDIA "
                   "driver. Make sure that the latest NVIDIA driver is installed and running.'\nexit 9\n")
    smi.chmod(0o755)
    res, doc = check(tmp_path, GPUCHECK_NVIDIA_SMI=str(smi))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gpu_check: no GPU: nvidia-smi lists no GPU (exit 9: NVIDIA-SMI has failed" in res.stdout
    assert doc["gpu"] is False


def test_the_default_results_file_is_bench_results_gpu_json() -> None:
    text = SCRIPT.read_text() + (ROOT / "bench" / "gpu_check.py").read_text()
    assert '"bench" / "results" / "gpu.json"' in text and "timeout" in text and "pip install" not in text
