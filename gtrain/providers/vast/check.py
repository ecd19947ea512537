"""``gtrain check vast``: the API key (``VAST_API_KEY`` or the vastai CLI's key file), ``GET /api/v0/instances/``
with it (read-only, authorised: a bad key answers 401; one call, no retry on a rate limit), how many instances the
account has, and the SSH key gtrain gives the instances. Vast's API tells no GPU quota (a marketplace: what is
offered now, paid from the account's credit)."""

from __future__ import annotations

from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.check import key_api_check
from gtrain.providers.vast.api import ENV_KEY, KEY_FILES, VastAPI, key_source

FIX = f"export {ENV_KEY}=<key>  (or `vastai set api-key <key>`; make one at https://cloud.vast.ai/manage-keys/)"
QUOTA = "not told by Vast.ai's API (a marketplace: the offers listed now, paid from the account's credit)"


def check(timeout: float) -> ProviderCheck:
    got = key_source()

    def probe() -> tuple[str, str]:
        assert got is not None
        rows = VastAPI(key=got[0], timeout=timeout, max_429=0).instances()
        return f"GET /api/v0/instances/: {len(rows)} instance(s)", f"{len(rows)} instance(s) listed"

    return key_api_check("vast", got[1] if got else None, f"no API key ({ENV_KEY} unset, no {' or '.join(KEY_FILES)})",
                         FIX, probe, QUOTA)
