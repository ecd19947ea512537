"""The Cloud TPU API v2 over REST (stdlib ``urllib``; google-auth only for the access token), and the one place
its errors become gtrain's.

REST reference: https://cloud.google.com/tpu/docs/reference/rest/v2 --
``projects.locations.nodes`` (create ``?nodeId=``, get, list, delete; the Node's ``state``, ``health``,
``networkEndpoints[].ipAddress`` / ``accessConfig.externalIp``, ``labels``, ``metadata``, ``schedulingConfig``),
``projects.locations.queuedResources`` (create ``?queuedResourceId=``, get, list, delete ``?force=true``; its
``state.state``: CREATING, ACCEPTED, PROVISIONING, WAITING_FOR_RESOURCES, ACTIVE, FAILED, SUSPENDED, ...) and
``projects.locations.operations`` (get: ``done``, ``error`` as a google.rpc.Status). Errors are Google's JSON
error body ``{"error": {"code", "message", "status"}}``.

Why not google-cloud-tpu: importing ``google.cloud.tpu_v2`` took 1.3-1.9 s (``python -X importtime``, this
machine, loaded) and the package is 3.4 MB; the dozen calls gtrain makes are plain JSON. The endpoint is
``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU`` (gcloud's ``api_endpoint_overrides/tpu``) when set, anonymous when it is
and no application-default credentials exist (a fake or emulator), else ``https://tpu.googleapis.com/``.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gtrain.errors import CapacityError, ConfigError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.providers.cloud.errors import with_code

__all__ = ["ENDPOINT_ENV", "TPUApi", "translate_status"]

ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"
DEFAULT_ENDPOINT = "https://tpu.googleapis.com/"
#: google.rpc.Code numbers an operation's error carries (https://cloud.google.com/apis/design/errors)
RPC_CODES = {3: "INVALID_ARGUMENT", 5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED",
             8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 13: "INTERNAL", 14: "UNAVAILABLE",
             16: "UNAUTHENTICATED"}


def translate_status(status: str, message: str, http: int | None, what: str) -> GtrainError:
    """A TPU API error (an HTTP error's ``status``, or an operation's / queued resource's) as a gtrain error."""
    text = f"{what}: {status}: {message}"
    low = message.lower()
    err: GtrainError
    if "quota" in low:
        err = QuotaError(text, hint="ask for a higher TPU quota (IAM & Admin > Quotas: TPUs per region, "
                                    "preemptible TPUs for spot), or another zone")
    elif status == "RESOURCE_EXHAUSTED" or "no more capacity" in low or "stockout" in low:
        err = CapacityError(text)
    elif status == "INVALID_ARGUMENT" and "runtime" in low:
        err = ConfigError(f"gcp.runtime_version: {text}", field="gcp.runtime_version",
                          hint="`gcloud compute tpus tpu-vm versions list --zone ZONE`, or runtime_version: auto")
    elif status == "INVALID_ARGUMENT" and "topology" in low:
        err = ConfigError(f"gcp.topology: {text}", field="gcp.topology", hint="drop gcp.topology for the default")
    elif status in ("PERMISSION_DENIED", "UNAUTHENTICATED") or http in (401, 403):
        err = CredentialsError(text, hint="check the credentials (gcloud auth application-default login) and that "
                                          "the Cloud TPU API is enabled in gcp.project")
    else:
        err = ProviderError(text)
    with_code(err, status or (str(http) if http else "UNKNOWN"))
    return err


def _adc_available() -> bool:
    from gtrain.providers.gcp.api import _adc_available as adc

    return adc()


class TPUApi:
    """One project's TPU API: JSON in, JSON out; every error translated (``.code`` = Google's status)."""

    def __init__(self, endpoint: str | None = None, timeout: float = 60.0) -> None:
        raw = (endpoint or os.environ.get(ENDPOINT_ENV) or "").strip()
        self.overridden = bool(raw)
        base = raw or DEFAULT_ENDPOINT
        base = base if "://" in base else f"https://{base}"
        self.base = base.rstrip("/").removesuffix("/v2")
        self.timeout = timeout
        self._creds: Any = None
        self._lock = threading.Lock()

    def _token(self) -> str | None:
        if self.overridden and not _adc_available():
            return None
        with self._lock:
            if self._creds is None:
                import google.auth
                from google.auth.exceptions import DefaultCredentialsError

                try:
                    self._creds, _ = google.auth.default(  # type: ignore[no-untyped-call]
                        scopes=["https://www.googleapis.com/auth/cloud-platform"])
                except DefaultCredentialsError as e:
                    raise CredentialsError(f"Cloud TPU API: no Google credentials ({e})",
                                           hint="`gcloud auth application-default login`") from None
            if not self._creds.valid:
                import google.auth.transport.requests

                self._creds.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]
            return str(self._creds.token)

    def call(self, method: str, path: str, what: str, body: Any = None,
             query: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self.base}/v2/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Content-Type": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310 (https or the override)
                raw = r.read()
        except urllib.error.HTTPError as e:
            try:
                err = json.loads(e.read() or b"{}").get("error") or {}
            except ValueError:
                err = {}
            raise translate_status(str(err.get("status") or ""), str(err.get("message") or e.reason), e.code,
                                   what) from None
        except (urllib.error.URLError, OSError) as e:
            raise ProviderError(f"{what}: cannot reach the Cloud TPU API at {self.base} ({e})",
                                hint=f"check the network / {ENDPOINT_ENV}") from None
        return json.loads(raw or b"{}")  # type: ignore[no-any-return]

    # ---- the calls gtrain makes ----

    def wait_op(self, op: dict[str, Any], what: str, timeout: float = 1800, poll_s: float = 2.0) -> dict[str, Any]:
        """Poll ``operations.get`` until ``done``; raise the error it carries."""
        deadline = time.monotonic() + timeout
        delay = 0.1
        while not op.get("done"):
            if time.monotonic() > deadline:
                raise ProviderError(f"{what}: operation {op.get('name')} not done after {timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, poll_s)
            op = self.call("GET", str(op["name"]), f"{what}: waiting")
        if op.get("error"):
            e = op["error"]
            raise translate_status(RPC_CODES.get(int(e.get("code") or 0), str(e.get("code"))),
                                   str(e.get("message") or ""), None, what)
        return op

    def node(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        try:
            return self.call("GET", f"projects/{project}/locations/{zone}/nodes/{name}", f"nodes.get {name}")
        except GtrainError as e:
            if getattr(e, "code", "") in ("NOT_FOUND", "404"):
                return None
            raise

    def list(self, project: str, zone: str, kind: str) -> list[dict[str, Any]]:
        """Every node (kind ``nodes``) or queued resource (``queuedResources``) of a zone (``-``: all), paged."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            q = {"pageToken": token} if token else None
            page = self.call("GET", f"projects/{project}/locations/{zone}/{kind}", f"{kind}.list {zone}", query=q)
            out += page.get(kind) or []
            token = str(page.get("nextPageToken") or "")
            if not token:
                return out

    def delete(self, name: str, what: str, force: bool = False) -> dict[str, Any] | None:
        """DELETE a node / queued resource by its full name; None when it is already gone."""
        try:
            return self.call("DELETE", name, what, query={"force": "true"} if force else None)
        except GtrainError as e:
            if getattr(e, "code", "") in ("NOT_FOUND", "404"):
                return None
            raise
