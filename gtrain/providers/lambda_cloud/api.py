"""Lambda Cloud's public REST API (``https://cloud.lambda.ai/api/v1``, OpenAPI at
https://cloud.lambda.ai/api/v1/docs, reference at https://docs.lambda.ai/api/cloud) over stdlib HTTP: no SDK.
The one place its answers become gtrain's errors.

What gtrain uses of it:

- ``GET /instance-types``: ``{"data": {NAME: {"instance_type": {"name", "description", "gpu_description",
  "price_cents_per_hour", "specs": {"vcpus", "memory_gib", "storage_gib", "gpus"}},
  "regions_with_capacity_available": [{"name", "description"}]}}}``;
- ``POST /instance-operations/launch`` ``{"region_name", "instance_type_name", "ssh_key_names": [one],
  "file_system_names", "quantity", "name"}`` -> ``{"data": {"instance_ids": [...]}}``;
- ``POST /instance-operations/terminate`` ``{"instance_ids"}``; ``GET /instances``, ``GET /instances/{id}``
  (``status``: booting, active, unhealthy, terminating, terminated; ``ip``, ``private_ip``, ``name``,
  ``region.name``, ``ssh_key_names``);
- ``GET/POST /ssh-keys``, ``DELETE /ssh-keys/{id}``; ``GET /file-systems``.

Errors are ``{"error": {"code", "message", "suggestion"}}``: ``global/invalid-api-key`` (401),
``global/account-inactive`` (403), ``global/invalid-parameters`` (400), ``global/object-does-not-exist`` (404),
``global/quota-exceeded``, ``instance-operations/launch/insufficient-capacity``, ``ssh-keys/key-in-use``; 429
when over the rate limit (1 request/s, one launch every 10 s). The API key goes in an ``Authorization: Bearer``
header only: it is never logged, stored or put in an error.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gtrain.errors import CapacityError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.providers.cloud.errors import with_code

BASE_URL = "https://cloud.lambda.ai/api/v1"
#: gtrain's own override of the endpoint (a proxy, or the tests' fake)
ENV_URL = "LAMBDA_API_URL"
ENV_KEY = "LAMBDA_API_KEY"
KEY_FILE = "~/.lambda_cloud/lambda_keys"
KEY_HINT = f"set {ENV_KEY}, or write `api_key = <key>` in {KEY_FILE} (make one at https://cloud.lambda.ai/api-keys)"

CAPACITY = "instance-operations/launch/insufficient-capacity"
QUOTA = "global/quota-exceeded"
NOT_FOUND = "global/object-does-not-exist"
KEY_IN_USE = "ssh-keys/key-in-use"


class NoAPIKey(CredentialsError):
    """No API key in the environment or Lambda's key file (a dry run then plans from the bundled snapshot)."""


class Unreachable(ProviderError):
    """The API did not answer (no network)."""


def api_key() -> str:
    """``LAMBDA_API_KEY``, else ``api_key = ...`` in ``~/.lambda_cloud/lambda_keys`` (as Lambda's tools read it)."""
    key = os.environ.get(ENV_KEY, "").strip()
    if key:
        return key
    path = Path(KEY_FILE).expanduser()
    try:
        text = path.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() == "api_key" and v.strip():
            return v.strip()
    raise NoAPIKey("no Lambda Cloud API key found", hint=KEY_HINT)


