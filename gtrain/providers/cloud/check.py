"""``gtrain check`` of a cloud reached with one API key (Lambda, RunPod, Vast): where the key came from, one
read-only authorised call, the SSH key gtrain gives the nodes -- the same five outcomes for each, written once."""

from __future__ import annotations

from collections.abc import Callable

from gtrain.errors import CredentialsError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note


def key_api_check(name: str, where: str | None, missing: str, fix: str, probe: Callable[[], tuple[str, str]],
                  quota: str) -> ProviderCheck:
    """``where``: where the key was found (None: no key, ``missing`` says what was looked at); ``probe``: the
    call, made with the key, returning (the call and what it saw, the ✔ line). A refused key is ✘ with ``fix``;
    any other error of the API (already gtrain's, translated at the edge) is ✘ with its own hint."""
    key, key_fix = key_note()
    if where is None:
        return ProviderCheck(name, False, missing, fix=fix, ssh_key=key)
    try:
        call, detail = probe()
    except CredentialsError as e:
        return ProviderCheck(name, False, e.message, fix=fix, credentials=where, ssh_key=key)
    except Exception as e:  # noqa: BLE001 - the API's errors are gtrain's already (each api.translate)
        return ProviderCheck(name, False, getattr(e, "message", str(e)), fix=getattr(e, "hint", None),
                             credentials=where, ssh_key=key)
    if key_fix:
        return ProviderCheck(name, False, key, fix=key_fix, credentials=where, call=call, quota=quota, ssh_key=key)
    return ProviderCheck(name, True, detail, credentials=where, call=call, quota=quota, ssh_key=key)
