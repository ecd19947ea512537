"""Nebius AI Cloud's gRPC API (https://docs.nebius.com/api; the services' .proto files at
https://github.com/nebius/api) through the official Python SDK ``nebius`` (https://github.com/nebius/pysdk,
the ``nebius`` extra), imported here lazily: ``--help`` and ``status`` load none of it. The one place
its answers become gtrain's errors.

Why the SDK (and not REST or hand-built protos): Nebius publishes its API as gRPC only; the SDK ships every
service's descriptors and message types, turns a profile of ``~/.nebius/config.yaml`` (a service account's key,
or the CLI's federation login) or ``NEBIUS_IAM_TOKEN`` into the ``Authorization: Bearer`` token, waits on
long-running operations, and can be pointed at another endpoint (``GTRAIN_NEBIUS_ENDPOINT``, plain text with
``GTRAIN_NEBIUS_INSECURE=1``: the tests' fake). gtrain makes its calls synchronously over the SDK's own loop thread.

What gtrain uses (compute.v1, https://docs.nebius.com/compute/api-ref):

- ``InstanceService``: ``Create`` (``metadata {parent_id, name, labels}``, ``spec {resources {platform, preset},
  boot_disk {attach_mode, managed_disk {spec {size_gibibytes, type, source_image_family {image_family}}}},
  network_interfaces [{subnet_id, name, ip_address {}, public_ip_address {}}], gpu_cluster {id},
  cloud_init_user_data, preemptible {on_preemption: STOP}}``) -> ``Operation``; ``List`` (by ``parent_id``,
  paged), ``Get``, ``Delete``, ``Stop``, ``Start``. ``Instance.status.state``: CREATING, UPDATING, STARTING,
  RUNNING, STOPPING, STOPPED, DELETING, ERROR; ``status.network_interfaces[].ip_address.address`` (private,
  ``a.b.c.d/32``) and ``public_ip_address.address``;
- ``GpuClusterService``: ``Create`` (``metadata``, ``spec {infiniband_fabric}``), ``List``, ``Delete``: the
  InfiniBand fabric the instances of a multi-node cluster join (``spec.gpu_cluster.id``);
- ``nebius.billing.v1alpha1.CalculatorService.Estimate`` (the instance's create request in, ``hourly_cost``
  out): the live price of what ``up`` is about to create (docs.nebius.com/billing/api-ref);
- ``nebius.common.v1.OperationService.Get``: the SDK polls it until an operation is done.

Errors are gRPC status codes: UNAUTHENTICATED / PERMISSION_DENIED (credentials), INVALID_ARGUMENT (the request
breaks the API's rules: never retried), NOT_FOUND, RESOURCE_EXHAUSTED (over quota, no capacity, or the rate
limit: the message says which), UNAVAILABLE (transient: the SDK retries). The token rides in the request's
metadata only: never in argv, a URL, a log, the state or an error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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
from gtrain.providers.cloud.errors import with_code

#: gtrain's own override of the endpoint (host:port): a proxy, or the tests' fake
ENV_ENDPOINT = "GTRAIN_NEBIUS_ENDPOINT"
#: plain-text gRPC to ENV_ENDPOINT (the tests' fake only)
ENV_INSECURE = "GTRAIN_NEBIUS_INSECURE"
ENV_TOKEN = "NEBIUS_IAM_TOKEN"
ENV_PROFILE = "NEBIUS_PROFILE"
CONFIG_FILE = "~/.nebius/config.yaml"
KEY_HINT = (f"set {ENV_TOKEN} (`nebius iam get-access-token`), or make a profile with `nebius profile create` "
            f"(kept in {CONFIG_FILE}; a service account's key works unattended)")
OP_TIMEOUT_S = 600.0


class NoCredentials(CredentialsError):
    """No token in the environment and no profile in the nebius CLI's config file."""


def credentials_source() -> str | None:
    """Where the credentials come from (for ``gtrain check`` and errors); None when there are none."""
    if os.environ.get(ENV_TOKEN, "").strip():
        return ENV_TOKEN
    path = Path(CONFIG_FILE).expanduser()
    try:
        import yaml

        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, ValueError, ImportError):
        return None
    except Exception:  # noqa: BLE001 - a broken YAML file: no usable profile
        return None
    profiles = doc.get("profiles") if isinstance(doc, dict) else None
    if not isinstance(profiles, dict) or not profiles:
        return None
    name = os.environ.get(ENV_PROFILE) or doc.get("default") or next(iter(profiles))
    return f"{CONFIG_FILE} (profile {name})" if name in profiles else None


