"""The regional GPU quota of a GCE project, read before anything is made (``Provider.quota_check``: a
``resources.any_of`` candidate whose quota cannot hold the request is skipped).

``regions.get`` returns the region's ``quotas``: ``{metric, limit, usage}`` per metric, GPUs as
``NVIDIA_<MODEL>_GPUS`` and, for spot/preemptible VMs, ``PREEMPTIBLE_NVIDIA_<MODEL>_GPUS``
(https://cloud.google.com/compute/docs/reference/rest/v1/regions/get,
https://cloud.google.com/compute/resource-usage#gpu_quota). The API's ``Quota.metric`` enum (compute v1; e.g.
google-cloud-compute 1.57's ``Quota.Metric``) publishes NVIDIA_{T4,L4,P4,P100,V100,A100,A100_80GB}_GPUS, their
PREEMPTIBLE_ twins, PREEMPTIBLE_NVIDIA_H100_GPUS and COMMITTED_NVIDIA_H100_GPUS, but no on-demand H100, H100 Mega,
H200 or B200 metric: those quotas live in the Cloud Quotas API (per GPU family), not in ``regions.get``. So a
metric the region does not list means "cannot tell" (the check passes), never zero quota."""

from __future__ import annotations

from typing import Any

#: accelerator types whose quota metric is not the type's name upper-cased
SPECIAL = {"h100-80gb": "H100", "h100-mega-80gb": "H100_MEGA", "h200-141gb": "H200"}


def gpu_metric(accelerator_type: str, spot: bool) -> str:
    """``nvidia-tesla-t4`` -> ``NVIDIA_T4_GPUS`` (``PREEMPTIBLE_NVIDIA_T4_GPUS`` for spot)."""
    name = accelerator_type.removeprefix("nvidia-").removeprefix("tesla-")
    metric = "NVIDIA_" + SPECIAL.get(name, name.upper().replace("-", "_")) + "_GPUS"
    return ("PREEMPTIBLE_" if spot else "") + metric


def shortfall(region: Any, metric: str, needed: int) -> str | None:
    """Why ``region`` (a compute_v1 Region) cannot hold ``needed`` of ``metric``, or None when it can or when
    the region does not list the metric (cannot tell: the launch itself will say)."""
    quotas = {q.metric: q for q in getattr(region, "quotas", None) or []}
    q = quotas.get(metric)
    if q is None:
        return None
    free = float(q.limit) - float(q.usage)
    if free < needed:
        return (f"quota {metric} in {region.name}: {float(q.limit):g}, {float(q.usage):g} in use, {needed} GPUs "
                "asked")
    return None
