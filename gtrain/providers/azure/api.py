"""Azure Resource Manager over plain HTTPS (stdlib ``urllib``), and the one place ARM's answers become gtrain's
errors.

Why not the azure-mgmt-* SDKs: measured (Python 3.11, azure-mgmt-compute 39.0, -network 33.1, -resource 26.0),
importing the three clients takes ~1.47 s and they install 46 MB; the handful of ARM calls gtrain makes (resource
group, VNet, NSG, public IP, NIC, VM: PUT/GET/DELETE) are a few lines each as REST. Tokens come from
azure-identity's ``DefaultAzureCredential`` (``az login``, environment, managed identity), imported only when a
token is needed (~0.3 s), or from ``GTRAIN_AZURE_ACCESS_TOKEN`` (a bearer such as ``az account get-access-token``
prints). See docs/providers/azure.md.

Long-running operations follow "Track asynchronous Azure operations"
(https://learn.microsoft.com/azure/azure-resource-manager/management/async-operations): a 201/202 answer is
polled at its ``Azure-AsyncOperation`` URL (``{"status": "InProgress|Succeeded|Failed|Canceled", "error"}``),
else at its ``Location`` URL (202 while running, 200/204 when done), waiting ``Retry-After`` seconds between polls.
A 429 (throttled) or a 5xx is retried after its ``Retry-After``
(https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling).
Errors are ``{"error": {"code", "message"}}`` (ARM's common error body).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from gtrain.errors import (
    CapacityError,
    ConfigError,
    CredentialsError,
    GtrainError,
    ProviderError,
    QuotaError,
    install_hint,
)
from gtrain.providers.cloud.errors import code_of, with_code

ARM = "https://management.azure.com"
SCOPE = "https://management.azure.com/.default"
ENDPOINT_ENV = "GTRAIN_AZURE_ARM_ENDPOINT"  # another cloud (sovereign) or a test endpoint
TOKEN_ENV = "GTRAIN_AZURE_ACCESS_TOKEN"
SUBSCRIPTION_ENV = "AZURE_SUBSCRIPTION_ID"

#: api-versions, as documented in the REST references (Resources, Network, Compute)
V_RESOURCES = "2021-04-01"
V_NETWORK = "2023-09-01"
V_COMPUTE = "2024-07-01"

#: ARM codes that mean "no capacity for this size here now": the next region may have it
CAPACITY_CODES = {"SkuNotAvailable", "AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                  "OverconstrainedZonalAllocationRequest", "AllocationFailedSpot"}
QUOTA_CODES = {"QuotaExceeded", "OperationNotAllowed"}  # OperationNotAllowed: only with quota text (below)
NOT_FOUND_CODES = {"ResourceGroupNotFound", "ResourceNotFound", "NotFound", "ParentResourceNotFound"}

TAG_CLUSTER = "gtrain-cluster"
TAG_CLUSTER_NAME = "gtrain-cluster-name"
TAG_OWNER = "gtrain-owner"
TAG_CREATED = "gtrain-created"
TAG_RANK = "gtrain-rank"


def translate(status: int, body: Any, what: str) -> GtrainError:
    """An ARM error answer as one gtrain error (the ARM code kept on ``.code``)."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    code, message = str(err.get("code") or f"HTTP{status}"), str(err.get("message") or "").strip()
    text = f"{what}: {code}" + (f": {message}" if message else "")
    lower = message.lower()
    out: GtrainError
    if status == 401 or code in ("InvalidAuthenticationToken", "ExpiredAuthenticationToken", "AuthenticationFailed"):
        out = CredentialsError(text, hint="log in with `az login` (or set AZURE_CLIENT_ID / AZURE_TENANT_ID / "
                                          "AZURE_CLIENT_SECRET, or run on a managed identity)")
    elif status == 403 or code == "AuthorizationFailed":
        out = CredentialsError(text, hint="the identity needs the Contributor role on the subscription "
                                          "(it creates and deletes resource groups)")
    elif code in CAPACITY_CODES:
        out = CapacityError(text)
    elif code == "QuotaExceeded" or (code == "OperationNotAllowed" and "quota" in lower):
        out = QuotaError(text, hint="request a quota increase for this VM family in the region "
                                    "(Azure portal: Subscriptions > Usage + quotas), or add resources.regions")
    elif code in ("InvalidParameter", "LocationNotAvailableForResourceType", "NoRegisteredProviderFound",
                  "InvalidTemplate", "BadRequest") and status == 400:
        out = ProviderError(text, hint="check azure.* and resources.* in the spec")
    else:
        out = ProviderError(text)
    return with_code(out, code)


