"""The GCP provider: Compute Engine GPU VMs (on-demand or Spot), reached over SSH.

Per cluster, in one project: an ed25519 key pair made here (private key 0600 under ``$GTRAIN_HOME/keys/``,
public key in each instance's ``ssh-keys`` metadata), two firewall rules aimed at the cluster's network tag
(``gtrain-<id>-ssh``: tcp 22 from ``gcp.ssh_cidr`` only; ``gtrain-<id>-int``: everything from the cluster's
own instances, for NCCL and the rendezvous), and one instance per node named ``<cluster id>-<rank>``. GPUs are
attached with ``onHostMaintenance: TERMINATE`` (N1 + T4/V100 through guestAccelerators; A2/A3/G2 have theirs
built in); Spot VMs use provisioningModel SPOT with instanceTerminationAction DELETE. Instances and their boot
disks carry the labels ``gtrain-cluster`` (the cluster id), ``gtrain-cluster-name``, ``gtrain-owner``,
``gtrain-created``, ``gtrain-rank``; ``down`` and ``gtrain gc`` find them by label, the firewall rules by name,
so a lost state database loses nothing.

Nodes are created in parallel, each insert with a ``requestId`` kept in the resource ledger before the call and
a deterministic name, so a retried ``up`` gets the same instance back. Operations are waited on with
zoneOperations.wait / globalOperations.wait. ZONE_RESOURCE_POOL_EXHAUSTED (and a type the zone does not offer)
moves on to the next zone, QUOTA_EXCEEDED to the next region; a failed zone is cleaned before moving on.

Cost: GCE bills per second with a one-minute minimum; on-demand $/h is the catalog's, stored at start; Spot has
no price history API, so Spot cost is the catalog's estimate and is marked so; the boot persistent disk is
added by GB-hour.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gtrain.errors import CapacityError, ConfigError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import IntervalCost, NodeStatus, Plan, Provider
from gtrain.providers.common import (
    Attempts,
    CloudOptions,
    cloud_interval_cost,
    drop_key,
    ensure_key,
    key_path,
    owner,
    resolve_ssh_cidr,
    ssh_notes,
    wait_ssh,
    write_ssh_config,
)
from gtrain.providers.gcp import api
from gtrain.providers.gcp.api import LABEL_CLUSTER, LABEL_RANK, GCEClients, gce
from gtrain.providers.gcp.teardown import GCPTeardown

if TYPE_CHECKING:
    from gtrain.catalog import Offer
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval, StateStore

#: persistent disk, USD per GB-month (us-central1 list price, 2025); a month is 730 hours
PD_USD_PER_GB_MONTH = {"pd-balanced": 0.10, "pd-ssd": 0.17, "pd-standard": 0.04}
#: the zones of each catalog region, in the order tried when resources.zones is not given
REGION_ZONES = {
    "us-central1": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"],
    "us-east1": ["us-east1-b", "us-east1-c", "us-east1-d"],
    "us-east4": ["us-east4-a", "us-east4-b", "us-east4-c"],
    "europe-west4": ["europe-west4-a", "europe-west4-b", "europe-west4-c"],
    "asia-east1": ["asia-east1-a", "asia-east1-b", "asia-east1-c"],
}
DEFAULT_IMAGE_PROJECT = "deeplearning-platform-release"
DEFAULT_IMAGE_FAMILY = "common-cu124-ubuntu-2204-py310"
LIVE = ("PROVISIONING", "STAGING", "RUNNING")


class GCPOptions(CloudOptions):
    """The ``gcp:`` section of a spec (ssh_cidr, ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s: CloudOptions)."""

    proxy_host: ClassVar[str] = "the instance name"
    proxy_example: ClassVar[str] = "gcloud compute start-iap-tunnel %h 22 --listen-on-stdin --zone ZONE"

    project: str | None = Field(None, description="else GOOGLE_CLOUD_PROJECT / gcloud's / the credentials' project")
    ssh_user: str = Field("gtrain", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    host_key_wait_s: float = Field(120, ge=0, description="how long to wait for the host keys the guest agent "
                                   "publishes in guest attributes (hostkeys/) before trusting on first use")
    network: str = "default"
    subnetwork: str | None = None
    external_ip: bool | None = Field(None, description="default: yes, unless ssh_proxy_command is set")
    disk_type: Literal["pd-balanced", "pd-ssd", "pd-standard"] = "pd-balanced"
    image_project: str = DEFAULT_IMAGE_PROJECT
    image_family: str = DEFAULT_IMAGE_FAMILY
    service_account: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("project")
    @classmethod
    def _project(cls, v: str | None) -> str | None:
        import re

        if v is not None and not re.fullmatch(r"[a-z][-a-z0-9]{4,28}[a-z0-9]|[a-z0-9.:-]+", v):
            raise ValueError("is not a GCP project id (6-30 of a-z, 0-9 and -)")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if k.startswith("gtrain-") or k.startswith("goog"):
                raise ValueError(f"label {k!r} is set by gtrain or Google; pick another key")
            if not api.LABEL_KEY_RE.match(k) or not api.LABEL_VALUE_RE.match(val):
                raise ValueError(f"{k}={val!r} is not a GCE label (keys: lowercase letter first, then a-z 0-9 _ -; "
                                 "values: a-z 0-9 _ -; at most 63 each)")
        return v


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gcp: GCPOptions = Field(default_factory=lambda: GCPOptions())


def gcp_options(section: dict[str, Any] | None) -> GCPOptions:
    """Validate the spec's ``gcp:`` section; a ConfigError names the field (``gcp.ssh_cidr``)."""
    from gtrain.spec import translate_validation_error

    try:
        return _Section.model_validate({"gcp": section or {}}).gcp
    except ValidationError as e:
        raise translate_validation_error(e, _Section) from None


