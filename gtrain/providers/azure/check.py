"""``gtrain check azure``: where a Resource Manager token comes from (``GTRAIN_AZURE_ACCESS_TOKEN``, a service
principal's variables, ``az login``, a managed identity), the subscription, a read of its resource groups (one
page, read-only), the GPU families' vCPU quotas in the default region (Compute usages, where ARM answers), and
the SSH key gtrain gives the nodes."""

from __future__ import annotations

import os
from pathlib import Path

from gtrain.errors import ConfigError, CredentialsError, GtrainError
from gtrain.providers.azure.api import (
    SUBSCRIPTION_ENV,
    TOKEN_ENV,
    V_COMPUTE,
    V_RESOURCES,
    ARM_Client,
    subscription_of,
)
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note

FIX_LOGIN = "az login"
DEFAULT_REGION = "eastus"


def _token_source() -> str | None:
    """Where a token would come from, without asking the network; None: nowhere."""
    if os.environ.get(TOKEN_ENV):
        return TOKEN_ENV
    if all(os.environ.get(k) for k in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID")) and (
            os.environ.get("AZURE_CLIENT_SECRET") or os.environ.get("AZURE_CLIENT_CERTIFICATE_PATH")
            or os.environ.get("AZURE_FEDERATED_TOKEN_FILE")):
        return "a service principal (AZURE_CLIENT_ID, AZURE_TENANT_ID, ...)"
    cfg = Path(os.environ.get("AZURE_CONFIG_DIR") or Path.home() / ".azure")
    if (cfg / "msal_token_cache.json").exists() or (cfg / "msal_token_cache.bin").exists():
        return f"az login ({cfg})"
    if os.environ.get("IDENTITY_ENDPOINT") or os.environ.get("MSI_ENDPOINT"):
        return "a managed identity"
    return None


def check(timeout: float) -> ProviderCheck:
    key, key_fix = key_note("rsa")  # Azure takes RSA keys in every region (docs/providers/azure.md)
    where = _token_source()
    if where is None:
        return ProviderCheck("azure", False, f"no Azure login ({TOKEN_ENV}, a service principal's variables, "
                             "az login, or a managed identity)", fix=FIX_LOGIN, ssh_key=key)
    try:
        sub = subscription_of(None)
    except ConfigError:
        return ProviderCheck("azure", False, "logged in, but no subscription chosen",
                             fix=f"az account set -s SUBSCRIPTION  (or export {SUBSCRIPTION_ENV}=...)",
                             credentials=where, ssh_key=key)
    arm = ARM_Client(sub, timeout=timeout, max_retries=0)
    try:
        groups = arm.request("GET", arm.url(arm.sub("/resourcegroups?$top=20"), V_RESOURCES),
                             what="list resource groups").body or {}
    except GtrainError as e:
        revoked = isinstance(e, CredentialsError)
        return ProviderCheck("azure", False, ("Azure refused the credentials: " if revoked else "") + e.message,
                             fix=FIX_LOGIN if revoked else e.hint, credentials=where, ssh_key=key)
    call = f"list resource groups of {sub}: {len(groups.get('value') or [])} (first page)"
    region = os.environ.get("AZURE_DEFAULTS_LOCATION") or DEFAULT_REGION
    quota = _gpu_quota(arm, region)
    if key_fix:
        return ProviderCheck("azure", False, key, fix=key_fix, credentials=where, call=call, quota=quota,
                             ssh_key=key)
    return ProviderCheck("azure", True, f"subscription {sub}, region {region}", credentials=where, call=call,
                         quota=quota, ssh_key=key)


def _gpu_quota(arm: ARM_Client, region: str) -> str:
    """The N-series (GPU) families' vCPU limits in ``region``, or why they cannot be told."""
    try:
        got = arm.request("GET", arm.url(arm.sub(f"/providers/Microsoft.Compute/locations/{region}/usages"),
                                         V_COMPUTE), what="compute usages").body or {}
    except GtrainError as e:
        return f"cannot tell in {region} ({getattr(e, 'code', None) or e.message.splitlines()[0][:80]})"
    gpus = [f"{u['name'].get('value')} {u.get('limit')} ({u.get('currentValue')} used)"
            for u in got.get("value") or [] if isinstance(u, dict) and isinstance(u.get("name"), dict)
            and str(u["name"].get("value") or "").lower().startswith("standardn") and u.get("limit")]
    return f"GPU family vCPUs in {region}: " + (", ".join(gpus) if gpus else "none granted")
