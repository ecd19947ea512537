"""Vast.ai's REST API (``https://console.vast.ai/api/v0``) over stdlib HTTP: no SDK. The one place its answers
become gtrain's errors.

Sources: the API reference https://docs.vast.ai/api-reference (search offers
https://docs.vast.ai/api-reference/search/search-offers, create instance
https://docs.vast.ai/api-reference/instances/create-instance with its OpenAPI
https://docs.vast.ai/api-reference/openapi/yaml/create_instance.yaml, show instances
https://docs.vast.ai/api-reference/instances/show-instances, errors and rate limits
https://docs.vast.ai/api-reference/rate-limits-and-errors, https://vast.ai/developers/api) and the official CLI's
source (https://github.com/vast-ai/vast-python, ``vast.py``: the endpoints, the offer query language, where the key
is kept). What gtrain uses of it:

- ``POST /api/v0/bundles/`` (search offers; the CLI's call): a JSON query ``{field: {op: value}}`` (ops ``eq``,
  ``neq``, ``gt``, ``gte``, ``lt``, ``lte``, ``in``, ``notin``) plus ``order`` (``[[field, "asc"|"desc"]]``),
  ``type`` (``on-demand`` | ``bid`` | ``reserved``), ``limit``, ``allocated_storage`` (GB: the storage priced into
  ``dph_total``) -> ``{"offers": [Offer]}``; ``Offer``: ``id`` (the ask to rent), ``machine_id``, ``gpu_name``,
  ``num_gpus``, ``gpu_ram`` (MB), ``dph_base`` (the host's compute $/h), ``dph_total`` ($/h with the storage of
  ``allocated_storage``: what renting it bills), ``storage_cost`` ($/GB-month), ``inet_up_cost``/``inet_down_cost``
  ($/GB, billed by use), ``min_bid`` (the least an interruptible bid may be, $/h), ``reliability2``,
  ``inet_down``/``inet_up`` (Mb/s), ``geolocation`` (``"City, CC"``), ``verified``, ``rentable``;
- ``PUT /api/v0/asks/{id}/`` (create instance from offer ``id``): ``image``, ``label``, ``disk`` (GB), ``runtype``
  (``ssh`` | ``jupyter`` | ``args`` | ``ssh_proxy`` | ``ssh_direct`` | ``jupyter_proxy`` | ``jupyter_direct``),
  ``env``, ``onstart``, ``price`` (the bid, $/h: an interruptible instance), ``target_state`` -> ``{"success":
  true, "new_contract": <instance id>}``;
- ``POST /api/v0/instances/{id}/ssh/`` ``{"ssh_key"}``: a public key into the instance's authorized_keys (Docker
  instances take keys after creation, so gtrain registers no account key);
- ``GET /api/v0/instances/`` -> ``{"instances": [Instance]}``; ``Instance``: ``id``, ``label``,
  ``actual_status`` (null, loading, running, stopped, frozen, exited, rebooting, unknown, offline),
  ``intended_status`` (running, stopped, frozen), ``is_bid``, ``dph_total`` (its $/h), ``public_ipaddr``,
  ``ports`` (``{"22/tcp": [{"HostIp", "HostPort"}]}``: the direct SSH port), ``ssh_host``/``ssh_port`` (Vast's
  proxy), ``geolocation``, ``machine_id``, ``extra_env`` (``[[name, value]]``);
- ``DELETE /api/v0/instances/{id}/`` -> ``{"success": true}`` (destroy: irreversible).

Errors are JSON ``{"success": false, "error": "invalid_args", "msg": "..."}`` (some endpoints give only ``msg``
or ``message``): 400 (invalid_args), 401 (a bad key), 403, 404 (no such ask/instance), 410/400 ``no_such_ask``
(the offer was taken), 402 (insufficient credit), 429 ("API requests too frequent", often plain text and WITHOUT
``Retry-After``: retried with an exponential backoff), 5xx (retried). The API key goes in ``Authorization:
Bearer`` only: the API also takes ``?api_key=`` (the CLI appends it to every URL), which gtrain never uses, so the
key is never in a URL, a log, the state or an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gtrain.errors import CapacityError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.providers.cloud import http
from gtrain.providers.cloud.errors import with_code
from gtrain.providers.cloud.http import JSONClient

BASE_URL = "https://console.vast.ai/api/v0"
#: gtrain's own override of the endpoint (a proxy, or the tests' fake)
ENV_URL = "GTRAIN_VAST_API_URL"
ENV_KEY = "VAST_API_KEY"
#: where ``vastai set api-key`` keeps the key, and its legacy place (vast.py: APIKEY_FILE, APIKEY_FILE_HOME)
KEY_FILES = ("~/.config/vastai/vast_api_key", "~/.vast_api_key")
KEY_HINT = (f"set {ENV_KEY}, or run `vastai set api-key <key>` (writes {KEY_FILES[0]}); make a key at "
            "https://cloud.vast.ai/manage-keys/")

Unreachable = http.Unreachable


class NoAPIKey(CredentialsError):
    """No API key in the environment or the vastai CLI's key file."""


