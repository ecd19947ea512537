"""``gtrain check lambda``: the API key (``LAMBDA_API_KEY`` or Lambda's key file), ``GET /instance-types`` with
it (read-only; one call, no retry on a rate limit), how many GPU types have capacity now, and the SSH key gtrain
gives the nodes. Lambda's API tells no quota."""

from __future__ import annotations

import os

from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.check import key_api_check
from gtrain.providers.lambda_cloud.api import ENV_KEY, KEY_FILE, LambdaAPI, NoAPIKey, api_key

FIX = f"export {ENV_KEY}=<key>  (make one at https://cloud.lambda.ai/api-keys)"


def check(timeout: float) -> ProviderCheck:
    try:
        secret: str | None = api_key()
    except NoAPIKey:
        secret = None
    where = None if secret is None else ENV_KEY if os.environ.get(ENV_KEY, "").strip() else KEY_FILE

    def probe() -> tuple[str, str]:
        types = LambdaAPI(key=secret, timeout=timeout, max_429=0).instance_types()
        free = sum(1 for t in types.values() if isinstance(t, dict) and t.get("regions_with_capacity_available"))
        return (f"GET /instance-types: {len(types)} types, {free} with capacity now",
                f"{free} of {len(types)} instance types have capacity now")

    return key_api_check("lambda", where, f"no API key ({ENV_KEY} unset, no {KEY_FILE})", FIX, probe,
                         "not told by Lambda's API")
