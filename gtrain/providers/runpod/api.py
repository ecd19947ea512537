"""RunPod's REST API v2 (``https://api.runpod.io/v2``; OpenAPI at https://api.runpod.io/v2/openapi.json, reference
https://docs.runpod.io/api-reference-v2/overview) over stdlib HTTP: no SDK. The one place its answers become
gtrain's errors.

Why v2: REST v1 (``rest.runpod.io/v1``) "is deprecated and will be retired on November 15, 2026"
(https://docs.runpod.io/api-reference/overview), the GraphQL API "will be retired in early 2027"
(https://docs.runpod.io/sdks/graphql/configurations) and its reference is a schema browser
(https://graphql-spec.runpod.io/) with a few worked examples; v2 publishes one OpenAPI document
(Frontdoor 2.9.0, 2026-08) with every request body, status and error gtrain meets. What gtrain uses of it:

- ``GET /v2/catalog/gpus``: ``{"gpus": [GpuType]}``, ``GpuType`` = ``{"id", "name", "memory", "secure",
  "community", "price": {"secure", "community"} (USD/h for ONE GPU), "maxCount": {"secure", "community"}}``;
- ``POST /v2/pods`` ``CreatePodRequest`` (``name``, ``image``, ``gpu: {id, count}``, ``cloud``: SECURE |
  COMMUNITY, ``dataCenterIds``, ``ports``, ``env``, ``disk``, ``startSsh``) -> 201 ``Pod``;
- ``POST /v2/clusters`` ``CreateClusterRequest`` (``name``, ``type: TRAINING``, ``compute: {gpuTypeId,
  gpuCountPerPod, podCount}``, the container settings, ``dataCenterIds``, ``startSsh``) -> 201 ``Cluster``: an
  Instant Cluster, its pods on one private overlay network in one data center; ``GET /v2/clusters`` ->
  ``{"clusters": [Cluster]}``, ``GET /v2/clusters/{id}/pods`` -> ``{"pods": [Pod]}`` (each with ``cluster: {id,
  rank, ip}``), ``DELETE /v2/clusters/{id}`` (terminates every member; a member pod cannot be deleted alone: 409);
- ``GET /v2/pods`` -> ``{"pods": [Pod]}`` (cluster members excluded); ``GET /v2/pods/{id}``; ``DELETE
  /v2/pods/{id}`` -> 204. ``Pod``:
  ``id``, ``name``, ``status`` (PROVISIONING, STARTING, RUNNING, EXITED, ERROR, TERMINATED), ``env``,
  ``dataCenterId``, ``cost`` (USD/h billed now), ``ssh: {"proxy", "direct": {"host", "port", "username"}}``
  (``direct``: the pod's published ``22/tcp``, null until it has a public port).

Errors are ``application/problem+json`` ``{"title", "status", "detail", "errors"}``: 401 (missing/invalid
key), 403, 404, 422 (the body breaks the contract; ``errors`` lists each violation: never retried), 400 (a
cross-field rule, or "this GPU and data center combination could not be placed": capacity has no code of its
own, so ``up`` tries its next data center), 402 (insufficient balance: no candidate will succeed), 429
(``Retry-After`` seconds; ``RateLimit`` headers on every answer), 5xx (transient: retried). The API key goes in
an ``Authorization: Bearer`` header only: never in a URL (GraphQL's ``?api_key=``), a log, the state or an error.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from gtrain.errors import CapacityError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.providers.cloud import http
from gtrain.providers.cloud.errors import with_code
from gtrain.providers.cloud.http import JSONClient

BASE_URL = "https://api.runpod.io/v2"
#: gtrain's own override of the endpoint (a proxy, or the tests' fake). Not RUNPOD_API_URL: runpodctl reads that
#: one as its REST v1 base, and a user's setting for runpodctl must not send gtrain to the retired API
ENV_URL = "GTRAIN_RUNPOD_API_URL"
ENV_KEY = "RUNPOD_API_KEY"
#: where ``runpodctl config --apiKey`` keeps the key (``apikey = "..."``)
KEY_FILE = "~/.runpod/config.toml"
KEY_HINT = f"set {ENV_KEY}, or run `runpodctl config --apiKey <key>` (writes {KEY_FILE}); make a key at " \
           "https://www.console.runpod.io/user/settings"


class NoAPIKey(CredentialsError):
    """No API key in the environment or runpodctl's config file."""


Unreachable = http.Unreachable


