"""``gtrain check gcp``: application default credentials (and where from), the project, ``regions.get`` of the
default region (read-only; it also lists the region's GPU quotas), and the SSH key gtrain gives the nodes.
The metadata server is asked only on a Google machine, so a laptop without credentials answers at once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gtrain.errors import CredentialsError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note

FIX_LOGIN = "gcloud auth application-default login"
FIX_PROJECT = "gcloud config set project PROJECT  (or export GOOGLE_CLOUD_PROJECT=PROJECT)"
DEFAULT_REGION = "us-central1"


def _adc_source() -> str | None:
    """Where application default credentials would come from, without asking the network; None: nowhere."""
    from gtrain.providers.gcp.api import compute_endpoint

    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return f"GOOGLE_APPLICATION_CREDENTIALS ({os.environ['GOOGLE_APPLICATION_CREDENTIALS']})"
    cfg = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    if (cfg / "application_default_credentials.json").exists():
        return str(cfg / "application_default_credentials.json")
    try:
        if "Google" in Path("/sys/class/dmi/id/product_name").read_text():
            return "the metadata server (this is a Google machine)"
    except OSError:
        pass
    if compute_endpoint():
        return "none: anonymous, at the endpoint CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE names"
    return None


def check(timeout: float) -> ProviderCheck:
    key, key_fix = key_note()
    where = _adc_source()
    if where is None:
        return ProviderCheck("gcp", False, "no application default credentials (GOOGLE_APPLICATION_CREDENTIALS, "
                             "gcloud's ADC file, or a Google machine)", fix=FIX_LOGIN, ssh_key=key)
    try:
        from google.cloud import compute_v1  # noqa: F401 - the SDK, or its extra's fix
    except ModuleNotFoundError:
        return ProviderCheck("gcp", False, "google-cloud-compute is not installed", fix="pip install 'gtrain[gcp]'",
                             credentials=where, ssh_key=key)
    from gtrain.providers.gcp.api import default_project, make_clients, translate

    creds: Any = None
    project = None
    if not where.startswith("none"):
        import google.auth

        try:
            creds, project = google.auth.default()  # type: ignore[no-untyped-call]
        except Exception as e:  # noqa: BLE001 - translated at this edge
            err = translate(e, "loading the credentials")
            return ProviderCheck("gcp", False, err.message, fix=FIX_LOGIN, credentials=where, ssh_key=key)
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT") or project \
        or default_project()
    if not project:
        return ProviderCheck("gcp", False, "credentials found, but no project", fix=FIX_PROJECT, credentials=where,
                             ssh_key=key)
    region = os.environ.get("CLOUDSDK_COMPUTE_REGION") or os.environ.get("GOOGLE_CLOUD_REGION") or DEFAULT_REGION
    try:
        got = make_clients(creds).regions.get(project=project, region=region, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - translated at this edge
        from google.auth.exceptions import TransportError

        err = translate(e, f"regions.get {region} of {project}")
        revoked = isinstance(err, CredentialsError) and not isinstance(e, TransportError) \
            and not isinstance(e.__cause__ or e.__context__, TransportError)
        return ProviderCheck("gcp", False, ("Google refused the credentials: " if revoked else "") + err.message,
                             fix=FIX_LOGIN if revoked else err.hint, credentials=where, ssh_key=key)
    gpus = [f"{q.metric} {float(q.limit):g} ({float(q.usage):g} used)" for q in getattr(got, "quotas", None) or []
            if "GPUS" in str(q.metric) and float(q.limit) > 0]
    quota = f"GPUs in {region}: " + (", ".join(gpus) if gpus else "none granted")
    call = f"regions.get {region}: {getattr(got, 'status', '') or 'answered'}"
    if key_fix:
        return ProviderCheck("gcp", False, key, fix=key_fix, credentials=where, call=call, quota=quota, ssh_key=key)
    return ProviderCheck("gcp", True, f"project {project}, region {region}", credentials=where, call=call,
                         quota=quota, ssh_key=key)