def is_not_found(err: BaseException) -> bool:
    return code_of(err) in NOT_FOUND_CODES or code_of(err) == "HTTP404"


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: Any


class ARM_Client:  # noqa: N801 - ARM is a name
    """One subscription's ARM endpoint: ``request`` (429/5xx retried), ``put``/``delete`` (LRO polled)."""

    def __init__(self, subscription: str, *, endpoint: str | None = None, credential: Any = None,
                 timeout: float = 30.0, poll_cap_s: float = 15.0, max_retries: int = 6) -> None:
        self.subscription = subscription
        self.endpoint = (endpoint or os.environ.get(ENDPOINT_ENV) or ARM).rstrip("/")
        self.credential = credential
        self.timeout = timeout
        self.poll_cap_s = poll_cap_s
        self.max_retries = max_retries
        self._token: tuple[str, float] | None = None
        self._lock = threading.Lock()
        self.throttled = 0  # how many 429s were waited out (tests read it)

    # ---- credentials ----

    def token(self) -> str:
        with self._lock:
            if self._token and self._token[1] - time.time() > 120:
                return self._token[0]
            static = os.environ.get(TOKEN_ENV)
            if static and self.credential is None:
                self._token = (static, time.time() + 3000)
                return static
            cred = self.credential
            if cred is None:
                try:
                    from azure.identity import DefaultAzureCredential  # type: ignore[import-not-found]
                except ImportError:
                    raise CredentialsError("azure: no credentials: azure-identity is not installed and "
                                           f"{TOKEN_ENV} is not set",
                                           hint=f"{install_hint('azure')}, then `az login`") from None
                import logging

                # azure-identity logs each failed credential to stderr (Python's last-resort handler): the one
                # CredentialsError below says it, with the fix
                logging.getLogger("azure.identity").setLevel(logging.ERROR)
                cred = self.credential = DefaultAzureCredential()
            try:
                tok = cred.get_token(SCOPE)
            except Exception as e:  # noqa: BLE001 - azure-identity raises its own ClientAuthenticationError
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise CredentialsError(f"azure: could not get a token for Resource Manager: {first}",
                                       hint="log in with `az login`, set AZURE_CLIENT_ID / AZURE_TENANT_ID / "
                                            "AZURE_CLIENT_SECRET, or run on a managed identity") from None
            self._token = (tok.token, float(tok.expires_on))
            return tok.token

    # ---- requests ----

    def url(self, path: str, api_version: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.endpoint}{path}{sep}api-version={api_version}"

    def sub(self, rest: str = "") -> str:
        return f"/subscriptions/{self.subscription}{rest}"

    def request(self, method: str, url: str, body: Any = None, what: str = "") -> Response:
        data = None if body is None else json.dumps(body).encode()
        what = what or f"{method} {urllib.parse.urlsplit(url).path}"
        for attempt in range(self.max_retries + 1):
            req = urllib.request.Request(url, data=data, method=method, headers={
                "Authorization": f"Bearer {self.token()}", "Content-Type": "application/json",
                "Accept": "application/json", "User-Agent": "gtrain"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310 - ARM endpoint
                    raw = r.read()
                    return Response(r.status, {k.lower(): v for k, v in r.headers.items()}, _json(raw))
            except urllib.error.HTTPError as e:
                raw = e.read()
                headers = {k.lower(): v for k, v in e.headers.items()}
                e.close()
                if (e.code == 429 or e.code >= 500) and attempt < self.max_retries:
                    if e.code == 429:
                        self.throttled += 1
                    time.sleep(_retry_after(headers, 2.0 ** attempt))
                    continue
                raise translate(e.code, _json(raw), what) from None
            except (urllib.error.URLError, OSError) as e:
                if attempt < min(2, self.max_retries):
                    time.sleep(1.0 + attempt)
                    continue
                raise ProviderError(f"{what}: cannot reach Azure Resource Manager at {self.endpoint}: "
                                    f"{getattr(e, 'reason', e)}") from None
        raise ProviderError(f"{what}: still throttled after {self.max_retries} retries")

    def get(self, path: str, api_version: str, what: str = "") -> Any | None:
        """The resource at ``path``, or None when ARM says it does not exist."""
        try:
            return self.request("GET", self.url(path, api_version), what=what).body
        except GtrainError as e:
            if is_not_found(e):
                return None
            raise

    def list(self, path: str, api_version: str, what: str = "") -> list[dict[str, Any]]:
        """Every item of a list answer, following ``nextLink``."""
        out: list[dict[str, Any]] = []
        url: str | None = self.url(path, api_version)
        while url:
            body = self.request("GET", url, what=what).body or {}
            out.extend(body.get("value") or [])
            url = body.get("nextLink")
        return out

    def put(self, path: str, api_version: str, body: dict[str, Any], what: str, timeout: float = 1800) -> Any:
        """PUT, then wait for the long-running operation; returns the resource as it ended."""
        r = self.request("PUT", self.url(path, api_version), body, what)
        self.wait(r, what, timeout)
        return self.get(path, api_version, what) if r.status in (201, 202) else r.body

    def delete(self, path: str, api_version: str, what: str, timeout: float = 1800) -> None:
        """DELETE and wait until it is gone; a resource already gone is no error."""
        try:
            r = self.request("DELETE", self.url(path, api_version), None, what)
        except GtrainError as e:
            if is_not_found(e):
                return
            raise
        self.wait(r, what, timeout)

    def wait(self, r: Response, what: str, timeout: float) -> None:
        """Poll a 201/202 answer's Azure-AsyncOperation (else Location) URL until the operation ends."""
        if r.status not in (201, 202):
            return
        op, loc = r.headers.get("azure-asyncoperation"), r.headers.get("location")
        if not op and not loc:
            return
        deadline = time.monotonic() + timeout
        delay = _retry_after(r.headers, 1.0)
        while True:
            time.sleep(min(delay, self.poll_cap_s))
            if op:
                st = self.request("GET", op, what=f"{what} (operation)").body or {}
                status = str(st.get("status") or "")
                if status == "Succeeded":
                    return
                if status in ("Failed", "Canceled"):
                    raise translate(200, st if st.get("error") else {"error": {"code": status}}, what)
            else:
                assert loc is not None
                got = self.request("GET", loc, what=f"{what} (operation)")
                if got.status in (200, 204):
                    return
            if time.monotonic() > deadline:
                raise ProviderError(f"{what}: not finished after {timeout:.0f} s")
            delay = min(self.poll_cap_s, max(0.2, delay))


def _json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": {"code": "NotJSON", "message": raw[:200].decode(errors="replace")}}


def _retry_after(headers: dict[str, str], default: float) -> float:
    try:
        return max(0.0, float(headers.get("retry-after", default)))
    except ValueError:
        return default


def subscription_of(given: str | None) -> str:
    """The subscription: the spec's, else AZURE_SUBSCRIPTION_ID, else the Azure CLI's default account."""
    if given:
        return given
    env = os.environ.get(SUBSCRIPTION_ENV)
    if env:
        return env
    cfg = os.path.join(os.environ.get("AZURE_CONFIG_DIR") or os.path.expanduser("~/.azure"), "azureProfile.json")
    try:
        with open(cfg, encoding="utf-8-sig") as f:
            subs = json.load(f).get("subscriptions") or []
        for s in subs:
            if s.get("isDefault") and s.get("id"):
                return str(s["id"])
    except (OSError, ValueError, AttributeError):
        pass
    raise ConfigError("azure.subscription: no Azure subscription given",
                      hint=f"set azure.subscription in the spec, or {SUBSCRIPTION_ENV}, or `az account set -s ID`",
                      field="azure.subscription")


def group_name(cluster_id: str) -> str:
    return f"gtrain-{cluster_id}"


def vm_name(cluster_id: str, rank: int) -> str:
    return f"{cluster_id}-{rank}"
