"""The nebius provider's pieces without a network: the ``nebius:`` section, platform and preset from the spec,
where the credentials come from (``NEBIUS_IAM_TOKEN``, the nebius CLI's ``~/.nebius/config.yaml``), gRPC failures
translated at the edge, the create request (preemptible, GPU cluster, cloud-init), labels as ownership."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gtrain.errors import CapacityError, ConfigError, CredentialsError, ProviderError, QuotaError
from gtrain.providers.nebius import api as napi
from gtrain.providers.nebius import gpus as ng
from gtrain.providers.nebius.options import nebius_options
from gtrain.providers.nebius.provider import cloud_init
from gtrain.providers.nebius.teardown import owner_of, owner_of_group
from gtrain.spec import parse_spec

BASE = {"project_id": "project-e00abc123", "subnet_id": "vpcsubnet-e00abc123"}


def res(acc: str | None = "H100:8", **kw: Any) -> Any:
    return parse_spec({"name": "u", "provider": "nebius", "resources": {"accelerators": acc, **kw} if acc else kw,
                       "nebius": BASE}).resources


def test_the_section_names_the_bad_field() -> None:
    assert nebius_options(BASE).image_family == "ubuntu22.04-cuda12"
    for bad, field in [({"subnet_id": "vpcsubnet-e00abc123"}, "nebius.project_id"),
                       ({**BASE, "preset": "eight-gpus"}, "nebius.preset"),
                       ({**BASE, "disk_type": "SSD"}, "nebius.disk_type"),
                       ({**BASE, "ssh_cidr": "203.0.113.7/32"}, "nebius.ssh_cidr"),
                       ({**BASE, "zone": "eu-north1-a"}, "nebius.zone")]:
        with pytest.raises(ConfigError) as e:
            nebius_options(bad)
        assert e.value.field == field, (bad, e.value.field)


def test_platform_and_preset_from_the_spec() -> None:
    p, preset = ng.choose(res("H100:8"), None, None)
    assert (p.id, preset, p.price(8, False), p.price(8, True)) == ("gpu-h100-sxm", "8gpu-128vcpu-1600gb", 23.6, 10.0)
    assert ng.choose(res("B200:1"), None, None)[1] == "1gpu-20vcpu-224gb"
    assert ng.choose(res(None), "gpu-h200-sxm", "8gpu-128vcpu-1600gb")[0].gpu == "H200"
    with pytest.raises(ConfigError) as e:
        ng.choose(res("H100:4"), None, None)
    assert e.value.field == "resources.accelerators" and "1, 8" in (e.value.hint or "")
    with pytest.raises(ConfigError) as e:
        ng.choose(res("H100:8"), "gpu-a100", None)
    assert e.value.field == "nebius.platform"
    with pytest.raises(ConfigError) as e:
        ng.choose(res(None), None, None)
    assert e.value.field == "resources"


def test_credentials_from_the_env_or_the_cli_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("NEBIUS_PROFILE", raising=False)
    monkeypatch.setenv("NEBIUS_IAM_TOKEN", "ne1-abc")
    assert napi.credentials_source() == "NEBIUS_IAM_TOKEN"
    monkeypatch.setenv("NEBIUS_IAM_TOKEN", " ")
    assert napi.credentials_source() is None
    (tmp_path / ".nebius").mkdir()
    cfg = tmp_path / ".nebius" / "config.yaml"
    cfg.write_text(yaml.safe_dump({"default": "work", "profiles": {
        "work": {"endpoint": "api.nebius.cloud", "auth-type": "service account",
                 "service-account-id": "serviceaccount-e00x", "public-key-id": "publickey-e00y",
                 "private-key-file-path": "~/.nebius/sa.pem", "parent-id": "project-e00abc123"},
        "home": {"endpoint": "api.nebius.cloud", "auth-type": "federation"}}}))
    assert napi.credentials_source() == "~/.nebius/config.yaml (profile work)"
    monkeypatch.setenv("NEBIUS_PROFILE", "home")
    assert napi.credentials_source() == "~/.nebius/config.yaml (profile home)"
    monkeypatch.setenv("NEBIUS_PROFILE", "gone")
    assert napi.credentials_source() is None
    cfg.write_text("profiles: [unclosed")
    assert napi.credentials_source() is None


def _err(code: str, message: str, **detail: Any) -> Exception:
    e = Exception("Request error")
    se = SimpleNamespace(**{"quota_failure": None, "not_enough_resources": None, "too_many_requests": None,
                            "bad_request": None, **detail})
    e.status = SimpleNamespace(code=SimpleNamespace(name=code), message=message,  # type: ignore[attr-defined]
                               service_errors=[se] if detail else [])
    return e


def test_grpc_failures_become_gtrain_errors() -> None:
    cases = [(_err("UNAUTHENTICATED", "invalid token"), CredentialsError, "UNAUTHENTICATED"),
             (_err("PERMISSION_DENIED", "no"), CredentialsError, "PERMISSION_DENIED"),
             (_err("RESOURCE_EXHAUSTED", "limit reached", quota_failure=object()), QuotaError, "RESOURCE_EXHAUSTED"),
             (_err("RESOURCE_EXHAUSTED", "no hosts", not_enough_resources=object()), CapacityError,
              "RESOURCE_EXHAUSTED"),
             (_err("RESOURCE_EXHAUSTED", "quota-ish words", too_many_requests=object()), ProviderError,
              "RESOURCE_EXHAUSTED"),
             (_err("INVALID_ARGUMENT", "spec.resources.preset: unknown"), ProviderError, "INVALID_ARGUMENT"),
             (_err("NOT_FOUND", "instance x not found"), ProviderError, "NOT_FOUND")]
    for e, kind, code in cases:
        got = napi.translate(e, "create instance gtrain-x-0")
        assert type(got) is kind and got.code == code, (e, got)  # type: ignore[attr-defined]
    assert "rate limit" in napi.translate(cases[4][0], "w").message
    assert napi.is_gone(napi.translate(cases[-1][0], "w"))
    assert not isinstance(napi.translate(_err("RESOURCE_EXHAUSTED", "x", too_many_requests=object()), "w"),
                          (QuotaError, CapacityError))


def test_the_create_request_and_cloud_init() -> None:
    pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB gtrain"
    ud = cloud_init("gtrain", pub, "c-1")
    doc = yaml.safe_load(ud)
    assert ud.startswith("#cloud-config\n") and doc["users"][0]["ssh_authorized_keys"] == [pub]
    assert doc["users"][0]["name"] == "gtrain"
    req = napi.instance_request(project_id="project-e00abc123", name="gtrain-c-1-0",
                                labels={"gtrain-cluster": "c-1", "gtrain-rank": "0"}, platform="gpu-h100-sxm",
                                preset="8gpu-128vcpu-1600gb", subnet_id="vpcsubnet-e00abc123",
                                image_family="ubuntu22.04-cuda12", disk_gb=200, disk_type="NETWORK_SSD", user_data=ud,
                                public_ip=False, gpu_cluster="computegpucluster-e00z", preemptible=True)
    s = req.spec
    assert s.preemptible.on_preemption.name == "STOP" and s.gpu_cluster.id == "computegpucluster-e00z"
    nic = s.network_interfaces[0]
    assert not nic.check_presence("public_ip_address") and nic.subnet_id.startswith("vpc")
    assert s.boot_disk.managed_disk.spec.size_gibibytes == 200 and s.boot_disk.attach_mode.name == "READ_WRITE"
    plain = napi.instance_request(project_id="project-e00abc123", name="n", labels={}, platform="gpu-h100-sxm",
                                  preset="1gpu-16vcpu-200gb", subnet_id="vpcsubnet-e00abc123",
                                  image_family="ubuntu22.04-cuda12", disk_gb=100, disk_type="NETWORK_HDD",
                                  user_data=ud, public_ip=True, gpu_cluster=None, preemptible=False)
    assert not plain.spec.check_presence("preemptible") and not plain.spec.check_presence("gpu_cluster")
    assert plain.spec.network_interfaces[0].check_presence("public_ip_address")


def test_ownership_is_the_label_and_the_name() -> None:
    assert owner_of({"name": "gtrain-abc-1", "labels": {"gtrain-cluster": "abc"}}) == ("abc", 1)
    assert owner_of({"name": "gtrain-abc-1", "labels": {"gtrain-cluster": "other"}}) is None
    assert owner_of({"name": "gtrain-abc-1", "labels": {}}) is None
    assert owner_of({"name": "mine", "labels": {"gtrain-cluster": "abc"}}) is None
    assert owner_of_group({"name": "gtrain-abc", "labels": {"gtrain-cluster": "abc"}}) == "abc"
    assert owner_of_group({"name": "their-cluster", "labels": {"gtrain-cluster": "abc"}}) is None
