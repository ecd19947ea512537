"""``gtrain check runpod``: the API key (``RUNPOD_API_KEY`` or runpodctl's ``~/.runpod/config.toml``), ``GET
/v2/catalog/gpus`` with it (read-only; one call, no retry on a rate limit), how many GPU types are offered, and the
SSH key gtrain gives the pods. RunPod's API tells no GPU quota (an account has a spend limit, $80/h by default)."""

from __future__ import annotations

from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.check import key_api_check
from gtrain.providers.runpod.api import ENV_KEY, KEY_FILE, RunPodAPI, key_source

FIX = f"export {ENV_KEY}=<key>  (or `runpodctl config --apiKey <key>`; make one at " \
      "https://www.console.runpod.io/user/settings)"
QUOTA = "not told by RunPod's API (the account's spend limit: $80/h unless raised)"


def check(timeout: float) -> ProviderCheck:
    got = key_source()

    def probe() -> tuple[str, str]:
        assert got is not None
        gpus = RunPodAPI(key=got[0], timeout=timeout, max_429=0).gpu_types()
        return f"GET /v2/catalog/gpus: {len(gpus)} GPU types", f"{len(gpus)} GPU types listed"

    return key_api_check("runpod", got[1] if got else None, f"no API key ({ENV_KEY} unset, no apikey in {KEY_FILE})",
                         FIX, probe, QUOTA)