def sdk_missing() -> ConfigError:
    return ConfigError("the nebius provider needs the Nebius SDK (the `nebius` extra is not installed)",
                       field="provider", hint=install_hint("nebius"))


def translate(e: BaseException, what: str) -> GtrainError:
    """An SDK/gRPC failure as one gtrain error, carrying the gRPC status code's name as its code."""
    code, message = _code_message(e)
    kind = _detail(e)
    text = f"{what}: {message} [{code}]"
    err: GtrainError
    if code == "UNAUTHENTICATED":
        err = CredentialsError(f"Nebius rejected the credentials ({what}: {message})", hint=KEY_HINT)
    elif code == "PERMISSION_DENIED":
        err = CredentialsError(f"Nebius: these credentials may not do this ({what}: {message})",
                               hint="give the account the editor role in the project (nebius.project_id)")
    elif code == "RESOURCE_EXHAUSTED" and (kind == "too_many_requests" or (not kind and "rate" in message.lower())):
        err = ProviderError(f"{what}: Nebius's rate limit ({message})", hint="try again in a minute")
    elif code == "RESOURCE_EXHAUSTED" and (kind == "quota_failure" or (not kind and "quota" in message.lower())):
        err = QuotaError(text, hint="ask for more at https://console.nebius.com (Administration > Quotas), or "
                                    "fewer/smaller nodes")
    elif code == "RESOURCE_EXHAUSTED":
        err = CapacityError(text, hint="another platform or preset, preemptible: false, or try again later")
    elif code == "INVALID_ARGUMENT":
        err = ProviderError(text, hint="check the nebius: section (platform, preset, subnet_id, image_family)")
    elif code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        err = ProviderError(f"{what}: cannot reach Nebius ({message})",
                            hint=f"check the network (or {ENV_ENDPOINT})")
    else:
        err = ProviderError(text)
    return with_code(err, code)


def _code_message(e: BaseException) -> tuple[str, str]:
    status = getattr(e, "status", None)
    code = getattr(status, "code", None)
    if code is not None:  # the SDK's RequestError
        return str(getattr(code, "name", code)), str(getattr(status, "message", None) or "").strip() or "failed"
    fn = getattr(e, "code", None)
    if callable(fn):  # a plain grpc.RpcError
        c = fn()
        details = getattr(e, "details", None)
        return str(getattr(c, "name", c)), str(details() if callable(details) else "").strip() or "failed"
    return "UNKNOWN", str(e) or type(e).__name__


def _detail(e: BaseException) -> str | None:
    """Which detail of ``nebius.common.v1.ServiceError`` the answer carries (``quota_failure``,
    ``not_enough_resources``, ``too_many_requests``, ``bad_request``, ...), None when it carries none."""
    for se in getattr(getattr(e, "status", None), "service_errors", None) or []:
        for name in ("quota_failure", "not_enough_resources", "too_many_requests", "bad_request"):
            if getattr(se, name, None) is not None:
                return name
    return None


def is_gone(e: BaseException) -> bool:
    return getattr(e, "code", None) == "NOT_FOUND"


def _ts(v: Any) -> float | None:
    try:
        return float(v.timestamp()) if v is not None and hasattr(v, "timestamp") else None
    except (TypeError, ValueError, OSError):
        return None


def instance_view(inst: Any) -> dict[str, Any]:
    """An ``Instance`` as the plain dict the provider reads (no SDK type leaves this module)."""
    md, spec, st = inst.metadata, inst.spec, inst.status
    nics = list(st.network_interfaces or []) if st is not None else []
    priv = pub = None
    if nics:
        ip = nics[0].ip_address
        pip = nics[0].public_ip_address
        priv = (ip.address or "").split("/")[0] if ip is not None else None
        pub = (pip.address or "").split("/")[0] if pip is not None else None
    state = st.state if st is not None else None
    return {"id": md.id, "name": md.name, "labels": dict(md.labels or {}), "parent_id": md.parent_id,
            "state": getattr(state, "name", str(state or "UNSPECIFIED")),
            "platform": spec.resources.platform if spec.resources is not None else None,
            "preset": spec.resources.preset if spec.resources is not None else None,
            "gpu_cluster": (spec.gpu_cluster.id or None) if spec.gpu_cluster is not None else None,
            "preemptible": bool(spec.check_presence("preemptible")), "private_ip": priv or None,
            "public_ip": pub or None,
            "created_at": _ts(md.created_at)}


