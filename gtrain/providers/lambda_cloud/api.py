"""Lambda Cloud's public REST API (``https://cloud.lambda.ai/api/v1``, OpenAPI at
https://cloud.lambda.ai/api/v1/docs, reference at https://docs.lambda.ai/api/cloud) over stdlib HTTP: no SDK.
The one place its answers become gtrain's errors.

What gtrain uses of it (API version 1.10.0):

- ``GET /instance-types``: ``{"data": {NAME: {"instance_type": {"name", "description", "gpu_description",
  "price_cents_per_hour", "specs": {"vcpus", "memory_gib", "storage_gib", "gpus"}},
  "regions_with_capacity_available": [{"name", "description"}]}}}``;
- ``POST /instance-operations/launch`` ``{"region_name", "instance_type_name", "ssh_key_names": [one],
  "file_system_names", "name"}`` -> ``{"data": {"instance_ids": [...]}}`` (one instance: 1.10.0 lists no
  ``quantity``);
- ``POST /instance-operations/terminate`` ``{"instance_ids"}``; ``GET /instances``, ``GET /instances/{id}``
  (``status``: booting, active, unhealthy, terminating, terminated, preempted; ``ip``, ``private_ip``, ``name``,
  ``region.name``, ``ssh_key_names``);
- ``GET/POST /ssh-keys``, ``DELETE /ssh-keys/{id}``; ``GET /file-systems``.

Errors are ``{"error": {"code", "message", "suggestion"}}``: ``global/invalid-api-key`` (401),
``global/account-inactive`` (403), ``global/invalid-parameters`` (400), 404 as ``global/object-does-not-exist``
(an instance, a launch's key or file system) or ``global/not-found`` (an SSH key to delete, other resources):
both mean gone (:data:`GONE_CODES`); ``global/quota-exceeded``, ``instance-operations/launch/insufficient-capacity``,
``ssh-keys/key-in-use``. Rate limits (the reference's introduction): about one request per second, and one
``/instance-operations/launch`` per 12 s (five a minute); 429 above them. :class:`Pacer` spaces the calls of the
whole process within them, and a 429 is retried after ``Retry-After`` (else a backoff). The API key goes in an
``Authorization: Bearer`` header only: it is never logged, stored or put in an error.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from gtrain.errors import CapacityError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.providers.cloud import http
from gtrain.providers.cloud.errors import with_code
from gtrain.providers.cloud.http import JSONClient

BASE_URL = "https://cloud.lambda.ai/api/v1"
#: gtrain's own override of the endpoint (a proxy, or the tests' fake)
ENV_URL = "LAMBDA_API_URL"
ENV_KEY = "LAMBDA_API_KEY"
KEY_FILE = "~/.lambda_cloud/lambda_keys"
KEY_HINT = f"set {ENV_KEY}, or write `api_key = <key>` in {KEY_FILE} (make one at https://cloud.lambda.ai/api-keys)"

CAPACITY = "instance-operations/launch/insufficient-capacity"
QUOTA = "global/quota-exceeded"
NOT_FOUND = "global/object-does-not-exist"
#: the other 404 code: DELETE /ssh-keys/{id} of a key already gone, and other missing resources
NOT_FOUND_GENERIC = "global/not-found"
#: the codes that mean "no such object": gone, as far as a teardown cares
GONE_CODES = frozenset({NOT_FOUND, NOT_FOUND_GENERIC})
KEY_IN_USE = "ssh-keys/key-in-use"
#: gtrain's pacing of its own calls, "<seconds between requests>,<seconds between launches>" (default: Lambda's
#: published limits plus a margin; a proxy or the tests' fake may set it shorter)
ENV_PACE = "LAMBDA_API_PACE"
REQUEST_INTERVAL_S = 1.0
LAUNCH_INTERVAL_S = 12.0


class NoAPIKey(CredentialsError):
    """No API key in the environment or Lambda's key file (a dry run then plans from the bundled snapshot)."""


