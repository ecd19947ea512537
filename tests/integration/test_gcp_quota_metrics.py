"""The GPU quota pre-check of ``resources.any_of`` (gtrain/providers/gcp/quota.py) against the fake Compute
Engine, whose regions.get lists only the GPU metrics the API's Quota.metric enum publishes (issue 40): a metric
the region does not list (on-demand H100 and the H200, B200 families) is "cannot tell", never zero quota."""

from __future__ import annotations

import pytest

from gtrain.providers.gcp.provider import GCPProvider
from gtrain.providers.gcp.quota import gpu_metric
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_gce import FakeGCE

pytestmark = pytest.mark.usefixtures("fake_gce")


def spec(accelerators: str, spot: bool = False) -> ClusterSpec:
    return parse_spec({"name": "quota-metrics", "provider": "gcp", "num_nodes": 1,
                       "resources": {"accelerators": accelerators, "region": "us-central1", "use_spot": spot},
                       "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False}})


def check(s: ClusterSpec) -> str | None:
    store = StateStore()
    try:
        p = GCPProvider(store)
        return p.quota_check(s, p.plan(s))
    finally:
        store.close()


def test_published_metric_names() -> None:
    assert gpu_metric("nvidia-h100-80gb", False) == "NVIDIA_H100_GPUS"
    assert gpu_metric("nvidia-h100-80gb", True) == "PREEMPTIBLE_NVIDIA_H100_GPUS"
    assert gpu_metric("nvidia-tesla-t4", True) == "PREEMPTIBLE_NVIDIA_T4_GPUS"
    assert gpu_metric("nvidia-a100-80gb", False) == "NVIDIA_A100_80GB_GPUS"


def test_a_metric_the_region_does_not_list_is_cannot_tell_not_zero(fake_gce: FakeGCE) -> None:
    # regions.get lists no NVIDIA_H100_GPUS (as the real API): before, that read as 0 and skipped every H100 region
    assert check(spec("H100:8")) is None


def test_a_listed_metric_still_skips_a_region_that_cannot_hold_it(fake_gce: FakeGCE) -> None:
    fake_gce.quotas["us-central1"] = {"PREEMPTIBLE_NVIDIA_H100_GPUS": (8.0, 4.0)}  # 4 of 8 free; 8 asked
    why = check(spec("H100:8", spot=True))
    assert why is not None and "PREEMPTIBLE_NVIDIA_H100_GPUS in us-central1: 8, 4 in use, 8 GPUs asked" in why, why
