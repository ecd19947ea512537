"""``gtrain check ray``: the Jobs API address (``RAY_ADDRESS``; a spec's ``ray.address`` is per cluster),
``GET /api/version`` there and the GPUs its alive nodes report (the state API), read-only. The Ray Jobs API has
no credentials; the nodes get no SSH key (gtrain runs through Ray's jobs)."""

from __future__ import annotations

import os

from gtrain.errors import GtrainError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.ray.api import RayAPI, check_version

FIX = "export RAY_ADDRESS=http://HEAD:8265  (the dashboard of a running `ray start --head`)"
NO_KEY = "none: gtrain runs through Ray's Jobs API"


def check(timeout: float) -> ProviderCheck:
    raw = os.environ.get("RAY_ADDRESS", "").strip()
    if not raw:
        return ProviderCheck("ray", False, "no Ray address (RAY_ADDRESS unset; a spec may give ray.address)",
                             fix=FIX, ssh_key=NO_KEY)
    from gtrain.providers.ray.options import resolve_address

    try:
        address = resolve_address(None)
        api = RayAPI(address, timeout=timeout)
        version = api._request("GET", "/api/version", doing="ask the Ray version")  # once: no agent wait
        if not isinstance(version, dict) or "ray_version" not in version:
            return ProviderCheck("ray", False, f"{address} answers, but not as a Ray dashboard", fix=FIX,
                                 credentials=f"RAY_ADDRESS {address}", ssh_key=NO_KEY)
        check_version(str(version["ray_version"]), address)
    except GtrainError as e:
        return ProviderCheck("ray", False, e.message.splitlines()[0], fix=e.hint or FIX,
                             credentials=f"RAY_ADDRESS {raw}", ssh_key=NO_KEY)
    call = f"GET /api/version: Ray {version['ray_version']}"
    try:
        nodes = [n for n in api.nodes() if n.get("state") == "ALIVE"]
        gpus = sum(float((n.get("resources_total") or {}).get("GPU") or 0) for n in nodes)
        quota = f"{gpus:g} GPUs on {len(nodes)} alive nodes"
    except GtrainError as e:
        quota = f"cannot tell ({e.message.splitlines()[0][:80]})"
    return ProviderCheck("ray", True, f"Ray {version['ray_version']} at {address}",
                         credentials=f"RAY_ADDRESS {address} (the Jobs API has no credentials)", call=call,
                         quota=quota, ssh_key=NO_KEY)
