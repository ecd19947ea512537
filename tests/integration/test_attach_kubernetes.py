"""`gtrain attach NAME --provider kubernetes` after the home that ran `up` and `launch` is deleted, against the
wire-level fake API server (tests/fixtures/fake_kube.py): found by gtrain's labels (the cluster's anchor
ConfigMap, which keeps the attach record); from the empty home, status, pull (from the running pods), logs,
cancel and down work, and no labelled object is left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.context import Context
from gtrain.errors import ConfigError, GtrainError
from gtrain.runs.attach import attach
from gtrain.spec import load_spec
from tests.fixtures.fake_kube import FakeKube
from tests.integration.test_kubernetes import kube, spec

__all__ = ["kube"]  # the fixture


def test_attach_kubernetes_after_the_home_is_gone(kube: FakeKube, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig")))
    path = spec(tmp_path, "k8s-attach", "slurm_train.py --steps 200 --step-s 0.3", gpus=1)
    ctx = Context()
    try:  # nothing of that name in the namespace yet: one message, exit 2, nothing recorded
        with pytest.raises(ConfigError, match="no live kubernetes resources tagged as cluster 'k8s-attach'"):
            attach(ctx, "k8s-attach", "kubernetes", [], load_spec(path))
        assert ctx.store.list_clusters(include_terminated=True) == []
    finally:
        ctx.store.close()
    gtrain.up(path)
    job_id = gtrain.launch(path).job_id
    shutil.rmtree(os.environ["GTRAIN_HOME"])  # the laptop is gone
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "b"))
    res = subprocess.run([sys.executable, "-m", "gtrain", "attach", "k8s-attach", path, "--provider", "kubernetes",
                          "--json"], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["jobs"] == [job_id]
    try:  # the rest in this process, from the home the attach made
        deadline = time.monotonic() + 90
        while True:  # the ranks run and have written a checkpoint
            st = gtrain.status("k8s-attach")[0]
            if [j["status"] for j in st["jobs"]] == ["running"]:
                try:
                    gtrain.pull("k8s-attach", to=tmp_path / "pulled")
                except GtrainError:
                    pass
                if (tmp_path / "pulled" / "state.json").exists():
                    break
            assert time.monotonic() < deadline, st
            time.sleep(0.5)
        lines: list[str] = []
        gtrain.logs("k8s-attach", tail=50, on_line=lambda ln: lines.append(ln.text))
        assert any("slurm rank 3/4" in t for t in lines), lines
        gtrain.cancel("k8s-attach")
        assert [j["status"] for j in gtrain.status("k8s-attach")[0]["jobs"]] == ["cancelled"]
    finally:
        down = gtrain.down("k8s-attach")
    assert len(down.cost.lines) == 2 and all((ln.note or "").startswith("reconstructed by gtrain attach")
                                             for ln in down.cost.lines)
    assert kube.labelled("gtrain.dev/cluster") == []