def key_source() -> tuple[str, str] | None:
    """(key, where from): ``VAST_API_KEY``, else the vastai CLI's key file; None when neither."""
    key = os.environ.get(ENV_KEY, "").strip()
    if key:
        return key, ENV_KEY
    for name in KEY_FILES:
        try:
            text = Path(name).expanduser().read_text().strip()
        except OSError:
            continue
        if text and "\n" not in text:
            return text, name
    return None


def api_key() -> str:
    got = key_source()
    if got is None:
        raise NoAPIKey("no Vast.ai API key found", hint=KEY_HINT)
    return got[0]


def message(body: Any, status: int) -> tuple[str, str]:
    """(error code, message) of an error answer: JSON ``{error, msg|message}`` or plain text."""
    if isinstance(body, dict):
        code = str(body.get("error") or "")
        text = str(body.get("msg") or body.get("message") or body.get("detail") or code or f"HTTP {status}")
        return code, text.strip()[:300]
    return "", f"HTTP {status}"


def translate(status: int, body: Any, what: str) -> GtrainError:
    """An error answer as one gtrain error, carrying the HTTP status as its code."""
    code, msg = message(body, status)
    text = f"{what}: {msg}" + (f" ({code})" if code and code not in msg else "") + f" [HTTP {status}]"
    e: GtrainError
    if status == 401:
        e = CredentialsError(f"Vast.ai rejected the API key ({what}: {msg})", hint=KEY_HINT)
    elif status == 403:
        e = CredentialsError(f"Vast.ai: the API key may not do this ({what}: {msg})",
                             hint="give the key the instance permissions at https://cloud.vast.ai/manage-keys/")
    elif status == 402 or code in ("insufficient_credit", "insufficient_funds"):
        e = QuotaError(text, hint="add credit at https://cloud.vast.ai/billing/")
    elif what.startswith("rent offer") and (status in (404, 410) or code in ("no_such_ask", "ask_unavailable")):
        e = CapacityError(text, hint="the offer was taken; gtrain tries the next one")
    elif status == 429:
        e = ProviderError(f"{what}: Vast.ai's rate limit (HTTP 429: {msg})", hint="try again in a minute")
    else:
        e = ProviderError(text)
    return with_code(e, str(status))


def is_gone(e: BaseException) -> bool:
    return getattr(e, "code", None) == "404"


class VastAPI(JSONClient):
    """One client of the API: the key in a header, the base URL, retries on 429 (Vast sends no ``Retry-After``:
    an exponential backoff) and 5xx (gtrain/providers/cloud/http.py)."""

    service = "Vast.ai"
    env_url = ENV_URL
    retry_5xx = 3
    backoff_429_s = 0.5

    def __init__(self, key: str | None = None, base_url: str | None = None, timeout: float = 30.0,
                 max_429: int = 6) -> None:
        super().__init__(base_url or os.environ.get(ENV_URL) or BASE_URL, timeout=timeout, max_429=max_429)
        self._key = key

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = api_key()
        return self._key

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def translate(self, status: int, body: Any, what: str) -> GtrainError:
        return translate(status, body, what)

    # ---- the calls gtrain makes ----

    def search_offers(self, query: dict[str, Any]) -> list[dict[str, Any]]:
        got = self.call("POST", "/bundles/", query, what="search offers")
        offers = got.get("offers") if isinstance(got, dict) else None
        return [o for o in offers or [] if isinstance(o, dict)]

    def create_instance(self, ask_id: int, body: dict[str, Any]) -> int:
        """Rent offer ``ask_id``; the new instance's id (``new_contract``)."""
        got = self.call("PUT", f"/asks/{ask_id}/", body, what=f"rent offer {ask_id} ({body.get('label')})")
        if not isinstance(got, dict) or not got.get("success") or not isinstance(got.get("new_contract"), int):
            raise ProviderError(f"rent offer {ask_id}: Vast.ai answered without a new instance id "
                                f"({message(got, 200)[1]})")
        return int(got["new_contract"])

    def attach_ssh_key(self, instance_id: int, public_key: str) -> None:
        self.call("POST", f"/instances/{instance_id}/ssh/", {"ssh_key": public_key},
                  what=f"add the cluster's SSH key to instance {instance_id}")

    def instances(self) -> list[dict[str, Any]]:
        got = self.call("GET", "/instances/", what="list instances")
        rows = got.get("instances") if isinstance(got, dict) else None
        return [i for i in rows or [] if isinstance(i, dict)]

    def destroy(self, instance_id: int | str) -> None:
        try:
            self.call("DELETE", f"/instances/{instance_id}/", {}, what=f"destroy instance {instance_id}")
        except ProviderError as e:
            if not is_gone(e):
                raise
