"""``gtrain check runpod``: the API key (``RUNPOD_API_KEY`` or runpodctl's ``~/.runpod/config.toml``), ``GET
/v2/catalog/gpus`` with it (read-only; one call, no retry on a rate limit), how many GPU types are offered, and the
SSH key gtrain gives the pods. RunPod's API tells no GPU quota (an account has a spend limit, $80/h by default)."""

from __future__ import annotations

from gtrain.errors import CredentialsError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note
from gtrain.providers.runpod.api import ENV_KEY, KEY_FILE, RunPodAPI, key_source

FIX = f"export {ENV_KEY}=<key>  (or `runpodctl config --apiKey <key>`; make one at " \
      "https://www.console.runpod.io/user/settings)"
QUOTA = "not told by RunPod's API (the account's spend limit: $80/h unless raised)"


def check(timeout: float) -> ProviderCheck:
    key, key_fix = key_note()
    got = key_source()
    if got is None:
        return ProviderCheck("runpod", False, f"no API key ({ENV_KEY} unset, no apikey in {KEY_FILE})", fix=FIX,
                             ssh_key=key)
    secret, where = got
    api = RunPodAPI(key=secret, timeout=timeout, max_429=0)
    try:
        gpus = api.gpu_types()
    except CredentialsError as e:
        return ProviderCheck("runpod", False, e.message, fix=FIX, credentials=where, ssh_key=key)
    except Exception as e:  # noqa: BLE001 - the API's errors are gtrain's already (api.translate)
        return ProviderCheck("runpod", False, getattr(e, "message", str(e)), fix=getattr(e, "hint", None),
                             credentials=where, ssh_key=key)
    call = f"GET /v2/catalog/gpus: {len(gpus)} GPU types"
    if key_fix:
        return ProviderCheck("runpod", False, key, fix=key_fix, credentials=where, call=call, quota=QUOTA, ssh_key=key)
    return ProviderCheck("runpod", True, f"{len(gpus)} GPU types listed", credentials=where, call=call, quota=QUOTA,
                         ssh_key=key)
