"""Compute Engine plumbing for the gcp provider: the google-cloud-compute clients (REST transport), the one
place their exceptions and failed operations become :mod:`gtrain.errors`, waiting on operations, labels, and
the instance and firewall bodies, and :class:`Compute`, the clients every part of the provider shares.
google.cloud is imported inside functions only.

Endpoint and credentials follow gcloud: ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE`` (e.g.
``http://127.0.0.1:8089/compute/v1/``) points every client at another endpoint; there, without application
default credentials, anonymous credentials are used (as google-cloud-storage does with its emulator).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gtrain.errors import CapacityError, ConfigError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.providers.cloud.errors import with_code

ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"

LABEL_CLUSTER = "gtrain-cluster"
LABEL_CLUSTER_NAME = "gtrain-cluster-name"
LABEL_OWNER = "gtrain-owner"
LABEL_CREATED = "gtrain-created"
LABEL_RANK = "gtrain-rank"
FIREWALL_PREFIX = "gtrain-"
FIREWALL_SUFFIXES = ("-ssh", "-int")

#: "not here, maybe in another zone": try the next zone
CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "RESOURCE_POOL_EXHAUSTED",
    "RESOURCE_EXHAUSTED", "resourceExhausted", "STOCKOUT", "NOT_IN_ZONE",
})
#: account limits (GPU quotas are regional, or global): try the next region
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "QUOTA_LIMIT_EXCEEDED"})

LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


# ---------------------------------------------------------------------------------------------- clients


def compute_endpoint() -> str | None:
    """The API endpoint from ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE`` (gcloud's form ends in /compute/v1/;
    the client wants scheme://host[:port])."""
    raw = (os.environ.get(ENDPOINT_ENV) or "").strip()
    if not raw:
        return None
    u = urllib.parse.urlsplit(raw if "://" in raw else f"https://{raw}")
    path = re.sub(r"/?compute/v1/?$", "", u.path).rstrip("/")
    return f"{u.scheme}://{u.netloc}{path}"


def _adc_available() -> bool:
    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return True
    cfg = os.environ.get("CLOUDSDK_CONFIG") or str(Path.home() / ".config" / "gcloud")
    return (Path(cfg) / "application_default_credentials.json").exists()


@dataclass
class GCEClients:
    """The clients gtrain uses; tests pass their own (pointed at a fake) to the provider."""

    instances: Any
    zone_operations: Any
    firewalls: Any
    global_operations: Any
    machine_types: Any = None  # None: zones come from the built-in table
    accelerator_types: Any = None
    regions: Any = None  # None: no quota pre-check (resources.any_of)
    disks: Any = None  # the spec's volumes (gtrain/providers/gcp/volumes.py); None: made on first use


def make_clients(credentials: Any = None) -> GCEClients:
    from google.cloud import compute_v1

    kw: dict[str, Any] = {"transport": "rest"}
    endpoint = compute_endpoint()
    if endpoint:
        from google.api_core.client_options import ClientOptions

        kw["client_options"] = ClientOptions(api_endpoint=endpoint)
        if credentials is None and not _adc_available():
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    if credentials is not None:
        kw["credentials"] = credentials
    with gce("creating the Compute Engine clients"):
        return GCEClients(compute_v1.InstancesClient(**kw), compute_v1.ZoneOperationsClient(**kw),
                          compute_v1.FirewallsClient(**kw), compute_v1.GlobalOperationsClient(**kw),
                          compute_v1.MachineTypesClient(**kw), compute_v1.AcceleratorTypesClient(**kw),
                          compute_v1.RegionsClient(**kw), compute_v1.DisksClient(**kw))


def default_project() -> str | None:
    for k in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT"):
        if os.environ.get(k):
            return os.environ[k]
    if compute_endpoint() and not _adc_available():
        return None
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            _, project = google.auth.default()  # type: ignore[no-untyped-call]
        except DefaultCredentialsError:
            return None
        return str(project) if project else None
    except ImportError:
        return None


# ---------------------------------------------------------------------------------------------- errors


def classify(codes: list[str], message: str, status: int | None, what: str) -> GtrainError:
    """A GCE error (HTTP reasons, or an operation's error codes) as a gtrain error with ``.code``."""
    code = next((c for c in codes if c), "") or (str(status) if status else "UNKNOWN")
    text = f"{what}: {code}: {message}"
    err: GtrainError
    if any(c in CAPACITY_CODES for c in codes):
        err = CapacityError(text)
    elif any(c in QUOTA_CODES for c in codes) or "Quota '" in message:
        err = QuotaError(text, hint="ask for a higher GPU quota (IAM & Admin > Quotas: NVIDIA_*_GPUS, "
                                    "PREEMPTIBLE_NVIDIA_*_GPUS for spot, GPUS_ALL_REGIONS), or use another region")
    elif status == 404 and re.search(r"zones/[^/']+' was not found", message):
        err = ConfigError(f"resources.zones: {what}: {message}", hint="`gcloud compute zones list` lists them",
                          field="resources.zones")
    elif status == 404 and ("/machineTypes/" in message or "/acceleratorTypes/" in message):
        code = "NOT_IN_ZONE"
        err = CapacityError(f"{what}: not offered in this zone ({message})")
    elif status in (401, 403) or "PERMISSION_DENIED" in codes or "forbidden" in codes:
        err = CredentialsError(text, hint="check the credentials (gcloud auth application-default login) and that "
                                          "the Compute Engine API is enabled in gcp.project")
    else:
        err = ProviderError(text)
    with_code(err, code)
    return err


def translate(e: BaseException, what: str) -> GtrainError:
    """The one place google-cloud-compute / google-auth / transport exceptions become gtrain errors."""
    from google.api_core import exceptions as gx
    from google.auth import exceptions as ga

    if isinstance(e, GtrainError):
        return e
    if isinstance(e, ga.DefaultCredentialsError):
        return CredentialsError(f"{what}: no Google credentials ({e})",
                                hint="`gcloud auth application-default login`, or GOOGLE_APPLICATION_CREDENTIALS")
    if isinstance(e, ga.GoogleAuthError):
        return CredentialsError(f"{what}: {e}", hint="refresh the credentials: gcloud auth application-default login")
    if isinstance(e, gx.GoogleAPICallError):
        codes = [str(x.get("reason") or x.get("code") or "") for x in (e.errors or []) if isinstance(x, dict)]
        return classify(codes, str(e.message), int(e.code) if isinstance(e.code, int) else None, what)
    if isinstance(e, gx.GoogleAPIError):
        return ProviderError(f"{what}: {e}")
    import requests

    if isinstance(e, requests.exceptions.RequestException):
        return ProviderError(f"{what}: cannot reach the Compute Engine endpoint ({e})",
                             hint=f"check the network / {ENDPOINT_ENV}")
    return ProviderError(f"{what}: {type(e).__name__}: {e}")


@contextlib.contextmanager
def gce(what: str) -> Iterator[None]:
    import requests
    from google.api_core import exceptions as gx
    from google.auth import exceptions as ga

    try:
        yield
    except (gx.GoogleAPIError, ga.GoogleAuthError, requests.exceptions.RequestException) as e:
        raise translate(e, what) from None


def code(e: BaseException) -> str:
    return str(getattr(e, "code", "") or "")


def is_not_found(e: BaseException) -> bool:
    return code(e) in ("notFound", "404", "RESOURCE_NOT_FOUND")


def op_error(op: Any, what: str) -> GtrainError | None:
    """The error a finished operation carries, translated; None when it succeeded."""
    errs = list(op.error.errors) if op.error and op.error.errors else []
    if not errs:
        return None
    codes = [str(x.code) for x in errs]
    msg = "; ".join(str(x.message) for x in errs)
    return classify(codes, msg, int(op.http_error_status_code or 0) or None, what)


def wait_zone_op(clients: GCEClients, project: str, zone: str, name: str, what: str, timeout: float = 900) -> None:
    """Wait with zoneOperations.wait (the operation object's own poller ignores the endpoint); raise its error."""
    _wait_op(lambda: clients.zone_operations.wait(project=project, zone=zone, operation=name), name, what, timeout)


def wait_global_op(clients: GCEClients, project: str, name: str, what: str, timeout: float = 300) -> None:
    _wait_op(lambda: clients.global_operations.wait(project=project, operation=name), name, what, timeout)


def _wait_op(wait: Callable[[], Any], name: str, what: str, timeout: float) -> None:
    """Call ``wait`` (a zone or global operations.wait, which returns after at most ~2 min) until the operation
    is DONE; raise the error it carries, or a timeout."""
    from google.cloud import compute_v1

    deadline = time.monotonic() + timeout
    while True:
        with gce(f"{what}: waiting"):
            op = wait()
        if op.status == compute_v1.Operation.Status.DONE:
            err = op_error(op, what)
            if err is not None:
                raise err
            return
        if time.monotonic() > deadline:
            raise ProviderError(f"{what}: operation {name} not done after {timeout:.0f}s")


# ---------------------------------------------------------------------------------------------- names


def label_value(v: str) -> str:
    """Any string as a valid label value (lowercase letters, digits, _ and -; at most 63)."""
    return re.sub(r"[^a-z0-9_-]", "_", v.lower())[:63]


def instance_name(cluster_id: str, rank: int) -> str:
    return f"{cluster_id}-{rank}"


def network_tag(cluster_id: str) -> str:
    return f"gtrain-{cluster_id}"


def firewall_names(cluster_id: str) -> list[str]:
    return [f"{FIREWALL_PREFIX}{cluster_id}{s}" for s in FIREWALL_SUFFIXES]


def cluster_of_firewall(name: str) -> str | None:
    for s in FIREWALL_SUFFIXES:
        if name.startswith(FIREWALL_PREFIX) and name.endswith(s):
            return name[len(FIREWALL_PREFIX):-len(s)] or None
    return None


def zone_of(url: str) -> str:
    """``.../zones/us-central1-a`` or ``zones/us-central1-a`` -> ``us-central1-a``."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def region_of_zone(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


# ---------------------------------------------------------------------------------------------- bodies


@dataclass
class NodeBody:
    """What one instance is made of (everything but its name, rank and zone)."""

    machine_type: str
    accelerator_type: str | None  # N1 only: the GPU is attached; A2/A3/G2 have theirs built in
    gpu_count: int
    spot: bool
    disk_gb: int
    disk_type: str
    image: str
    network: str
    subnetwork: str | None
    external_ip: bool
    ssh_user: str
    public_key: str
    service_account: str | None
    labels: dict[str, str]
    tag: str
    max_run_s: int | None = None  # policies: GCE deletes the VM this long after it starts (maxRunDuration)


def instance_body(b: NodeBody, name: str, zone: str, labels: dict[str, str]) -> Any:
    from google.cloud import compute_v1 as c

    nic = c.NetworkInterface(network=b.network if "/" in b.network else f"global/networks/{b.network}")
    if b.subnetwork:
        nic.subnetwork = b.subnetwork if "/" in b.subnetwork else \
            f"regions/{region_of_zone(zone)}/subnetworks/{b.subnetwork}"
    if b.external_ip:
        nic.access_configs = [c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    inst = c.Instance(
        name=name, machine_type=f"zones/{zone}/machineTypes/{b.machine_type}", labels=labels,
        tags=c.Tags(items=[b.tag]),
        metadata=c.Metadata(items=[
            c.Items(key="ssh-keys", value=f"{b.ssh_user}:{b.public_key.strip()} {b.ssh_user}"),
            c.Items(key="install-nvidia-driver", value="True"),
            c.Items(key="enable-guest-attributes", value="TRUE"),
        ]),
        disks=[c.AttachedDisk(boot=True, auto_delete=True, type_="PERSISTENT",
                              initialize_params=c.AttachedDiskInitializeParams(
                                  source_image=b.image, disk_size_gb=b.disk_gb, labels=labels,
                                  disk_type=f"zones/{zone}/diskTypes/{b.disk_type}"))],
        network_interfaces=[nic],
        scheduling=c.Scheduling(
            on_host_maintenance="TERMINATE", automatic_restart=not b.spot,
            provisioning_model="SPOT" if b.spot else "STANDARD",
            **({"instance_termination_action": "DELETE"} if b.spot or b.max_run_s else {})),
    )
    if b.max_run_s:  # GCE itself deletes the VM when its run time is up: no laptop or gtrain process needed
        inst.scheduling.max_run_duration = c.Duration(seconds=b.max_run_s)
    if b.accelerator_type:
        inst.guest_accelerators = [c.AcceleratorConfig(
            accelerator_type=f"zones/{zone}/acceleratorTypes/{b.accelerator_type}", accelerator_count=b.gpu_count)]
    if b.service_account:
        inst.service_accounts = [c.ServiceAccount(email=b.service_account,
                                                  scopes=["https://www.googleapis.com/auth/cloud-platform"])]
    return inst


def firewall_bodies(cluster_id: str, network: str, ssh_cidr: str | None) -> list[Any]:
    """22 from ``ssh_cidr`` (none when None), and everything between the cluster's own instances (NCCL,
    rendezvous), both aimed at the cluster's network tag. GCE firewall rules carry no labels: the cluster is
    in the name (``gtrain-<cluster id>-ssh|-int``) and in the description."""
    from google.cloud import compute_v1 as c

    net = network if "/" in network else f"global/networks/{network}"
    tag = network_tag(cluster_id)
    ssh_name, int_name = firewall_names(cluster_id)
    out = [c.Firewall(name=int_name, network=net, direction="INGRESS", priority=1000,
                      description=f"gtrain cluster {cluster_id}: all traffic inside the cluster",
                      allowed=[c.Allowed(I_p_protocol="all")], source_tags=[tag], target_tags=[tag])]
    if ssh_cidr:
        out.insert(0, c.Firewall(name=ssh_name, network=net, direction="INGRESS", priority=1000,
                                 description=f"gtrain cluster {cluster_id}: ssh",
                                 allowed=[c.Allowed(I_p_protocol="tcp", ports=["22"])],
                                 source_ranges=[ssh_cidr], target_tags=[tag]))
    return out


# ---------------------------------------------------------------------------------------------- the clients


class Compute:
    """The clients every part of :class:`~gtrain.providers.gcp.GCPProvider` shares (made once, under a lock, on
    first use; tests pass their own, pointed at a fake) and reading one instance."""

    def __init__(self, clients: GCEClients | None = None, credentials: Any = None) -> None:
        self._clients = clients
        self._credentials = credentials
        self._lock = threading.Lock()

    @property
    def clients(self) -> GCEClients:
        with self._lock:
            if self._clients is None:
                self._clients = make_clients(self._credentials)
            return self._clients

    @property
    def disks(self) -> Any:
        """The disks client (the spec's volumes); made here when the clients a test passed have none."""
        clients = self.clients
        if clients.disks is None:
            with self._lock:
                if clients.disks is None:
                    clients.disks = make_clients(self._credentials).disks
        return clients.disks

    def instance(self, project: str, zone: str, name: str) -> Any | None:
        """The instance, or None where it does not exist."""
        try:
            with gce(f"instances.get {name}"):
                return self.clients.instances.get(project=project, zone=zone, instance=name)
        except ProviderError as e:
            if not is_not_found(e):
                raise
            return None


def project_of(explicit: str | None) -> str:
    """The project: ``gcp.project``, else the environment's; a ConfigError naming ``gcp.project`` when none."""
    p = explicit or default_project()
    if not p:
        raise ConfigError("gcp.project: no project given and none found in the environment",
                          hint="set gcp.project, or GOOGLE_CLOUD_PROJECT, or `gcloud config set project ID`",
                          field="gcp.project")
    return p