class NebiusAPI:
    """One SDK connection, made on first use; the calls gtrain makes, each translated at this edge."""

    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 60.0) -> None:
        self.endpoint = endpoint or os.environ.get(ENV_ENDPOINT) or None
        self._token = token
        self.timeout = timeout
        self._sdk: Any = None

    # ---- the connection ----

    def sdk(self) -> Any:
        if self._sdk is not None:
            return self._sdk
        try:
            from nebius.aio.cli_config import Config
            from nebius.base.options import INSECURE
            from nebius.base.resolver import Constant
            from nebius.sdk import SDK
        except ImportError:
            raise sdk_missing() from None
        if not os.environ.get("GTRAIN_DEBUG"):
            # the SDK logs each retried attempt with its traceback; gtrain says what failed once, at its edge
            logging.getLogger("nebius").addHandler(logging.NullHandler())
            logging.getLogger("nebius").propagate = False
        kw: dict[str, Any] = {"user_agent_prefix": "gtrain"}
        if self.endpoint:
            kw["resolver"] = Constant(self.endpoint)
            if os.environ.get(ENV_INSECURE) == "1":
                kw["options"] = [(INSECURE, True)]
        token = self._token or os.environ.get(ENV_TOKEN, "").strip() or None
        if token:
            kw["credentials"] = token
        elif credentials_source() is not None:
            kw["config_reader"] = Config(no_parent_id=True)
        else:
            raise NoCredentials("no Nebius credentials found", hint=KEY_HINT)
        self._sdk = SDK(**kw)
        return self._sdk

    def close(self) -> None:
        if self._sdk is not None:
            try:
                self._sdk.sync_close(timeout=5)
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
            self._sdk = None

    @contextmanager
    def edge(self, what: str) -> Iterator[None]:
        try:
            yield
        except GtrainError:
            raise
        except Exception as e:  # noqa: BLE001 - the SDK's and grpc's errors: gtrain's from here on
            raise translate(e, what) from None

    def _compute(self) -> Any:
        try:
            import nebius.api.nebius.compute.v1 as cv1
        except ImportError:
            raise sdk_missing() from None
        return cv1

    def _wait(self, op: Any) -> str:
        op.sync_wait(timeout=OP_TIMEOUT_S)
        return str(op.resource_id)

    # ---- instances ----

    def instances(self, parent_id: str) -> list[dict[str, Any]]:
        cv1 = self._compute()
        out: list[dict[str, Any]] = []
        token = ""
        with self.edge(f"list instances of {parent_id}"):
            client = cv1.InstanceServiceClient(self.sdk())
            while True:
                req = cv1.ListInstancesRequest(parent_id=parent_id, page_size=100, page_token=token)
                resp = client.list(req, timeout=self.timeout).wait()
                out += [instance_view(i) for i in resp.items or []]
                token = resp.next_page_token or ""
                if not token:
                    return out

    def instance(self, instance_id: str) -> dict[str, Any] | None:
        cv1 = self._compute()
        try:
            with self.edge(f"get instance {instance_id}"):
                req = cv1.GetInstanceRequest(id=instance_id)
                got = cv1.InstanceServiceClient(self.sdk()).get(req, timeout=self.timeout).wait()
        except GtrainError as e:
            if is_gone(e):
                return None
            raise
        return instance_view(got)

    def create_instance(self, req: Any, what: str) -> str:
        cv1 = self._compute()
        with self.edge(what):
            op = cv1.InstanceServiceClient(self.sdk()).create(req, timeout=self.timeout).wait()
            return self._wait(op)

    def delete_instance(self, instance_id: str) -> None:
        cv1 = self._compute()
        try:
            with self.edge(f"delete instance {instance_id}"):
                req = cv1.DeleteInstanceRequest(id=instance_id)
                op = cv1.InstanceServiceClient(self.sdk()).delete(req, timeout=self.timeout).wait()
                self._wait(op)
        except GtrainError as e:
            if not is_gone(e):
                raise

    def power(self, instance_id: str, on: bool) -> None:
        cv1 = self._compute()
        with self.edge(f"{'start' if on else 'stop'} instance {instance_id}"):
            client = cv1.InstanceServiceClient(self.sdk())
            call = client.start(cv1.StartInstanceRequest(id=instance_id), timeout=self.timeout) if on else \
                client.stop(cv1.StopInstanceRequest(id=instance_id), timeout=self.timeout)
            self._wait(call.wait())

    # ---- GPU clusters ----

    def gpu_clusters(self, parent_id: str) -> list[dict[str, Any]]:
        cv1 = self._compute()
        out: list[dict[str, Any]] = []
        token = ""
        with self.edge(f"list GPU clusters of {parent_id}"):
            client = cv1.GpuClusterServiceClient(self.sdk())
            while True:
                req = cv1.ListGpuClustersRequest(parent_id=parent_id, page_size=100, page_token=token)
                resp = client.list(req, timeout=self.timeout).wait()
                out += [{"id": g.metadata.id, "name": g.metadata.name, "labels": dict(g.metadata.labels or {}),
                         "fabric": g.spec.infiniband_fabric if g.spec is not None else None}
                        for g in resp.items or []]
                token = resp.next_page_token or ""
                if not token:
                    return out

    def create_gpu_cluster(self, parent_id: str, name: str, labels: dict[str, str], fabric: str) -> str:
        cv1 = self._compute()
        import nebius.api.nebius.common.v1 as co1

        req = cv1.CreateGpuClusterRequest(metadata=co1.ResourceMetadata(parent_id=parent_id, name=name, labels=labels),
                                          spec=cv1.GpuClusterSpec(infiniband_fabric=fabric))
        with self.edge(f"create GPU cluster {name} (fabric {fabric})"):
            op = cv1.GpuClusterServiceClient(self.sdk()).create(req, timeout=self.timeout).wait()
            return self._wait(op)

    def delete_gpu_cluster(self, cluster_id: str) -> None:
        cv1 = self._compute()
        try:
            with self.edge(f"delete GPU cluster {cluster_id}"):
                req = cv1.DeleteGpuClusterRequest(id=cluster_id)
                op = cv1.GpuClusterServiceClient(self.sdk()).delete(req, timeout=self.timeout).wait()
                self._wait(op)
        except GtrainError as e:
            if not is_gone(e):
                raise

    # ---- the live price ----

    def hourly_price(self, req: Any) -> float:
        """USD/h Nebius's calculator quotes for creating ``req`` (a ``CreateInstanceRequest``)."""
        try:
            import nebius.api.nebius.billing.v1alpha1 as bv1
        except ImportError:
            raise sdk_missing() from None
        with self.edge(f"estimate the price of {req.spec.resources.platform} {req.spec.resources.preset}"):
            resp = bv1.CalculatorServiceClient(self.sdk()).estimate(bv1.EstimateRequest(
                resource_spec=bv1.ResourceSpec(compute_instance_spec=req)), timeout=self.timeout).wait()
            general = resp.hourly_cost.general if resp.hourly_cost is not None else None
            total = general.total if general is not None else None
            if total is None or not total.cost:
                raise ValueError("the calculator's answer has no hourly_cost.general.total.cost")
            return float(total.cost)


