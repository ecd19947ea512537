"""The kubernetes: section (and its CoreWeave profile) and the pod state mapping, which touch no API server:
errors name kubernetes.<field>; DisruptionTarget is PREEMPTED, OOMKilled said as such."""

from __future__ import annotations

from typing import Any

import pytest

from gtrain.errors import ConfigError
from gtrain.jobs.backend import JobState
from gtrain.providers.kubernetes.options import parse_options
from gtrain.providers.kubernetes.states import pod_status
from gtrain.spec import parse_spec


def spec(job: dict[str, Any] | None = None, **kube: object) -> Any:
    return parse_spec({"name": "k", "provider": "kubernetes", "num_nodes": 2, "resources": {"accelerators": "H100:8"},
                       "kubernetes": kube, "job": job or {"run": "train.py", "image": "pytorch/pytorch:2.5.1"}})


@pytest.mark.parametrize(("section", "field"), [
    ({"namespce": "x"}, "kubernetes.namespce"), ({"namespace": "Not_A_Name"}, "kubernetes.namespace"),
    ({"shm_gb": -1}, "kubernetes.shm_gb"), ({"profile": "lambda"}, "kubernetes.profile"),
    ({"volumes": [{"claim": "data", "mount": "relative"}]}, "kubernetes.volumes"),
    ({"gpu_resource": "nvidia com/gpu"}, "kubernetes.gpu_resource"),
    ({"tolerations": [{"operator": "Maybe"}]}, "kubernetes.tolerations"),
    # issue 40: control characters, a bool / inf / huge shm, mounts that escape or shadow gtrain's own
    ({"context": "a\nb"}, "kubernetes.context"), ({"context": "a\x00b"}, "kubernetes.context"),
    ({"context": "\x1b[2J"}, "kubernetes.context"), ({"node_selector": {"k\n": "v"}}, "kubernetes.node_selector"),
    ({"node_selector": {"k": "v\x00"}}, "kubernetes.node_selector"),
    ({"tolerations": [{"key": "k", "value": "a\nb"}]}, "kubernetes.tolerations"),
    ({"tolerations": [{"key": "k\x1b"}]}, "kubernetes.tolerations"),
    ({"shm_gb": True}, "kubernetes.shm_gb"), ({"shm_gb": float("inf")}, "kubernetes.shm_gb"),
    ({"shm_gb": 1e6}, "kubernetes.shm_gb"),
    ({"volumes": [{"claim": "d", "mount": "/a/../etc"}]}, "kubernetes.volumes"),
    ({"volumes": [{"claim": "d", "mount": "/a:b"}]}, "kubernetes.volumes"),
    ({"volumes": [{"claim": "d", "mount": "/a\nb"}]}, "kubernetes.volumes"),
    ({"volumes": [{"claim": "d", "mount": "/a"}, {"claim": "e", "mount": "/a/"}]}, "kubernetes.volumes"),
    ({"volumes": [{"claim": "d", "mount": "/gtrain/data"}]}, "kubernetes.volumes"),
    ({"volumes": [{"claim": "d", "mount": "/gtrain-bundle"}]}, "kubernetes.volumes"),
    ({"volumes": [{"claim": "d", "mount": "/dev"}]}, "kubernetes.volumes"),
])
def test_bad_fields_are_config_errors_naming_the_field(section: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_options(spec(**section))
    assert e.value.field is not None and e.value.field.startswith(field) and e.value.exit_code == 2


def test_gtrain_mounts_are_the_pods_own() -> None:
    from gtrain.providers.kubernetes import objects
    from gtrain.providers.kubernetes.options import GTRAIN_MOUNTS

    assert GTRAIN_MOUNTS == (objects.ROOT, objects.BUNDLE_DIR, objects.CKPT_DIR, "/dev/shm")


def test_good_mounts_are_normalised() -> None:
    o = parse_options(spec(shm_gb=64, volumes=[{"claim": "d", "mount": "/data/"}, {"claim": "m", "mount": "/gtrainx"}]))
    assert [v.mount for v in o.volumes] == ["/data", "/gtrainx"] and o.shm_gb == 64


def test_image_is_required() -> None:
    with pytest.raises(ConfigError) as e:
        parse_options(spec({"run": "train.py"}))
    assert e.value.field == "job.image" and e.value.exit_code == 2


def test_coreweave_profile() -> None:
    o = parse_options(spec(profile="coreweave"))
    assert o.label_key() == "gpu.nvidia.com/class" and o.label_value("gpu.nvidia.com/class", "H100") == \
        "H100_NVLINK_80GB"
    assert o.use_rdma() and o.rate("H100") > 0
    assert parse_options(spec(profile="coreweave", price_per_gpu_hour=0)).rate("H100") == 0


def pod(phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {}, "status": {"phase": phase, **status}}


def test_pod_states() -> None:
    evicted = pod("Failed", conditions=[{"type": "DisruptionTarget", "status": "True",
                                         "reason": "EvictionByEvictionAPI", "message": "evicting"}])
    assert pod_status(0, evicted, False).state is JobState.PREEMPTED
    oom = pod("Failed", containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    st = pod_status(0, oom, False)
    assert st.state is JobState.FAILED and st.exit_code == 137 and st.detail.startswith("OOMKilled")
    failed = pod("Failed", containerStatuses=[{"state": {"terminated": {
        "exitCode": 1, "reason": "Error", "message": "x\n[gtrain] rank-exit 3 7 100.5\n[gtrain] rank-exit 2 0 101"}}}])
    st = pod_status(1, failed, False)
    assert st.exit_code == 7 and [(r.rank, r.exit_code) for r in st.ranks] == [(3, 7), (2, 0)]
    pull = pod("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no"}}}])
    assert pod_status(0, pull, False).detail.startswith("ImagePullBackOff")
    assert pod_status(0, None, True).detail == "suspended: waiting for admission (Kueue)"


def test_an_exec_streams_protocol_state_error_is_translated_at_the_edge() -> None:
    """wsproto's LocalProtocolError ("cannot be sent in state REMOTE_CLOSING": the API server closed an exec stream
    as its pod ended, seen during `down`) is gtrain's ProviderError, not "a bug in gtrain"."""
    from gtrain.errors import ProviderError
    from gtrain.providers.kubernetes.api import translate

    LocalProtocolError = type("LocalProtocolError", (Exception,), {"__module__": "wsproto.utilities"})
    got = translate(LocalProtocolError("Event CloseConnection cannot be sent in state REMOTE_CLOSING"),
                    "read a file of pod p-0", "default")
    assert isinstance(got, ProviderError) and "exec stream broke" in got.message
