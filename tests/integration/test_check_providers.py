"""`gtrain check` (issue 41 item 3) for gcp (fake_gce; revoked: an application-default login whose refresh
token Google's token endpoint refuses with invalid_grant, as it does a revoked one), azure (fake_arm: good, none,
a token ARM refuses), kubernetes (fake_kube: good, none, a token the API server refuses), ray (the real Ray
fixture; none; an address where nothing answers) and slurm (the real Slurm fixture; none)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gtrain.providers.base import ProviderCheck
from tests.integration.test_check import bare, one  # noqa: F401 - the fixture is used by name

# ---------------------------------------------------------------------------------------------- gcp


def test_gcp_good(fake_gce: Any) -> None:
    r = one("gcp")
    assert r.ok, r
    assert r.reason == "project gtrain-test, region us-central1"
    assert (r.call or "").startswith("regions.get us-central1") and (r.quota or "").startswith("GPUs in us-central1")
    assert r.credentials and "GOOGLE_APPLICATION_CREDENTIALS" in r.credentials


def test_gcp_missing(bare: Path) -> None:  # noqa: F811
    r = one("gcp")
    assert not r.ok and "no application default credentials" in r.reason
    assert r.fix == "gcloud auth application-default login"


@pytest.fixture
def token_endpoint() -> Iterator[str]:
    """Google's OAuth token endpoint for a revoked refresh token: 400 invalid_grant."""

    class Refuse(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"error": "invalid_grant", "error_description": "Token has been expired or revoked."})
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/token"
    finally:
        srv.shutdown()
        srv.server_close()


def test_gcp_revoked(fake_gce: Any, token_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import google.oauth2.credentials as user_creds

    # `gcloud auth application-default login`'s file; google-auth always sends its refresh token to Google's
    # token endpoint (it ignores the file's token_uri): that endpoint, here, is the stub that refuses it
    monkeypatch.setattr(user_creds, "_GOOGLE_OAUTH2_TOKEN_ENDPOINT", token_endpoint)
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "c.apps.googleusercontent.com",
                               "client_secret": "s", "refresh_token": "revoked"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    r = one("gcp")
    assert not r.ok and "refused the credentials" in r.reason and "invalid_grant" in r.reason, r.reason
    assert r.fix == "gcloud auth application-default login"
    assert "GOOGLE_APPLICATION_CREDENTIALS" in (r.credentials or "")


# ---------------------------------------------------------------------------------------------- azure


def test_azure_good(fake_arm: Any) -> None:
    r = one("azure")
    assert r.ok, r
    assert r.credentials == "GTRAIN_AZURE_ACCESS_TOKEN" and (r.call or "").startswith("list resource groups of ")
    assert r.quota and "eastus" in r.quota


def test_azure_missing(bare: Path) -> None:  # noqa: F811
    r = one("azure")
    assert not r.ok and "no Azure login" in r.reason and r.fix == "az login"


def test_azure_revoked(fake_arm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_AZURE_ACCESS_TOKEN", "expired-token")
    r = one("azure")
    assert not r.ok and "refused the credentials" in r.reason and "InvalidAuthenticationToken" in r.reason, r.reason
    assert r.fix == "az login"


# ---------------------------------------------------------------------------------------------- kubernetes


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Any]:
    from tests.fixtures.fake_kube import FakeKube, FakeNode

    k = FakeKube(tmp_path / "kube", nodes=[FakeNode(f"gpu-{i}", {}, {"nvidia.com/gpu": "8"}) for i in range(2)])
    k.start()
    try:
        yield k
    finally:
        k.stop()


def test_kubernetes_good_and_revoked(kube: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "good")))
    r = one("kubernetes")
    assert r.ok, r
    assert r.call == "get namespace default: Active" and r.quota == "16 GPUs allocatable on 2 nodes"
    assert r.credentials == f"kubeconfig {tmp_path / 'good'}"

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "revoked", token="revoked")))
    r = one("kubernetes")
    assert not r.ok and "refused the kubeconfig's credentials" in r.reason, r.reason
    assert r.fix and r.fix.startswith("refresh the kubeconfig's token")


def test_kubernetes_missing(bare: Path) -> None:  # noqa: F811
    r = one("kubernetes")
    assert not r.ok and "no kubeconfig" in r.reason and r.fix and r.fix.startswith("export KUBECONFIG=")


# ---------------------------------------------------------------------------------------------- ray, slurm


def test_ray_missing_and_unreachable(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    r = one("ray")
    assert not r.ok and "no Ray address" in r.reason and r.fix and r.fix.startswith("export RAY_ADDRESS=")
    from tests.services import free_port

    monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{free_port()}")
    r = one("ray", timeout=3)
    assert not r.ok and "does not answer" in r.reason, r.reason


@pytest.mark.slow
def test_ray_good(ray_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    r = one("ray")
    assert r.ok, r
    assert (r.call or "").startswith("GET /api/version: Ray ") and "alive nodes" in (r.quota or "")


def test_slurm_missing(bare: Path) -> None:  # noqa: F811
    r = one("slurm")
    assert not r.ok and "not a Slurm login node" in r.reason and r.fix and "slurm: {login:" in r.fix


@pytest.mark.slow
def test_slurm_good(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    r = one("slurm")
    assert r.ok, r
    assert "debug" in r.reason and (r.quota or "").endswith("on 2 nodes")


def test_every_builtin_has_a_check() -> None:
    from gtrain.registry import CHECKS, REGISTRY, check_function

    assert set(CHECKS) == set(REGISTRY)
    for name in CHECKS:
        assert callable(check_function(name))
    assert ProviderCheck("x", True, "y").to_dict()["ok"] is True
