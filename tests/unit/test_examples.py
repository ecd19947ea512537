"""Every spec in examples/ loads and dry-runs offline (issue 40): `gtrain run SPEC --dry-run` through the real CLI
entry point, with no network (proxies and the kubeconfig's API server point nowhere, no cloud credentials), exit
0, the plan and every node's scripts printed, nothing made, in under a second of CPU each. One example per
provider (a TPU slice and CoreWeave too) is part of the promise."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from gtrain.cli.app import main
from gtrain.signals import HANDLED

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if p.name != "accelerate.yaml")
NOWHERE = "127.0.0.1:9"  # nothing listens there


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["gtrain", *argv]
    handlers = {s: signal.getsignal(s) for s in HANDLED}  # main() installs gtrain's: pytest keeps its own
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
        for s, h in handlers.items():
            signal.signal(s, h)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # a context whose API server is not there
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://{NOWHERE}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.setenv(k, f"http://{NOWHERE}")
    monkeypatch.setenv("LAMBDA_API_URL", f"http://{NOWHERE}/api/v1")
    monkeypatch.setenv("GTRAIN_CHECKIP_URL", f"http://{NOWHERE}/")
    for k in ("LAMBDA_API_KEY", "RAY_ADDRESS", "AWS_ENDPOINT_URL", "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE",
              "GTRAIN_AZURE_ARM_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)


def test_one_example_per_provider() -> None:
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    providers = {d.get("provider", "local") for d in docs}
    assert providers >= {"local", "ssh", "aws", "gcp", "azure", "lambda", "slurm", "kubernetes", "ray"}, providers
    assert any(str((d.get("resources") or {}).get("accelerators", "")).startswith("tpu-") for d in docs)
    assert any((d.get("kubernetes") or {}).get("profile") == "coreweave" for d in docs)
    for p in EXAMPLES:  # each says what it is and how to check it
        head = p.read_text().splitlines()[0]
        assert head.startswith("# "), p


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Import what the dry run imports once, so each case's time is its own work."""
    _cli("run", str(ROOT / "examples" / "quickstart" / "spec.yaml"), "--dry-run")


@pytest.mark.parametrize("example", EXAMPLES, ids=[str(p.relative_to(ROOT / "examples")) for p in EXAMPLES])
def test_example_dry_runs_offline(example: Path, offline: None, gtrain_home: Path) -> None:
    t, cpu = time.monotonic(), time.process_time()
    code, out, err = _cli("run", str(example), "--dry-run")
    took, cpu = time.monotonic() - t, time.process_time() - cpu
    assert code == 0, err[-3000:]
    assert out.startswith("plan\n"), out[:2000]
    assert "# ---- node 0:" in out, out[:3000]
    assert "Traceback" not in out + err
    assert cpu < 1.0 and took < 10.0, f"{example.name}: {cpu:.2f}s of CPU, {took:.2f}s in all"
    assert not gtrain_home.exists() or not any(gtrain_home.iterdir()), sorted(os.listdir(gtrain_home))