def instance_request(*, project_id: str, name: str, labels: dict[str, str], platform: str, preset: str,
                     subnet_id: str, image_family: str, disk_gb: int, disk_type: str, user_data: str,
                     public_ip: bool, gpu_cluster: str | None, preemptible: bool) -> Any:
    """The ``CreateInstanceRequest`` of one node (an SDK message): a managed boot disk from the image family
    (deleted with the instance), one network interface on the subnet (a dynamic public address unless
    ``public_ip`` is false), cloud-init user data with the cluster's key, the GPU cluster to join, and
    ``preemptible {on_preemption: STOP}`` for spot."""
    try:
        import nebius.api.nebius.common.v1 as co1
        import nebius.api.nebius.compute.v1 as cv1
    except ImportError:
        raise sdk_missing() from None
    nic = cv1.NetworkInterfaceSpec(subnet_id=subnet_id, name="eth0", ip_address=cv1.IPAddress(),
                                   public_ip_address=cv1.PublicIPAddress() if public_ip else None)
    disk = cv1.AttachedDiskSpec(
        attach_mode=cv1.AttachedDiskSpec.AttachMode.READ_WRITE,
        managed_disk=cv1.ManagedDisk(name=f"{name}-boot", labels=labels, spec=cv1.DiskSpec(
            size_gibibytes=disk_gb, type=getattr(cv1.DiskSpec.DiskType, disk_type),
            source_image_family=cv1.SourceImageFamily(image_family=image_family))))
    spec = cv1.InstanceSpec(resources=cv1.ResourcesSpec(platform=platform, preset=preset), boot_disk=disk,
                            network_interfaces=[nic], cloud_init_user_data=user_data,
                            gpu_cluster=cv1.InstanceGpuClusterSpec(id=gpu_cluster) if gpu_cluster else None,
                            preemptible=cv1.PreemptibleSpec(on_preemption=cv1.PreemptibleSpec.PreemptionPolicy.STOP)
                            if preemptible else None)
    return cv1.CreateInstanceRequest(metadata=co1.ResourceMetadata(parent_id=project_id, name=name, labels=labels),
                                     spec=spec)