def key_source() -> tuple[str, str] | None:
    """(key, where from): ``RUNPOD_API_KEY``, else ``apikey`` in ``~/.runpod/config.toml``; None when neither."""
    key = os.environ.get(ENV_KEY, "").strip()
    if key:
        return key, ENV_KEY
    path = Path(KEY_FILE).expanduser()
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for name in ("apikey", "apiKey", "api_key"):
        v = doc.get(name)
        if isinstance(v, str) and v.strip():
            return v.strip(), KEY_FILE
    return None


def api_key() -> str:
    got = key_source()
    if got is None:
        raise NoAPIKey("no RunPod API key found", hint=KEY_HINT)
    return got[0]


def translate(status: int, body: Any, what: str) -> GtrainError:
    """An error answer (problem+json) as one gtrain error, carrying the HTTP status as its code."""
    doc = body if isinstance(body, dict) else {}
    detail = str(doc.get("detail") or doc.get("title") or f"HTTP {status}").strip()
    errors = [str(e) for e in doc.get("errors") or [] if isinstance(e, str)][:3]
    text = f"{what}: {detail}" + (f" ({'; '.join(errors)})" if errors else "") + f" [HTTP {status}]"
    e: GtrainError
    if status == 401:
        e = CredentialsError(f"RunPod rejected the API key ({what}: {detail})", hint=KEY_HINT)
    elif status == 403:
        e = CredentialsError(f"RunPod: the API key may not do this ({what}: {detail})",
                             hint="give the key read/write access to pods at https://www.console.runpod.io/user/settings")
    elif status == 402:
        e = QuotaError(text, hint="add funds at https://www.console.runpod.io/user/billing")
    elif status == 400 and what.startswith("create pod"):  # a pod or a pod cluster
        e = CapacityError(text, hint="another data center (resources.regions) or GPU, or try again later")
    elif status == 429:
        e = ProviderError(f"{what}: RunPod's rate limit (HTTP 429)", hint="try again in a minute")
    else:
        e = ProviderError(text)
    return with_code(e, str(status))


def is_gone(e: BaseException) -> bool:
    return getattr(e, "code", None) == "404"


class RunPodAPI(JSONClient):
    """One client of the API: the key, the base URL, retries on 429 (``Retry-After``) and 5xx
    (gtrain/providers/cloud/http.py)."""

    service = "RunPod"
    env_url = ENV_URL
    retry_5xx = 3

    def __init__(self, key: str | None = None, base_url: str | None = None, timeout: float = 30.0,
                 max_429: int = 8) -> None:
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

    def gpu_types(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.call("GET", "/catalog/gpus", what="list GPU types").get("gpus") or []
        return out

    def pods(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.call("GET", "/pods", what="list pods").get("pods") or []
        return out

    def pod(self, pod_id: str) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = self.call("GET", f"/pods/{pod_id}", what=f"get pod {pod_id}")
        except ProviderError as e:
            if is_gone(e):
                return None
            raise
        return out

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        where = ",".join(body.get("dataCenterIds") or []) or "any data center"
        out: dict[str, Any] = self.call("POST", "/pods", body,
                                        what=f"create pod {body.get('name')} ({body['gpu']['id']} in {where})")
        return out

    def clusters(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.call("GET", "/clusters", what="list clusters").get("clusters") or []
        return out

    def cluster_pods(self, cluster_id: str) -> list[dict[str, Any]] | None:
        """The member pods of an Instant Cluster (None when the cluster is gone)."""
        try:
            out: list[dict[str, Any]] = self.call("GET", f"/clusters/{cluster_id}/pods",
                                                  what=f"list pods of cluster {cluster_id}").get("pods") or []
        except ProviderError as e:
            if is_gone(e):
                return None
            raise
        return out

    def create_cluster(self, body: dict[str, Any]) -> dict[str, Any]:
        where = ",".join(body.get("dataCenterIds") or []) or "any data center"
        c = body["compute"]
        out: dict[str, Any] = self.call("POST", "/clusters", body, what=f"create pod cluster {body.get('name')} "
                                        f"({c['podCount']}x {c['gpuCountPerPod']}x {c['gpuTypeId']} in {where})")
        return out

    def delete_cluster(self, cluster_id: str) -> None:
        try:
            self.call("DELETE", f"/clusters/{cluster_id}", what=f"delete cluster {cluster_id}")
        except ProviderError as e:
            if not is_gone(e):
                raise

    def delete_pod(self, pod_id: str) -> None:
        try:
            self.call("DELETE", f"/pods/{pod_id}", what=f"terminate pod {pod_id}")
        except ProviderError as e:
            if not is_gone(e):
                raise
