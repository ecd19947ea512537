"""provider: kubernetes against tests/fixtures/fake_kube.py (an API server at the wire whose kubelet runs each
pod as real processes): `gtrain run` of a 2-pod x 2-process torchrun job, a failing rank's exit code, `down`
mid-run leaving no labelled object, an evicted pod as PREEMPTED, pending reasons, the API's errors at `up`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.fake_kube import FakeKube, FakeNode

JOBS = Path(__file__).parent / "jobs"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    root = Path(tempfile.mkdtemp(prefix="gtrain-kube-"))
    k = FakeKube(root, nodes=[FakeNode(f"gpu-{i}", dict(H100), {"nvidia.com/gpu": "8"}) for i in range(2)]).start()
    try:
        yield k
    finally:
        k.stop()
        shutil.rmtree(root, ignore_errors=True)


def cli(kube: FakeKube, tmp: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cfg = kube.kubeconfig(tmp / "kubeconfig")
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**os.environ, "KUBECONFIG": str(cfg)})


def spec(tmp: Path, name: str, run: str, gpus: int = 8, **kube: Any) -> str:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "slurm_train.py", work / "slurm_train.py")
    doc = {"name": name, "provider": "kubernetes", "num_nodes": 2, "resources": {"accelerators": f"H100:{gpus}"},
           "kubernetes": {"shm_gb": 0, **kube},
           "job": {"image": "nvcr.io/nvidia/pytorch:25.01-py3", "workdir": str(work), "run": run,
                   "nproc_per_node": 2, "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}}}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_run_two_pods_four_ranks(kube: FakeKube, tmp_path: Path) -> None:
    res = cli(kube, tmp_path, "run", spec(tmp_path, "k8s-run", "slurm_train.py --steps 3"), "--no-report",
              "--to", str(tmp_path / "pulled"))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    for r in range(4):  # every rank's lines, from the pods' logs
        assert f"slurm rank {r}/4" in out, out[-4000:]
        assert f"slurm rank {r} step 3 sum 10.0" in out, out[-4000:]
    assert "created as Indexed Job" in out
    assert kube.labelled("gtrain.dev/cluster") == []  # down deleted every object of the cluster
    posted = [p for m, p in kube.requests if m == "POST"]
    assert any(p.endswith("/jobs") for p in posted) and any(p.endswith("/services") for p in posted)


def test_failing_rank_exit_code_comes_out(kube: FakeKube, tmp_path: Path) -> None:
    res = cli(kube, tmp_path, "run", spec(tmp_path, "k8s-fail", "slurm_train.py --steps 1 --exit-code 7"),
              "--no-report", "--to", str(tmp_path / "pulled"))
    assert res.returncode == 7, (res.stdout + res.stderr)[-4000:]
    assert kube.labelled("gtrain.dev/cluster") == []