class GCPProvider(GCPTeardown, Provider):
    name = "gcp"
    billing_minimum_s = 60.0

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, clients: GCEClients | None = None,
                 credentials: Any = None, max_workers: int = 32) -> None:
        super().__init__(store, report)
        self._clients = clients
        self._credentials = credentials
        self._lock = threading.Lock()
        self._store_lock = threading.RLock()  # one sqlite connection: one writer at a time
        self._max_workers = max_workers

    @property
    def clients(self) -> GCEClients:  # type: ignore[override]
        with self._lock:
            if self._clients is None:
                self._clients = api.make_clients(self._credentials)
            return self._clients

    def project(self, opts: GCPOptions) -> str:
        p = opts.project or api.default_project()
        if not p:
            raise ConfigError("gcp.project: no project given and none found in the environment",
                              hint="set gcp.project, or GOOGLE_CLOUD_PROJECT, or `gcloud config set project ID`",
                              field="gcp.project")
        return p

    def _opts(self, cluster: Cluster) -> GCPOptions:
        return gcp_options(cluster.spec.get("gcp"))

    # ---- plan ----

    def _offer(self, spec: ClusterSpec, region: str | None) -> Offer:
        from gtrain.catalog import resolve

        res = spec.resources
        return resolve("gcp", res.accelerators, res.instance_type, region, res.use_spot)

    def _regions(self, spec: ClusterSpec, offer: Offer) -> list[str]:
        from gtrain.catalog import offers

        regions = spec.resources.region_list()
        if regions:
            return regions
        same = [o for o in offers("gcp", gpu=offer.gpu_name, gpu_count=offer.gpu_count, spot=spec.resources.use_spot)
                if o.instance_type == offer.instance_type and o.accelerator_type == offer.accelerator_type]
        out: list[str] = []
        for o in same:
            if o.region not in out:
                out.append(o.region)
        return out

    def _regional_offer(self, offer: Offer, region: str) -> Offer | None:
        from gtrain.catalog import lookup

        return next((o for o in lookup("gcp", offer.instance_type, region)
                     if o.accelerator_type == offer.accelerator_type and o.gpu_count == offer.gpu_count), None)

    def _zones(self, spec: ClusterSpec, region: str) -> list[str]:
        zones = spec.resources.zones
        if zones:
            return [z for z in zones if api.region_of_zone(z) == region]
        return REGION_ZONES.get(region, [f"{region}-{x}" for x in "abc"])

    def _offered_zones(self, spec: ClusterSpec, project: str, region: str, offer: Offer) -> list[str]:
        """The zones of ``region`` that offer the machine type (and, for N1, the attached GPU), asked of the
        API (machineTypes / acceleratorTypes aggregatedList), like AWS's instance type offerings; the spec's
        own ``resources.zones`` as given; the built-in table where the lists cannot be read."""
        table = self._zones(spec, region)
        if spec.resources.zones or self.clients.machine_types is None:
            return table

        def where(client: Any, kind: str, name: str) -> set[str]:
            found: set[str] = set()
            with gce(f"{kind}.aggregatedList {name}"):
                for scope, listed in client.aggregated_list(request={"project": project,
                                                                     "filter": f'name = "{name}"'}):
                    items = getattr(listed, "machine_types" if kind == "machineTypes" else "accelerator_types")
                    if any(i.name == name for i in items):
                        found.add(scope.rsplit("/", 1)[-1])
            return found

        try:
            zones = where(self.clients.machine_types, "machineTypes", offer.instance_type)
            if _attached(offer) and offer.accelerator_type and self.clients.accelerator_types is not None:
                zones &= where(self.clients.accelerator_types, "acceleratorTypes", offer.accelerator_type)
        except (CredentialsError, ProviderError) as e:
            self.report.warn(f"{region}: cannot list the zones offering {offer.instance_type} ({e.message}); "
                             f"trying {', '.join(table)}")
            return table
        mine = [z for z in zones if api.region_of_zone(z) == region]
        order = {z: i for i, z in enumerate(table)}
        return sorted(mine, key=lambda z: (order.get(z, len(order)), z))

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = gcp_options(spec.gcp)
        res = spec.resources
        if res.regions and res.region and res.region not in res.regions:
            raise ConfigError(f"resources.region: {res.region!r} is not in resources.regions",
                              hint="give one or the other", field="resources.region")
        given = res.region_list()
        try:
            offer = self._offer(spec, given[0] if given else None)
        except ConfigError as e:
            if e.field == "resources.region" and res.regions:
                e.field = "resources.regions[0]"
                e.message = e.message.replace("resources.region:", "resources.regions[0]:", 1)
            raise
        regions = self._regions(spec, offer)
        for i, r in enumerate(regions):
            if self._regional_offer(offer, r) is None:
                raise ConfigError(f"resources.regions[{i}]: {offer.instance_type} ({offer.accelerators}) is not "
                                  f"offered in {r}", hint="drop that region or pick another GPU",
                                  field=f"resources.regions[{i}]")
        for i, z in enumerate(res.zones or []):
            if api.region_of_zone(z) not in regions:
                raise ConfigError(f"resources.zones[{i}]: {z!r} is not a zone of {', '.join(regions)}",
                                  hint="zones are the region name plus -a, -b, ..., e.g. us-central1-a",
                                  field=f"resources.zones[{i}]")
        first = self._regional_offer(offer, regions[0]) or offer
        notes = [f"{first.instance_type}: {first.vcpus} vCPUs, {first.memory_gib:g} GiB, {first.gpu_count}x "
                 f"{first.gpu_name} {first.gpu_memory_gib:g} GB" + (f" ({first.accelerator_type} attached)"
                                                                     if _attached(first) else "")]
        if res.use_spot:
            notes.append(f"Spot $/h is the catalog's estimate (on-demand {first.price_ondemand:g} $/h); GCE may "
                         "delete Spot VMs at any time")
        notes.append(f"plus {opts.disk_type} {res.disk_gb} GB per node at ${PD_USD_PER_GB_MONTH[opts.disk_type]:g}"
                     "/GB-month; billed per second, 1 minute minimum")
        if len(regions) > 1:
            notes.append(f"on no capacity: next zone, then {', '.join(regions[1:])}")
        notes += ssh_notes(opts.ssh_cidr, opts.ssh_proxy_command, "gcp")
        zones = self._zones(spec, regions[0])
        return Plan(provider="gcp", num_nodes=spec.num_nodes, instance_type=first.instance_type,
                    market="spot" if res.use_spot else "on-demand", region=regions[0],
                    zone=zones[0] if zones else None, gpu_name=first.gpu_name, gpus_per_node=first.gpu_count,
                    price_per_hour=first.price(res.use_spot), max_hours=spec.policies.max_hours, notes=notes)

    # ---- the ledger ----

    def _record(self, cluster: Cluster, kind: str, ref: str, region: str, meta: dict[str, Any] | None = None) -> int:
        with self._store_lock:
            return self.store.record_resource(cluster.id, kind, ref, region=region, meta=meta)

    def _mark(self, rid: int, status: str, **kw: Any) -> None:
        with self._store_lock:
            self.store.mark_resource(rid, status, **kw)

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        opts = gcp_options(spec.gcp)
        project = self.project(opts)
        offer = self._offer(spec, None if not spec.resources.region_list() else spec.resources.region_list()[0])
        regions = self._regions(spec, offer)
        ssh_cidr = resolve_ssh_cidr(opts.ssh_cidr, opts.ssh_proxy_command, "gcp", " (IAP)")
        pub = ensure_key(cluster.id)
        # a resumed `up`: the nodes already there pin the zone
        existing: dict[int, Any] = {}
        found = self.find_instances(project, cluster.id)
        if found:
            zone = api.zone_of(found[0].zone)
            regions = [api.region_of_zone(zone)]
            zones_pin: list[str] | None = [zone]
            for inst in found:
                rank = int(inst.labels.get(LABEL_RANK, "-1"))
                if 0 <= rank < spec.num_nodes and api.zone_of(inst.zone) == zone:
                    existing[rank] = inst
            self.report.info(f"found {len(existing)} of {spec.num_nodes} node(s) of {cluster.name} in {zone}")
        else:
            zones_pin = None
        made_fw = self._ensure_firewalls(cluster, project, opts, ssh_cidr)
        attempts = Attempts()
        for region in regions:
            regional = self._regional_offer(offer, region)
            if regional is None:
                attempts.add(region, f"{offer.instance_type} ({offer.accelerators}) not in the catalog here")
                continue
            body = self._body(spec, cluster, opts, regional, pub)
            zones = zones_pin or self._offered_zones(spec, project, region, regional)
            if not zones:
                attempts.add(region, f"no zone offers {regional.instance_type}"
                             + (f" with {regional.accelerator_type}" if _attached(regional) else ""))
                continue
            for zone in zones:
                made: list[str] = []
                try:
                    nodes = self._launch_zone(spec, cluster, project, zone, body, existing, made)
                except (CapacityError, QuotaError) as e:
                    attempts.add(f"{region}/{zone}", e)
                    self.report.warn(f"{zone}: {e.message}; "
                                     + ("trying the next region" if isinstance(e, QuotaError) else "trying elsewhere"))
                    self._delete_instances(project, [(zone, n) for n in made], cluster)
                    if isinstance(e, QuotaError):
                        break
                    continue
                except BaseException:  # a bad request, an outage: leave nothing this call made, then say why
                    self._undo(project, cluster, zone, made, made_fw if not existing else [])
                    raise
                self._record_nodes(spec, cluster, plan, opts, project, zone, nodes, regional)
                if opts.wait_ssh:
                    self._wait_ssh(cluster, opts, project)
                return
        what = f"{spec.num_nodes}x {offer.instance_type} ({plan.market})"
        if not existing:  # nothing of this cluster runs anywhere: its firewall rules and local key go too
            self._undo(project, cluster, None, [], made_fw)
        attempts.fail(what, quota_hint="request a GPU quota increase, or add resources.regions",
                      capacity_hint="add zones or regions (resources.zones / resources.regions), try on-demand, "
                                    "or fewer nodes; nothing was left running")

    def _undo(self, project: str, cluster: Cluster, zone: str | None, made: list[str], firewalls: list[str]) -> None:
        """Delete what a failed ``up`` made (best effort: the first error is the one to report)."""
        try:
            if zone and made:
                self._delete_instances(project, [(zone, n) for n in made], cluster)
            if firewalls:
                self._delete_firewalls(project, cluster.id, cluster, only=firewalls)
                drop_key(cluster.id)
        except GtrainError as e:
            self.report.warn(f"could not clean up after the failed attempt: {e.message}")

    def _body(self, spec: ClusterSpec, cluster: Cluster, opts: GCPOptions, offer: Offer, pub: str) -> api.NodeBody:
        image = spec.resources.image_id or f"projects/{opts.image_project}/global/images/family/{opts.image_family}"
        created = str(int(cluster.created_at))
        labels = {**opts.labels, LABEL_CLUSTER: cluster.id, api.LABEL_CLUSTER_NAME: cluster.name,
                  api.LABEL_OWNER: api.label_value(owner()), api.LABEL_CREATED: created}
        return api.NodeBody(
            machine_type=offer.instance_type, accelerator_type=offer.accelerator_type if _attached(offer) else None,
            gpu_count=offer.gpu_count, spot=spec.resources.use_spot, disk_gb=spec.resources.disk_gb,
            disk_type=opts.disk_type, image=image, network=opts.network, subnetwork=opts.subnetwork,
            external_ip=opts.external_ip if opts.external_ip is not None else not opts.ssh_proxy_command,
            ssh_user=opts.ssh_user, public_key=pub, service_account=opts.service_account, labels=labels,
            tag=api.network_tag(cluster.id))

    def _ensure_firewalls(self, cluster: Cluster, project: str, opts: GCPOptions, ssh_cidr: str | None) -> list[str]:
        """Make the cluster's firewall rules that do not exist yet; returns the names made by this call."""
        made: list[str] = []
        for fw in api.firewall_bodies(cluster.id, opts.network, ssh_cidr):
            try:
                with gce(f"firewalls.get {fw.name}"):
                    self.clients.firewalls.get(project=project, firewall=fw.name)
                continue
            except ProviderError as e:
                if not api.is_not_found(e):
                    raise
            rid = self._record(cluster, "firewall", fw.name, "global")
            try:
                with gce(f"firewalls.insert {fw.name}"):
                    op = self.clients.firewalls.insert(project=project, firewall_resource=fw)
                api.wait_global_op(self.clients, project, op.name, f"firewalls.insert {fw.name}")
            except GtrainError as e:
                if api.code(e) != "alreadyExists":
                    self._mark(rid, "not-created")
                    raise
            self._mark(rid, "created")
            made.append(fw.name)
        return made

    def _tokens(self, cluster: Cluster, ranks: list[int], zone: str) -> dict[int, tuple[str, int]]:
        """The requestId (and ledger row) of each node's insert in this zone, recorded before the call; a row still
        'creating' (a crash between request and answer) is reused so GCE answers with the same operation."""
        out: dict[int, tuple[str, int]] = {}
        with self._store_lock:
            for res in self.store.resources(cluster.id, live_only=True):
                m = res.meta
                if res.kind == "instance" and res.status == "creating" and m.get("rank") in ranks \
                        and m.get("zone") == zone:
                    out[int(m["rank"])] = (str(m["request_id"]), res.id)
            for rank in ranks:
                if rank not in out:
                    rq = str(uuid.uuid4())
                    out[rank] = (rq, self.store.record_resource(
                        cluster.id, "instance", f"{zone}/{api.instance_name(cluster.id, rank)}",
                        region=api.region_of_zone(zone), meta={"rank": rank, "zone": zone, "request_id": rq}))
        return out

    def _launch_zone(self, spec: ClusterSpec, cluster: Cluster, project: str, zone: str, body: api.NodeBody,
                     existing: dict[int, Any], made: list[str]) -> dict[int, Any]:
        missing = [r for r in range(spec.num_nodes) if r not in existing]
        if missing:
            self.report.info(f"{zone}: creating {len(missing)} {body.machine_type} node(s)"
                             + (f" ({len(existing)} already there)" if existing else ""))
        tokens = self._tokens(cluster, missing, zone)
        made_lock = threading.Lock()

        from google.cloud import compute_v1

        def one(rank: int) -> str:
            rq, rid = tokens[rank]
            name = api.instance_name(cluster.id, rank)
            labels = {**body.labels, LABEL_RANK: str(rank)}
            what = f"instances.insert {name} ({body.machine_type}, {zone})"
            try:
                try:
                    with gce(what):
                        op = self.clients.instances.insert(request=compute_v1.InsertInstanceRequest(
                            project=project, zone=zone, request_id=rq,
                            instance_resource=api.instance_body(body, name, zone, labels)))
                    with made_lock:
                        made.append(name)
                    api.wait_zone_op(self.clients, project, zone, op.name, what)
                except ProviderError as e:
                    if api.code(e) != "alreadyExists":
                        raise
                    with made_lock:
                        if name not in made:
                            made.append(name)
            except GtrainError:
                self._mark(rid, "not-created")
                raise
            self._mark(rid, "created")
            self.report.node(rank, f"{name} created in {zone}")
            return name

        if missing:
            errors: list[BaseException] = []
            with ThreadPoolExecutor(min(self._max_workers, len(missing))) as pool:
                futs = [pool.submit(one, rank) for rank in missing]
                for f in futs:
                    try:
                        f.result()
                    except BaseException as e:  # noqa: BLE001 - the first error is raised below
                        errors.append(e)
            if errors:
                caps = [e for e in errors if isinstance(e, CapacityError | QuotaError)]
                raise (caps[0] if caps else errors[0])
        names = {rank: api.instance_name(cluster.id, rank) for rank in range(spec.num_nodes)}
        return self._wait_running(project, zone, names, spec)

    def _wait_running(self, project: str, zone: str, names: dict[int, str], spec: ClusterSpec,
                      timeout: float = 900.0) -> dict[int, Any]:
        opts = gcp_options(spec.gcp)
        deadline = time.monotonic() + timeout
        delay = min(0.25, opts.poll_s)
        seen: dict[str, str] = {}
        while True:
            got: dict[int, Any] = {}
            for rank, name in names.items():
                try:
                    with gce(f"instances.get {name}"):
                        inst = self.clients.instances.get(project=project, zone=zone, instance=name)
                except ProviderError as e:
                    if not api.is_not_found(e):
                        raise
                    if spec.resources.use_spot and name in seen:  # GCE took a Spot VM back while it started
                        raise CapacityError(f"{name} was deleted while starting (Spot capacity)") from None
                    continue
                if seen.get(name) != inst.status:
                    seen[name] = inst.status
                    self.report.node(rank, f"{name} {inst.status}")
                if inst.status in ("STOPPING", "TERMINATED", "SUSPENDED"):
                    err: GtrainError = (CapacityError if spec.resources.use_spot else ProviderError)(
                        f"{name} went {inst.status} while starting")
                    raise err
                got[rank] = inst
            if len(got) == len(names) and all(i.status == "RUNNING" for i in got.values()):
                return got
            if time.monotonic() > deadline:
                raise ProviderError(f"{zone}: nodes not running after {timeout:.0f}s: "
                                    + ", ".join(f"{n} {s}" for n, s in seen.items()))
            time.sleep(delay)
            delay = min(delay * 2, opts.poll_s)

    def _record_nodes(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: GCPOptions, project: str,
                      zone: str, nodes: dict[int, Any], offer: Offer) -> None:
        spot = spec.resources.use_spot
        price = offer.price(spot)
        region = api.region_of_zone(zone)
        for rank, inst in sorted(nodes.items()):
            nic = inst.network_interfaces[0] if inst.network_interfaces else None
            private_ip = nic.network_i_p if nic else None
            public_ip = nic.access_configs[0].nat_i_p if nic and nic.access_configs else None
            meta: dict[str, Any] = {
                "launched_at": time.time(), "project": project, "region": region, "zone": zone,
                "market": "spot" if spot else "on-demand", "instance_type": offer.instance_type,
                "accelerator_type": offer.accelerator_type, "price_ondemand": offer.price_ondemand,
                "price_spot_catalog": offer.price_spot, "disk_gb": spec.resources.disk_gb, "disk_type": opts.disk_type,
                "private_ip": private_ip, "public_ip": public_ip, "spot": spot, "ssh_user": opts.ssh_user,
                "key_file": str(key_path(cluster.id)), "proxy_command": opts.ssh_proxy_command,
            }
            meta["ssh"] = dataclasses.asdict(_target(meta, inst.name))
            with self._store_lock:
                self.store.upsert_node(cluster.id, rank, status="up", address=private_ip, instance_id=inst.name,
                                       zone=zone, meta=meta)
        plan.region, plan.zone, plan.price_per_hour = region, zone, price
        with self._store_lock:
            self.store.update_cluster(cluster.id, region=region, price_per_hour=price)
        write_ssh_config(self.store, self.report, self._store_lock)

    # ---- ssh ----

    def _wait_ssh(self, cluster: Cluster, opts: GCPOptions, project: str) -> None:
        wait_ssh(cluster, self.store, self.report, self._store_lock,
                 host_keys=lambda node: self._guest_host_keys(project, node.zone or node.meta.get("zone") or "",
                                                              node.instance_id or ""),
                 host_key_wait_s=opts.host_key_wait_s, ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s,
                 max_workers=self._max_workers, key_source="the instance's guest attributes",
                 hint="check gcp.ssh_cidr / gcp.ssh_proxy_command; `gtrain down` removes them")

    def _guest_host_keys(self, project: str, zone: str, name: str) -> list[str]:
        """``keytype base64`` lines the guest environment publishes under guest attributes ``hostkeys/``
        (enabled by the ``enable-guest-attributes`` metadata gtrain sets); [] until it has."""
        try:
            with gce(f"instances.getGuestAttributes {name}"):
                # query_path is not a flattened argument of the client: it goes in the request
                ga = self.clients.instances.get_guest_attributes(request={
                    "project": project, "zone": zone, "instance": name, "query_path": "hostkeys/"})
        except ProviderError as e:
            if api.is_not_found(e):  # not published yet (the guest agent is still starting)
                return []
            raise
        items = ga.query_value.items if ga.query_value else []
        return [f"{i.key} {i.value}" for i in items
                if i.namespace == "hostkeys" and (i.key.startswith("ssh-") or i.key.startswith("ecdsa-")) and i.value]

    def runners(self, cluster: Cluster) -> list[Runner]:
        from gtrain.providers.ssh import runner_from_meta

        return [runner_from_meta(n.meta, rank=n.rank, address=n.address, cluster=cluster.name)
                for n in self.store.nodes(cluster.id)]

    # ---- describe ----

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        project = self.project(self._opts(cluster))
        by_gtrain = cluster.status in ("terminating", "terminated")
        out: list[NodeStatus] = []
        for node in self.store.nodes(cluster.id):
            zone, name = node.zone or node.meta.get("zone") or "", node.instance_id or ""
            spot = bool(node.meta.get("spot"))
            try:
                with gce(f"instances.get {name}"):
                    inst = self.clients.instances.get(project=project, zone=zone, instance=name)
            except ProviderError as e:
                if not api.is_not_found(e):
                    raise
                why = self._preempted_op(project, zone, name)
                if why or (spot and not by_gtrain and node.status not in ("terminated", "deleted")):
                    out.append(NodeStatus(node.rank, "preempted", node.address,
                                          f"{name}: {why or 'Spot VM deleted by Compute Engine'}"))
                else:
                    out.append(NodeStatus(node.rank, "missing", node.address, f"{name}: no such instance in {zone}"))
                continue
            st = inst.status
            if st in ("STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED"):
                if inst.scheduling.provisioning_model == "SPOT" and not by_gtrain:
                    out.append(NodeStatus(node.rank, "preempted", node.address, f"{name}: {st} (Spot VM stopped by "
                                          "Compute Engine)"))
                else:
                    out.append(NodeStatus(node.rank, "stopped", node.address, f"{name}: {st}"))
                continue
            mapped = {"PROVISIONING": "pending", "STAGING": "pending", "RUNNING": "running", "REPAIRING": "pending"}
            out.append(NodeStatus(node.rank, mapped.get(st, st.lower()), node.address, name))
        return out

    def _preempted_op(self, project: str, zone: str, name: str) -> str | None:
        """GCE's own record of a preemption: a zone operation of type compute.instances.preempted."""
        from google.cloud import compute_v1

        try:
            with gce("zoneOperations.list"):
                ops = list(self.clients.zone_operations.list(request=compute_v1.ListZoneOperationsRequest(
                    project=project, zone=zone, filter='operationType = "compute.instances.preempted"')))
        except ProviderError:
            return None
        for op in ops:
            if op.target_link.rstrip("/").endswith(f"/instances/{name}"):
                return f"preempted by Compute Engine at {op.insert_time or op.end_time or '?'}"
        return None

    # ---- terminate ----

    def terminate(self, cluster: Cluster) -> None:
        project = self.project(self._opts(cluster))
        known = [(n.zone or n.meta.get("zone") or "", n.instance_id or "") for n in self.store.nodes(cluster.id)
                 if n.instance_id]
        left = self.teardown(project, cluster.id, cluster=cluster, known=known)
        write_ssh_config(self.store, self.report, self._store_lock, exclude=cluster.id)
        drop_key(cluster.id)
        if left:
            raise ProviderError(f"{cluster.name}: resources of cluster {cluster.id} remain after down:\n"
                                + "\n".join(f"  - {x}" for x in left),
                                hint=f"run `gtrain down {cluster.name}` again, or `gtrain gc --provider gcp --yes`")

    # ---- price ----

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        node = next((n for n in self.store.nodes(cluster.id) if n.rank == interval.node_rank), None)
        meta: dict[str, Any] = node.meta if node is not None else {}
        rate = float(meta.get("price_spot_catalog") or interval.price_per_hour)
        spot = (rate, True, f"Spot: the catalog's estimate ${rate:g}/h (GCE publishes no Spot price history)")
        disk_type = str(meta.get("disk_type") or "pd-balanced")
        return cloud_interval_cost(interval, minimum_s=self.billing_minimum_s, spot=spot,
                                   disk_gb=float(meta.get("disk_gb") or 0),
                                   disk_usd_per_gb_month=PD_USD_PER_GB_MONTH.get(
                                       disk_type, PD_USD_PER_GB_MONTH["pd-balanced"]),
                                   disk_label=disk_type)


def _attached(offer: Offer) -> bool:
    """N1 machine types take their GPUs as guestAccelerators; accelerator-optimized ones (A2, A3, G2) have them."""
    return offer.instance_type.startswith("n1-") and bool(offer.accelerator_type)


def _target(meta: dict[str, Any], name: str) -> Any:
    from gtrain.remote.ssh import SSHTarget

    proxy = meta.get("proxy_command")
    if proxy:  # {zone} and {project} are filled in here (IAP tunnels need the zone); %h is OpenSSH's
        proxy = proxy.replace("{zone}", str(meta.get("zone") or "")).replace("{project}",
                                                                              str(meta.get("project") or ""))
    host = name if proxy else (meta.get("public_ip") or meta.get("private_ip") or "")
    return SSHTarget(host=host, port=22, user=meta.get("ssh_user") or "gtrain",
                     identity_file=meta.get("key_file"), proxy_command=proxy)