def translate(status: int, body: Any, what: str) -> GtrainError:
    """An error answer of the API as one gtrain error, carrying Lambda's code (``cloud.errors.code_of``)."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    code = str(err.get("code") or "")
    msg = str(err.get("message") or f"HTTP {status}").strip()
    sugg = str(err.get("suggestion") or "").strip() or None
    text = f"{what}: {msg}" + (f" ({code})" if code else "")
    e: GtrainError
    if status == 401 or code == "global/invalid-api-key":
        e = CredentialsError(f"Lambda Cloud rejected the API key ({what}: {msg})", hint=KEY_HINT)
    elif code == "global/account-inactive" or status == 403:
        e = CredentialsError(f"Lambda Cloud: {msg} ({what})", hint=sugg or "check the account at https://cloud.lambda.ai")
    elif code == CAPACITY:
        e = CapacityError(text, hint=sugg)
    elif code == QUOTA or code.endswith("/quota-exceeded"):
        e = QuotaError(text, hint=sugg or "ask Lambda support for a higher limit")
    elif status == 429:
        e = ProviderError(f"{what}: Lambda Cloud's rate limit (HTTP 429)", hint="try again in a few seconds")
    else:
        e = ProviderError(text, hint=sugg)
    return with_code(e, code)


class LambdaAPI:
    """One client of the API: the key, the base URL, retries on 429 (``Retry-After``)."""

    def __init__(self, key: str | None = None, base_url: str | None = None, timeout: float = 30.0,
                 max_429: int = 8) -> None:
        self._key = key
        self.base_url = (base_url or os.environ.get(ENV_URL) or BASE_URL).rstrip("/")
        self.timeout = timeout
        self.max_429 = max_429

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = api_key()
        return self._key

    def call(self, method: str, path: str, body: Any = None, what: str | None = None) -> Any:
        what = what or f"{method} {path}"
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(self.max_429 + 1):
            req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method, headers={
                "Authorization": f"Bearer {self.key}", "Accept": "application/json",
                **({"Content-Type": "application/json"} if data is not None else {})})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310 - https or a fake
                    raw = r.read()
                return json.loads(raw) if raw else {}
            except urllib.error.HTTPError as e:
                raw = e.read()
                try:
                    parsed = json.loads(raw) if raw else None
                except ValueError:
                    parsed = None
                if e.code == 429 and attempt < self.max_429:
                    try:
                        wait = float(e.headers.get("Retry-After") or 0)
                    except ValueError:
                        wait = 0.0
                    time.sleep(min(15.0, max(wait, 0.5 * 2 ** attempt)))
                    continue
                raise translate(e.code, parsed, what) from None
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                raise Unreachable(f"{what}: cannot reach Lambda Cloud at {self.base_url} ({reason})",
                                  hint="check the network (or LAMBDA_API_URL)") from None
        raise ProviderError(f"{what}: Lambda Cloud's rate limit (HTTP 429)")  # pragma: no cover - loop returns

    # ---- the calls gtrain makes ----

    def instance_types(self) -> dict[str, Any]:
        out: dict[str, Any] = self.call("GET", "/instance-types", what="list instance types").get("data") or {}
        return out

    def instances(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.call("GET", "/instances", what="list instances").get("data") or []
        return out

    def instance(self, iid: str) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = self.call("GET", f"/instances/{iid}", what=f"get instance {iid}")["data"]
        except ProviderError as e:
            if getattr(e, "code", "") == NOT_FOUND:
                return None
            raise
        return out

    def launch(self, region: str, instance_type: str, key_name: str, name: str,
               file_systems: list[str]) -> list[str]:
        body = {"region_name": region, "instance_type_name": instance_type, "ssh_key_names": [key_name],
                "file_system_names": file_systems, "quantity": 1, "name": name}
        res = self.call("POST", "/instance-operations/launch", body, what=f"launch {instance_type} in {region}")
        return list(res.get("data", {}).get("instance_ids") or [])

    def terminate(self, ids: list[str]) -> None:
        self.call("POST", "/instance-operations/terminate", {"instance_ids": ids},
                  what=f"terminate {', '.join(ids)}")

    def ssh_keys(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.call("GET", "/ssh-keys", what="list ssh keys").get("data") or []
        return out

    def add_ssh_key(self, name: str, public_key: str) -> dict[str, Any]:
        out: dict[str, Any] = self.call("POST", "/ssh-keys", {"name": name, "public_key": public_key},
                                        what=f"add ssh key {name}")["data"]
        return out

    def delete_ssh_key(self, key_id: str) -> None:
        self.call("DELETE", f"/ssh-keys/{key_id}", what=f"delete ssh key {key_id}")

    def file_systems(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.call("GET", "/file-systems", what="list file systems").get("data") or []
        return out
