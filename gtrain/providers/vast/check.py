"""``gtrain check vast``: the API key (``VAST_API_KEY`` or the vastai CLI's key file), ``GET /api/v0/instances/``
with it (read-only, authorised: a bad key answers 401; one call, no retry on a rate limit), how many instances the
account has, and the SSH key gtrain gives the instances. Vast's API tells no GPU quota (a marketplace: what is
offered now, paid from the account's credit)."""

from __future__ import annotations

from gtrain.errors import CredentialsError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note
from gtrain.providers.vast.api import ENV_KEY, KEY_FILES, VastAPI, key_source

FIX = f"export {ENV_KEY}=<key>  (or `vastai set api-key <key>`; make one at https://cloud.vast.ai/manage-keys/)"
QUOTA = "not told by Vast.ai's API (a marketplace: the offers listed now, paid from the account's credit)"


def check(timeout: float) -> ProviderCheck:
    key, key_fix = key_note()
    got = key_source()
    if got is None:
        return ProviderCheck("vast", False, f"no API key ({ENV_KEY} unset, no {' or '.join(KEY_FILES)})", fix=FIX,
                             ssh_key=key)
    secret, where = got
    api = VastAPI(key=secret, timeout=timeout, max_429=0)
    try:
        rows = api.instances()
    except CredentialsError as e:
        return ProviderCheck("vast", False, e.message, fix=FIX, credentials=where, ssh_key=key)
    except Exception as e:  # noqa: BLE001 - the API's errors are gtrain's already (api.translate)
        return ProviderCheck("vast", False, getattr(e, "message", str(e)), fix=getattr(e, "hint", None),
                             credentials=where, ssh_key=key)
    call = f"GET /api/v0/instances/: {len(rows)} instance(s)"
    if key_fix:
        return ProviderCheck("vast", False, key, fix=key_fix, credentials=where, call=call, quota=QUOTA, ssh_key=key)
    return ProviderCheck("vast", True, f"{len(rows)} instance(s) listed", credentials=where, call=call, quota=QUOTA,
                         ssh_key=key)