Unreachable = http.Unreachable


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


def is_gone(e: BaseException) -> bool:
    """Whether ``e`` is Lambda's 404 for an object that does not exist (either of its two codes)."""
    return getattr(e, "code", None) in GONE_CODES


class Pacer:
    """Spaces the requests to one API endpoint, process-wide (the limits are the account's): at least
    ``request_s`` between any two requests and ``launch_s`` between two launches, each with a small margin."""

    _lock = threading.Lock()
    _last: ClassVar[dict[str, float]] = {}

    def __init__(self, where: str, request_s: float, launch_s: float) -> None:
        self.where, self.request_s, self.launch_s = where, request_s, launch_s

    @staticmethod
    def from_env(where: str) -> Pacer:
        raw = os.environ.get(ENV_PACE, "").strip()
        req, launch = REQUEST_INTERVAL_S, LAUNCH_INTERVAL_S
        if raw:
            try:
                a, _, b = raw.partition(",")
                req, launch = max(0.0, float(a)), max(0.0, float(b or a))
            except ValueError:
                raise GtrainError(f"{ENV_PACE}={raw!r}: expected '<request seconds>,<launch seconds>'") from None
        return Pacer(where, req, launch)

    @staticmethod
    def _gap(s: float) -> float:
        return s * 1.05 + 0.02 if s > 0 else 0.0

    def wait(self, launch: bool) -> None:
        """Block until the next request (a launch when ``launch``) may go, and take its slot."""
        with self._lock:
            now = time.monotonic()
            at = max(now, self._last.get(self.where, 0.0) + self._gap(self.request_s))
            if launch:
                at = max(at, self._last.get(self.where + " launch", 0.0) + self._gap(self.launch_s))
                self._last[self.where + " launch"] = at
            self._last[self.where] = at
        if at > now:
            time.sleep(at - now)


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


class LambdaAPI(JSONClient):
    """One client of the API: the key, the base URL, the pacer, retries on 429 (``Retry-After``)
    (gtrain/providers/cloud/http.py). A 5xx is not retried: a launch may have been made."""

    service = "Lambda Cloud"
    env_url = "LAMBDA_API_URL"
    retry_5xx = 0
    max_wait_429_s = 15.0
    backoff_429_s = 0.5

    def __init__(self, key: str | None = None, base_url: str | None = None, timeout: float = 30.0,
                 max_429: int = 8) -> None:
        base = (base_url or os.environ.get(ENV_URL) or BASE_URL).rstrip("/")
        self.pacer = Pacer.from_env(base)
        super().__init__(base, timeout=timeout, max_429=max_429,
                         pace=lambda _method, path: self.pacer.wait(launch=path == "/instance-operations/launch"))
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
            if is_gone(e):
                return None
            raise
        return out

    def launch(self, region: str, instance_type: str, key_name: str, name: str,
               file_systems: list[str]) -> list[str]:
        body = {"region_name": region, "instance_type_name": instance_type, "ssh_key_names": [key_name],
                "file_system_names": file_systems, "name": name}
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

    # ---- file systems (the spec's volumes: gtrain/providers/lambda_cloud/volumes.py) ----
    # POST /filesystems {"name", "region"} -> {"data": Filesystem}; DELETE /filesystems/{id} -> {"data":
    # {"deleted_ids": [...]}}, 400 filesystems/filesystem-in-use while an instance mounts it (API 1.10.0).

    def create_file_system(self, name: str, region: str) -> dict[str, Any]:
        out: dict[str, Any] = self.call("POST", "/filesystems", {"name": name, "region": region},
                                        what=f"create file system {name} in {region}")["data"]
        return out

    def delete_file_system(self, fs_id: str) -> list[str]:
        res = self.call("DELETE", f"/filesystems/{fs_id}", what=f"delete file system {fs_id}")
        return list((res.get("data") or {}).get("deleted_ids") or [])
