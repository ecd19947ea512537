"""``gtrain check lambda``: the API key (``LAMBDA_API_KEY`` or Lambda's key file), ``GET /instance-types`` with
it (read-only; one call, no retry on a rate limit), how many GPU types have capacity now, and the SSH key gtrain
gives the nodes. Lambda's API tells no quota."""

from __future__ import annotations

import os

from gtrain.errors import CredentialsError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note
from gtrain.providers.lambda_cloud.api import ENV_KEY, KEY_FILE, LambdaAPI, NoAPIKey, api_key

FIX = f"export {ENV_KEY}=<key>  (make one at https://cloud.lambda.ai/api-keys)"


def check(timeout: float) -> ProviderCheck:
    key, key_fix = key_note()
    try:
        secret = api_key()
    except NoAPIKey:
        return ProviderCheck("lambda", False, f"no API key ({ENV_KEY} unset, no {KEY_FILE})", fix=FIX, ssh_key=key)
    where = ENV_KEY if os.environ.get(ENV_KEY, "").strip() else KEY_FILE
    api = LambdaAPI(key=secret, timeout=timeout, max_429=0)
    try:
        types = api.instance_types()
    except CredentialsError as e:
        return ProviderCheck("lambda", False, e.message, fix=FIX, credentials=where, ssh_key=key)
    except Exception as e:  # noqa: BLE001 - the API's errors are gtrain's already (api.translate)
        return ProviderCheck("lambda", False, getattr(e, "message", str(e)), fix=getattr(e, "hint", None),
                             credentials=where, ssh_key=key)
    free = sum(1 for t in types.values() if isinstance(t, dict) and t.get("regions_with_capacity_available"))
    call = f"GET /instance-types: {len(types)} types, {free} with capacity now"
    quota = "not told by Lambda's API"
    if key_fix:
        return ProviderCheck("lambda", False, key, fix=key_fix, credentials=where, call=call, quota=quota,
                             ssh_key=key)
    return ProviderCheck("lambda", True, f"{free} of {len(types)} instance types have capacity now",
                         credentials=where, call=call, quota=quota, ssh_key=key)
