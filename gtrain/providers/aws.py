"""The AWS provider: EC2 GPU instances (on-demand or spot), reached over SSH.

Per cluster, in one region: an ed25519 key pair generated here (private key 0600 under
``$GTRAIN_HOME/keys/``, public key imported), a security group (22 from ``aws.ssh_cidr``, all traffic from
itself for NCCL and the rendezvous), a cluster placement group for multi-node clusters, and one instance per
node (EFA interface where the catalog says the type has EFA). Every resource is tagged ``gtrain:cluster`` (the
cluster id, unique for all time), ``gtrain:cluster-name``, ``gtrain:owner``, ``gtrain:created`` and
``Name=<cluster>-<rank>``; ``down`` and ``gtrain gc`` find them by tag, so a lost state database loses nothing.

Nodes are created in parallel, one ``RunInstances`` each with a ``ClientToken`` kept in the resource ledger
before the call: a retried or resumed ``up`` gets the same instance back instead of a second one. Capacity and
quota errors move on to the next zone, then the next region; each attempt is reported, and a failed attempt
leaves nothing behind.

boto3 is imported inside functions only. The constructor takes a ``boto3.Session`` (tests register botocore
event hooks on it and point it at moto through ``AWS_ENDPOINT_URL``, which boto3 honours itself). Every
botocore exception is translated into :mod:`gtrain.errors` in :func:`_translate`, the one place that does it.

Cost: the on-demand $/h of the catalog is stored when the node starts; spot cost is read from
``describe_spot_price_history`` over the node's own running interval (the catalog's spot estimate when the
history is missing or implausible, and the report says so); EC2 bills per second with a 60-second minimum;
the root EBS volume (gp3) is added by GB-hour at :data:`EBS_GP3_USD_PER_GB_MONTH`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gtrain.errors import (
    CapacityError,
    ConfigError,
    CredentialsError,
    GtrainError,
    ProviderError,
    QuotaError,
)
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import IntervalCost, NodeStatus, Plan, Provider
from gtrain.providers.common import (
    HOURS_PER_MONTH,
    Attempts,
    billed_seconds,
    check_cidr,
    disk_cost,
    drop_key,
    ensure_key,
    key_path,
    resolve_ssh_cidr,
    ssh_notes,
    wait_ssh,
    write_ssh_config,
)
from gtrain.providers.common import owner as _owner
from gtrain.state import Cluster, CostInterval, StateStore

__all__ = ["HOURS_PER_MONTH", "AWSOptions", "AWSProvider", "aws_options", "host_keys_from_console", "key_path"]

if TYPE_CHECKING:
    from gtrain.remote.base import Runner
    from gtrain.remote.ssh import SSHRunner
    from gtrain.spec import ClusterSpec

TAG_CLUSTER = "gtrain:cluster"
TAG_CLUSTER_NAME = "gtrain:cluster-name"
TAG_OWNER = "gtrain:owner"
TAG_CREATED = "gtrain:created"
TAG_RANK = "gtrain:rank"

#: EBS gp3 storage, USD per GB-month (us-east-1/us-east-2/us-west-2 list price, 2025; eu-west-1 is 0.088).
#: gp3's baseline 3,000 IOPS and 125 MB/s are included; gtrain never asks for more. A month is 730 hours.
EBS_GP3_USD_PER_GB_MONTH = 0.08
EBS_GP3_BY_REGION = {"eu-west-1": 0.088}

#: errors that mean "not here, maybe elsewhere": try the next zone
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity", "Unsupported",
    "InsufficientReservedInstanceCapacity", "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet",
    "InsufficientCapacityOnOutpost", "UnfulfillableCapacity",
})
#: account limits, per region: try the next region
QUOTA_CODES = frozenset({
    "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "PendingVerification",
    "ResourceLimitExceeded", "MaxSpotFleetRequestCountExceeded",
})
CREDENTIAL_CODES = frozenset({
    "AuthFailure", "InvalidClientTokenId", "ExpiredToken", "RequestExpired", "SignatureDoesNotMatch",
    "UnrecognizedClientException", "InvalidAccessKeyId", "OptInRequired",
})
NOT_FOUND_SUFFIXES = (".NotFound", ".Unknown", ".Malformed")

#: newest first within each pattern; the first pattern that matches wins
DEFAULT_IMAGE_NAMES = (
    "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *",
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *",
    "Deep Learning AMI*Ubuntu*",
)
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
SPOT_IMPLAUSIBLE_FRACTION = 0.01


# ---------------------------------------------------------------------------------------------- the spec


class AWSOptions(BaseModel):
    """The ``aws:`` section of a spec."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    profile: str | None = Field(None, description="boto3 profile; endpoint from AWS_ENDPOINT_URL as boto3 does")
    ssh_cidr: str = Field("auto", description="who may reach port 22: 'auto' = this machine's public /32")
    ssh_proxy_command: str | None = Field(None, description="OpenSSH ProxyCommand, %h = instance id (SSM)")
    ssh_user: str = "ubuntu"
    wait_ssh: bool = Field(True, description="wait until every node answers over SSH")
    ssh_timeout_s: float = Field(900, gt=0)
    host_key_wait_s: float = Field(120, ge=0, description="how long to wait for host keys in the console output")
    placement_group: bool | None = Field(None, description="cluster placement group; default: multi-node only")
    efa: bool | None = Field(None, description="EFA interface; default: where the catalog says the type has it")
    image_name: list[str] | None = Field(None, description="AMI name patterns (newest match of the first used)")
    image_owner: str = "amazon"
    instance_profile: str | None = Field(None, description="IAM instance profile name or ARN for the nodes")
    tags: dict[str, str] = Field(default_factory=dict)
    poll_s: float = Field(2.0, gt=0, le=60)

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        return check_cidr(v)

    @field_validator("ssh_proxy_command")
    @classmethod
    def _proxy(cls, v: str | None) -> str | None:
        if v is not None and "%h" not in v:
            raise ValueError("must contain %h (the instance id), e.g. "
                             "'aws ssm start-session --target %h --document-name AWS-StartSSHSession'")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k.startswith(("gtrain:", "aws:")) or k == "Name":
                raise ValueError(f"tag {k!r} is set by gtrain or AWS; pick another key")
        return v


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
    aws: AWSOptions = Field(default_factory=lambda: AWSOptions())


def aws_options(section: dict[str, Any] | None) -> AWSOptions:
    """Validate the spec's ``aws:`` section; a ConfigError names the field (``aws.ssh_cidr``)."""
    from gtrain.spec import translate_validation_error

    try:
        return _Section.model_validate({"aws": section or {}}).aws
    except ValidationError as e:
        raise translate_validation_error(e, _Section) from None


# ---------------------------------------------------------------------------------------------- errors


def _translate(e: BaseException, what: str) -> GtrainError:
    """The one place botocore exceptions become gtrain errors."""
    import botocore.exceptions as bx
    from botocore.parsers import ResponseParserError

    if isinstance(e, GtrainError):
        return e
    if isinstance(e, bx.ProfileNotFound):
        return ConfigError(f"aws.profile: {e}", hint="`aws configure list-profiles` lists them", field="aws.profile")
    if isinstance(e, bx.NoCredentialsError | bx.PartialCredentialsError | bx.NoAuthTokenError):
        return CredentialsError(f"{what}: no AWS credentials ({e})",
                                hint="set aws.profile in the spec, AWS_PROFILE, or AWS_ACCESS_KEY_ID/SECRET")
    if isinstance(e, bx.ClientError):
        err = e.response.get("Error", {}) if isinstance(e.response, dict) else {}
        code = str(err.get("Code") or "Unknown")
        msg = str(err.get("Message") or e)
        text = f"{what}: {code}: {msg}"
        if code in CAPACITY_CODES:
            ce = CapacityError(text)
            ce.code = code  # type: ignore[attr-defined]
            return ce
        if code in QUOTA_CODES:
            qe = QuotaError(text, hint="ask AWS for a higher quota (Service Quotas: 'Running On-Demand/Spot "
                                       "... instances'), or use another region")
            qe.code = code  # type: ignore[attr-defined]
            return qe
        if code in CREDENTIAL_CODES:
            return CredentialsError(text, hint="check the profile / keys, and that the region is enabled")
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            return CredentialsError(text, hint="the IAM identity lacks this EC2 permission; see docs/providers/aws.md")
        if code.startswith("InvalidAMIID"):
            return ConfigError(text, hint="check resources.image_id (AMIs are per region)", field="resources.image_id")
        pe = ProviderError(text)
        pe.code = code  # type: ignore[attr-defined]
        return pe
    if isinstance(e, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return ProviderError(f"{what}: cannot reach the EC2 endpoint ({e})",
                             hint="check the network / AWS_ENDPOINT_URL")
    if isinstance(e, ResponseParserError):
        pe = ProviderError(f"{what}: the endpoint sent an unreadable answer ({str(e).splitlines()[0][:200]})")
        pe.code = "UnreadableResponse"  # type: ignore[attr-defined]
        return pe
    if isinstance(e, bx.BotoCoreError):
        return ProviderError(f"{what}: {e}")
    return ProviderError(f"{what}: {type(e).__name__}: {e}")


def _code(e: BaseException) -> str:
    return str(getattr(e, "code", "") or "")


def _is_not_found(e: BaseException) -> bool:
    c = _code(e)
    return c.endswith(NOT_FOUND_SUFFIXES) or c in ("InvalidKeyPair.NotFound", "InvalidGroup.NotFound")


@contextlib.contextmanager
def _aws(what: str) -> Iterator[None]:
    import botocore.exceptions as bx
    from botocore.parsers import ResponseParserError

    try:
        yield
    except (bx.BotoCoreError, bx.ClientError, ResponseParserError) as e:
        raise _translate(e, what) from None


# ---------------------------------------------------------------------------------------------- helpers


def _tags(d: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in d.items()]


def _tagdict(obj: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in obj.get("Tags") or []}


def _epoch(t: Any) -> float:
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return t.timestamp()
    return float(t)


def resource_name(cluster_id: str) -> str:
    """Key pair, security group and placement group name of a cluster."""
    return f"gtrain-{cluster_id}"


HOST_KEYS_RE = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S)


def host_keys_from_console(text: str) -> list[str]:
    """``keytype base64`` lines cloud-init prints between the SSH HOST KEY KEYS markers."""
    out: list[str] = []
    for block in HOST_KEYS_RE.findall(text or ""):
        for line in block.splitlines():
            parts = line.split()
            if len(parts) >= 2 and (parts[0].startswith("ssh-") or parts[0].startswith("ecdsa-")):
                out.append(f"{parts[0]} {parts[1]}")
    return out


@dataclass
class _Region:
    """What provisioning made (or found) in one region."""

    name: str
    key_name: str = ""
    sg_id: str = ""
    pg_name: str | None = None
    image_id: str = ""
    root_device: str = "/dev/sda1"
    subnets: dict[str, str] = field(default_factory=dict)  # zone -> default subnet
    created: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, ref, ledger id) made by this call


@dataclass
class _Target:
    region: str
    zones: list[str] | None  # None: every zone that offers the type


# ---------------------------------------------------------------------------------------------- provider


class AWSProvider(Provider):
    name = "aws"
    billing_minimum_s = 60.0

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, session: Any = None,
                 client_config: Any = None, max_workers: int = 32) -> None:
        super().__init__(store, report)
        self._session = session
        self._client_config = client_config
        self._clients: dict[tuple[str, str | None], Any] = {}
        self._sessions: dict[str | None, Any] = {}
        self._lock = threading.Lock()
        self._store_lock = threading.RLock()  # one sqlite connection: one writer at a time
        self._max_workers = max_workers
        self._spot_cache: dict[tuple[Any, ...], list[tuple[float, float]]] = {}

    # ---- clients ----

    def ec2(self, region: str, profile: str | None = None) -> Any:
        """A thread-safe EC2 client for ``region`` (made once, under a lock: sessions are not thread-safe)."""
        key = (region, profile)
        with self._lock:
            c = self._clients.get(key)
            if c is None:
                from botocore.config import Config

                cfg = self._client_config or Config(
                    retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=64,
                    connect_timeout=10, read_timeout=60,
                )
                with _aws("creating the EC2 client"):
                    c = self._get_session(profile).client("ec2", region_name=region, config=cfg)
                self._clients[key] = c
            return c

    def _get_session(self, profile: str | None) -> Any:
        if self._session is not None:
            return self._session
        s = self._sessions.get(profile)
        if s is None:
            import boto3

            s = boto3.Session(profile_name=profile) if profile else boto3.Session()
            self._sessions[profile] = s
        return s

    def _profile(self, cluster: Cluster) -> str | None:
        section = cluster.spec.get("aws") or {}
        return section.get("profile") if isinstance(section, dict) else None

    # ---- plan ----

    def plan(self, spec: ClusterSpec) -> Plan:
        from gtrain.catalog import lookup, resolve

        opts = aws_options(spec.aws)
        res = spec.resources
        market = "spot" if res.use_spot else "on-demand"
        regions = res.region_list()
        if res.regions and res.region and res.region not in res.regions:
            raise ConfigError(f"resources.region: {res.region!r} is not in resources.regions",
                              hint="give one or the other", field="resources.region")
        first = regions[0] if regions else None
        field_name = "resources.regions[0]" if res.regions else "resources.region"
        try:
            offer = resolve("aws", res.accelerators, res.instance_type, first, res.use_spot)
        except ConfigError as e:
            if e.field == "resources.region" and res.regions:
                e.field = field_name
                e.message = e.message.replace("resources.region:", f"{field_name}:", 1)
            raise
        if not regions:
            # no region asked for: the cheapest first, then every other catalog region with the type
            regions = [o.region for o in sorted(lookup("aws", offer.instance_type),
                                                key=lambda o: (o.price(res.use_spot), o.region))]
        for i, r in enumerate(regions):
            if not lookup("aws", offer.instance_type, r):
                where = sorted({o.region for o in lookup("aws", offer.instance_type)})
                raise ConfigError(
                    f"resources.regions[{i}]: {offer.instance_type} is not offered in {r}; "
                    f"it is in {', '.join(where)}", hint="drop that region or pick another type",
                    field=f"resources.regions[{i}]",
                )
        zones = list(res.zones or [])
        for i, z in enumerate(zones):
            if not any(z.startswith(r) and len(z) > len(r) for r in regions):
                raise ConfigError(f"resources.zones[{i}]: {z!r} is not a zone of {', '.join(regions)}",
                                  hint="zones are the region name plus a letter, e.g. us-east-1a",
                                  field=f"resources.zones[{i}]")
        price_offer = lookup("aws", offer.instance_type, regions[0])[0]
        notes = [f"{offer.vcpus} vCPUs, {offer.memory_gib:g} GiB, {offer.gpu_count}x {offer.gpu_name} "
                 f"{offer.gpu_memory_gib:g} GB" + (", EFA" if self._efa(opts, price_offer.efa) else "")]
        if res.use_spot:
            notes.append(f"spot $/h is the catalog's estimate (on-demand {price_offer.price_ondemand:g} $/h); the "
                         "cost report reads the spot price history over each node's running time")
        notes.append(f"plus EBS gp3 {res.disk_gb} GB per node at ${self._ebs_rate(regions[0]):g}/GB-month")
        if len(regions) > 1:
            notes.append(f"on no capacity: next zone, then {', '.join(regions[1:])}")
        notes += ssh_notes(opts.ssh_cidr, opts.ssh_proxy_command, "aws")
        return Plan(
            provider="aws", num_nodes=spec.num_nodes, instance_type=offer.instance_type, market=market,
            region=regions[0], zone=zones[0] if zones else None, gpu_name=offer.gpu_name,
            gpus_per_node=offer.gpu_count, price_per_hour=price_offer.price(res.use_spot),
            max_hours=spec.policies.max_hours, notes=notes,
        )

    @staticmethod
    def _efa(opts: AWSOptions, catalog_efa: bool) -> bool:
        return catalog_efa if opts.efa is None else opts.efa

    @staticmethod
    def _ebs_rate(region: str | None) -> float:
        return EBS_GP3_BY_REGION.get(region or "", EBS_GP3_USD_PER_GB_MONTH)

    def _targets(self, spec: ClusterSpec, plan: Plan) -> list[_Target]:
        from gtrain.catalog import lookup

        regions = spec.resources.region_list() or [
            o.region for o in sorted(lookup("aws", plan.instance_type or ""),
                                     key=lambda o: (o.price(spec.resources.use_spot), o.region))]
        zones = spec.resources.zones
        out = []
        for r in regions:
            zs = [z for z in zones if z.startswith(r)] if zones else None
            if zs == []:
                continue
            out.append(_Target(r, zs))
        return out

    # ---- the ledger (one writer at a time) ----

    def _record(self, cluster: Cluster, kind: str, ref: str, region: str, meta: dict[str, Any] | None = None) -> int:
        with self._store_lock:
            return self.store.record_resource(cluster.id, kind, ref, region=region, meta=meta)

    def _mark(self, rid: int, status: str, **kw: Any) -> None:
        with self._store_lock:
            self.store.mark_resource(rid, status, **kw)

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        from gtrain.catalog import lookup

        opts = aws_options(spec.aws)
        itype = plan.instance_type or ""
        targets = self._targets(spec, plan)
        ssh_cidr = resolve_ssh_cidr(opts.ssh_cidr, opts.ssh_proxy_command, "aws", " (SSM)")
        # a resumed `up`: the nodes already there pin the region and zone (a placement group is one zone)
        existing: dict[int, dict[str, Any]] = {}
        for t in targets:
            found = self._find_instances(t.region, cluster.id, opts.profile)
            if found:
                zone = found[0]["Placement"]["AvailabilityZone"]
                targets = [_Target(t.region, [zone])]
                for inst in found:
                    rank = int(_tagdict(inst).get(TAG_RANK, "-1"))
                    if 0 <= rank < spec.num_nodes and inst["Placement"]["AvailabilityZone"] == zone:
                        existing[rank] = inst
                self.report.info(f"found {len(existing)} of {spec.num_nodes} node(s) of {cluster.name} in {zone}")
                break
        attempts = Attempts()
        for t in targets:
            offer = lookup("aws", itype, t.region)
            if not offer:
                attempts.add(t.region, f"{itype} not in the catalog for this region")
                continue
            od_price, spot_price, efa = offer[0].price_ondemand, offer[0].price_spot, self._efa(opts, offer[0].efa)
            reg = _Region(t.region)
            try:
                self._region_setup(spec, cluster, opts, reg, ssh_cidr, itype, t.zones)
            except (CapacityError, QuotaError) as e:
                attempts.add(t.region, e)
                self._undo_region(cluster, reg, opts)
                continue
            except BaseException:
                self._undo_region(cluster, reg, opts)
                raise
            zones = t.zones or list(reg.subnets)
            if not zones:
                attempts.add(t.region, f"no zone with a default subnet offers {itype}")
                self._undo_region(cluster, reg, opts)
                continue
            for zone in zones:
                made: list[str] = []
                try:
                    nodes = self._launch_zone(spec, cluster, opts, reg, zone, itype, efa, existing, made)
                except (CapacityError, QuotaError) as e:
                    attempts.add(f"{t.region}/{zone}", e)
                    self.report.warn(f"{zone}: {e.message}; "
                                     + ("trying the next region" if isinstance(e, QuotaError) else "trying elsewhere"))
                    self._terminate_ids(cluster, t.region, made, opts.profile)
                    if isinstance(e, QuotaError):
                        break
                    continue
                self._record_nodes(spec, cluster, plan, opts, reg, zone, nodes, od_price, spot_price)
                if opts.wait_ssh:
                    self._wait_ssh(cluster, opts)
                return
            self._undo_region(cluster, reg, opts)
        what = f"{spec.num_nodes}x {itype} ({plan.market})"
        if not existing:  # nothing of this cluster runs anywhere: its local key goes too
            drop_key(cluster.id)
        attempts.fail(what, quota_hint="request a quota increase, or add resources.regions",
                      capacity_hint="add zones or regions (resources.zones / resources.regions), try on-demand, "
                                    "or fewer nodes; nothing was left running")

    def _undo_region(self, cluster: Cluster, reg: _Region, opts: AWSOptions) -> None:
        """A region that gave nothing: delete what this cluster has there, unless nodes of it run there."""
        if not reg.created:
            return
        try:
            if self._find_instances(reg.name, cluster.id, opts.profile):
                return
            left = self.teardown(reg.name, cluster.id, opts.profile, cluster=cluster)
        except GtrainError as e:
            self.report.warn(f"{reg.name}: could not clean up after the failed attempt: {e.message}")
            return
        if left:
            self.report.warn(f"{reg.name}: left after the failed attempt: {', '.join(left)}")

    def _find_instances(self, region: str, cluster_id: str, profile: str | None,
                        states: list[str] | None = None) -> list[dict[str, Any]]:
        ec2 = self.ec2(region, profile)
        out: list[dict[str, Any]] = []
        with _aws(f"{region}: describe_instances"):
            for page in ec2.get_paginator("describe_instances").paginate(Filters=[
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]},
                {"Name": "instance-state-name", "Values": states or LIVE_STATES},
            ]):
                for r in page["Reservations"]:
                    out.extend(r["Instances"])
        return out

    def _base_tags(self, cluster: Cluster, opts: AWSOptions, name: str) -> dict[str, str]:
        created = cluster.extra.get("aws_created") or dt.datetime.fromtimestamp(
            cluster.created_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {**opts.tags, TAG_CLUSTER: cluster.id, TAG_CLUSTER_NAME: cluster.name, TAG_OWNER: _owner(),
                TAG_CREATED: created, "Name": name}

    def _region_setup(self, spec: ClusterSpec, cluster: Cluster, opts: AWSOptions, reg: _Region,
                      ssh_cidr: str | None, itype: str, zones: list[str] | None) -> None:
        ec2 = self.ec2(reg.name, opts.profile)
        name = resource_name(cluster.id)
        tags = self._base_tags(cluster, opts, name)
        want_pg = opts.placement_group if opts.placement_group is not None else spec.num_nodes > 1
        with ThreadPoolExecutor(5) as pool:  # independent calls, in parallel
            f_img = pool.submit(self._image, ec2, reg.name, spec, opts)
            f_sub = pool.submit(self._subnets, ec2, reg.name, itype, zones)
            f_key = pool.submit(self._ensure_key, ec2, cluster, reg, tags)
            f_sg = pool.submit(self._ensure_sg, ec2, cluster, reg, tags, ssh_cidr)
            futs: list[Future[Any]] = [f_key, f_sg, f_img, f_sub]
            if want_pg:
                futs.append(pool.submit(self._ensure_pg, ec2, cluster, reg, tags, opts.placement_group is True))
            errs = []
            for f in futs:
                try:
                    f.result()
                except BaseException as e:  # noqa: BLE001 - re-raised below, after every future settled
                    errs.append(e)
            if errs:
                raise errs[0]
        reg.image_id, reg.root_device = f_img.result()
        reg.subnets = f_sub.result()

    def _image(self, ec2: Any, region: str, spec: ClusterSpec, opts: AWSOptions) -> tuple[str, str]:
        if spec.resources.image_id:
            try:
                with _aws(f"{region}: describe_images {spec.resources.image_id}"):
                    imgs = ec2.describe_images(ImageIds=[spec.resources.image_id])["Images"]
            except GtrainError as err:
                if not (_is_not_found(err) or isinstance(err, ConfigError)):
                    raise
                imgs = []
            if not imgs:
                raise ConfigError(f"resources.image_id: {spec.resources.image_id} does not exist in {region}",
                                  hint="AMI ids are per region; leave image_id unset for the newest Deep Learning AMI",
                                  field="resources.image_id")
            return imgs[0]["ImageId"], imgs[0].get("RootDeviceName") or "/dev/sda1"
        patterns = opts.image_name or list(DEFAULT_IMAGE_NAMES)
        with _aws(f"{region}: describe_images"):
            imgs = ec2.describe_images(Owners=[opts.image_owner], Filters=[
                {"Name": "name", "Values": patterns}, {"Name": "state", "Values": ["available"]},
                {"Name": "architecture", "Values": ["x86_64"]},
            ])["Images"]
        if not imgs:
            raise ConfigError(f"resources.image_id: no AMI named like {' | '.join(patterns)} "
                              f"(owner {opts.image_owner}) in {region}",
                              hint="set resources.image_id, or aws.image_name", field="resources.image_id")

        def rank(img: dict[str, Any]) -> tuple[int, str]:
            idx = next((i for i, p in enumerate(patterns) if _glob(p, img.get("Name", ""))), len(patterns))
            return (idx, "".join(chr(0x10FFFF - ord(c)) for c in img.get("CreationDate", "")))

        best = min(imgs, key=rank)
        return best["ImageId"], best.get("RootDeviceName") or "/dev/sda1"

    def _subnets(self, ec2: Any, region: str, itype: str, zones: list[str] | None) -> dict[str, str]:
        with _aws(f"{region}: describe_subnets"):
            subs = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
        by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subs}
        if zones:
            missing = [z for z in zones if z not in by_zone]
            if missing:
                raise ConfigError(f"resources.zones: no default subnet in {', '.join(missing)}",
                                  hint="gtrain uses the default VPC; `aws ec2 create-default-subnet "
                                       "--availability-zone ZONE` makes one", field="resources.zones")
            return {z: by_zone[z] for z in zones}
        with _aws(f"{region}: describe_instance_type_offerings"):
            offered = {o["Location"] for o in ec2.describe_instance_type_offerings(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [itype]}])["InstanceTypeOfferings"]}
        return {z: s for z, s in sorted(by_zone.items()) if z in offered}

    def _ensure_key(self, ec2: Any, cluster: Cluster, reg: _Region, tags: dict[str, str]) -> None:
        name = resource_name(cluster.id)
        path = key_path(cluster.id)
        pub = ensure_key(cluster.id)
        with _aws(f"{reg.name}: describe_key_pairs"):
            have = ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [name]}])["KeyPairs"]
        if have:
            reg.key_name = name
            return
        rid = self._record(cluster, "key-pair", name, reg.name)
        with _aws(f"{reg.name}: import_key_pair"):
            kp = ec2.import_key_pair(KeyName=name, PublicKeyMaterial=pub.encode(),
                                     TagSpecifications=[{"ResourceType": "key-pair", "Tags": _tags(tags)}])
        self._mark(rid, "created", meta={"key_pair_id": kp.get("KeyPairId"), "path": str(path)})
        reg.key_name = name
        reg.created.append(("key-pair", name, rid))

    def _ensure_sg(self, ec2: Any, cluster: Cluster, reg: _Region, tags: dict[str, str], ssh_cidr: str | None) -> None:
        name = resource_name(cluster.id)
        with _aws(f"{reg.name}: describe_vpcs"):
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise ConfigError(f"resources.region: {reg.name} has no default VPC",
                              hint="`aws ec2 create-default-vpc --region REGION` makes one", field="resources.region")
        vpc = vpcs[0]["VpcId"]
        with _aws(f"{reg.name}: describe_security_groups"):
            have = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]},
                                                         {"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]
        if have:
            reg.sg_id = have[0]["GroupId"]
            return
        rid = self._record(cluster, "security-group", name, reg.name)
        with _aws(f"{reg.name}: create_security_group"):
            sg = ec2.create_security_group(
                GroupName=name, Description=f"gtrain cluster {cluster.id}", VpcId=vpc,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": _tags(tags)}])["GroupId"]
        self._mark(rid, "created", ref=sg, meta={"name": name, "vpc": vpc})
        reg.sg_id = sg
        reg.created.append(("security-group", sg, rid))
        perms: list[dict[str, Any]] = [{"IpProtocol": "-1", "UserIdGroupPairs": [
            {"GroupId": sg, "Description": "all traffic inside the cluster (NCCL, rendezvous)"}]}]
        if ssh_cidr:
            rng = "Ipv6Ranges" if ":" in ssh_cidr else "IpRanges"
            key = "CidrIpv6" if ":" in ssh_cidr else "CidrIp"
            perms.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                          rng: [{key: ssh_cidr, "Description": "gtrain ssh"}]})
        with _aws(f"{reg.name}: authorize_security_group_ingress"):
            ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=perms)

    def _ensure_pg(self, ec2: Any, cluster: Cluster, reg: _Region, tags: dict[str, str], required: bool) -> None:
        name = resource_name(cluster.id)
        rid = self._record(cluster, "placement-group", name, reg.name)
        try:
            with _aws(f"{reg.name}: create_placement_group"):
                ec2.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=[
                    {"ResourceType": "placement-group", "Tags": _tags(tags)}])
        except ProviderError as e:
            if _code(e) == "InvalidPlacementGroup.Duplicate":
                self._mark(rid, "deleted")  # made by an earlier run; that run's ledger row owns it
                reg.pg_name = name
                return
            self._mark(rid, "deleted")
            if required or isinstance(e, CredentialsError | QuotaError):
                raise
            self.report.warn(f"{reg.name}: no cluster placement group ({e.message}); nodes may land farther apart")
            return
        self._mark(rid, "created")
        reg.pg_name = name
        reg.created.append(("placement-group", name, rid))

    def _tokens(self, cluster: Cluster, ranks: list[int], region: str, zone: str) -> dict[int, tuple[str, int]]:
        """The ClientToken (and ledger row) of each node's RunInstances in this zone, recorded before the call.
        A row still 'creating' (a crash between the request and its answer) is reused, so AWS answers with the
        instance it made then instead of making a second one."""
        out: dict[int, tuple[str, int]] = {}
        with self._store_lock:
            for res in self.store.resources(cluster.id, live_only=True):
                m = res.meta
                if res.kind == "instance" and res.status == "creating" and m.get("rank") in ranks \
                        and m.get("zone") == zone and res.region == region:
                    out[int(m["rank"])] = (str(m["token"]), res.id)
            for rank in ranks:
                if rank not in out:
                    token = uuid.uuid4().hex
                    out[rank] = (token, self.store.record_resource(
                        cluster.id, "instance", f"token:{token}", region=region,
                        meta={"rank": rank, "zone": zone, "token": token}))
        return out

    def _launch_zone(self, spec: ClusterSpec, cluster: Cluster, opts: AWSOptions, reg: _Region, zone: str,
                     itype: str, efa: bool, existing: dict[int, dict[str, Any]], made: list[str]
                     ) -> dict[int, dict[str, Any]]:
        ec2 = self.ec2(reg.name, opts.profile)
        missing = [r for r in range(spec.num_nodes) if r not in existing]
        if missing:
            self.report.info(f"{reg.name}/{zone}: creating {len(missing)} {itype} node(s)"
                             + (f" ({len(existing)} already there)" if existing else ""))
        made_lock = threading.Lock()
        tokens = self._tokens(cluster, missing, reg.name, zone)

        def one(rank: int) -> dict[str, Any]:
            token, rid = tokens[rank]
            tags = self._base_tags(cluster, opts, f"{cluster.name}-{rank}")
            tags[TAG_RANK] = str(rank)
            nic: dict[str, Any] = {"DeviceIndex": 0, "Groups": [reg.sg_id], "SubnetId": reg.subnets[zone],
                                   "AssociatePublicIpAddress": True, "DeleteOnTermination": True}
            if efa:
                nic["InterfaceType"] = "efa"
            params: dict[str, Any] = dict(
                ImageId=reg.image_id, InstanceType=itype, MinCount=1, MaxCount=1, KeyName=reg.key_name,
                ClientToken=token, NetworkInterfaces=[nic],
                Placement={"AvailabilityZone": zone, **({"GroupName": reg.pg_name} if reg.pg_name else {})},
                BlockDeviceMappings=[{"DeviceName": reg.root_device, "Ebs": {
                    "VolumeSize": spec.resources.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": True,
                    "Encrypted": True}}],
                TagSpecifications=[{"ResourceType": rt, "Tags": _tags(tags)}
                                   for rt in ("instance", "volume", "network-interface")],
                MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
                InstanceInitiatedShutdownBehavior="terminate",
            )
            if spec.resources.use_spot:
                params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                    "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
            if opts.instance_profile:
                key = "Arn" if opts.instance_profile.startswith("arn:") else "Name"
                params["IamInstanceProfile"] = {key: opts.instance_profile}
            try:
                with _aws(f"run_instances ({itype}, {zone})"):
                    inst = ec2.run_instances(**params)["Instances"][0]
            except GtrainError:
                self._mark(rid, "deleted")  # nothing was made
                raise
            with made_lock:
                made.append(inst["InstanceId"])
            self._mark(rid, "created", ref=inst["InstanceId"])
            self.report.node(rank, f"{inst['InstanceId']} requested in {zone}")
            return inst

        new: dict[int, dict[str, Any]] = {}
        if missing:
            errors: list[BaseException] = []
            with ThreadPoolExecutor(min(self._max_workers, len(missing))) as pool:
                futs = {rank: pool.submit(one, rank) for rank in missing}
                for rank, f in futs.items():
                    try:
                        new[rank] = f.result()
                    except BaseException as e:  # noqa: BLE001 - the first error is raised below
                        errors.append(e)
            if errors:
                caps = [e for e in errors if isinstance(e, CapacityError | QuotaError)]
                raise (caps[0] if caps else errors[0])
        ids = {rank: inst["InstanceId"] for rank, inst in {**existing, **new}.items()}
        return self._wait_running(reg.name, opts, ids)

    def _wait_running(self, region: str, opts: AWSOptions, ids: dict[int, str],
                      timeout: float = 900.0) -> dict[int, dict[str, Any]]:
        ec2 = self.ec2(region, opts.profile)
        deadline = time.monotonic() + timeout
        delay = min(0.5, opts.poll_s)
        seen: dict[str, str] = {}
        rank_of = {iid: rank for rank, iid in ids.items()}
        while True:
            try:
                with _aws(f"{region}: describe_instances"):
                    insts = [i for r in ec2.describe_instances(InstanceIds=list(ids.values()))["Reservations"]
                             for i in r["Instances"]]
            except ProviderError as e:
                if not _is_not_found(e):  # a just-made instance can be invisible for a moment
                    raise
                insts = []
            by_id = {i["InstanceId"]: i for i in insts}
            for iid, inst in by_id.items():
                st = inst["State"]["Name"]
                if seen.get(iid) != st:
                    seen[iid] = st
                    self.report.node(rank_of[iid], f"{iid} {st}")
                if st in ("shutting-down", "terminated", "stopping", "stopped"):
                    reason = inst.get("StateReason", {})
                    code = str(reason.get("Code", ""))
                    msg = f"{iid} went {st} while starting: {reason.get('Message') or code or 'no reason given'}"
                    if "Capacity" in code or "Spot" in code or "Insufficient" in code:
                        cap = CapacityError(msg)
                        cap.code = code  # type: ignore[attr-defined]
                        raise cap
                    raise ProviderError(msg)
            if len(by_id) == len(ids) and all(i["State"]["Name"] == "running" for i in by_id.values()):
                return {rank_of[iid]: inst for iid, inst in by_id.items()}
            if time.monotonic() > deadline:
                raise ProviderError(f"{region}: nodes not running after {timeout:.0f}s: "
                                    + ", ".join(f"{i} {s}" for i, s in seen.items()))
            time.sleep(delay)
            delay = min(delay * 2, opts.poll_s)

    def _record_nodes(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: AWSOptions, reg: _Region,
                      zone: str, nodes: dict[int, dict[str, Any]], od_price: float, spot_price: float) -> None:
        market = "spot" if spec.resources.use_spot else "on-demand"
        price = spot_price if spec.resources.use_spot else od_price
        for rank, inst in sorted(nodes.items()):
            meta = {
                "launched_at": _epoch(inst.get("LaunchTime") or time.time()), "region": reg.name, "zone": zone,
                "market": market, "instance_type": inst["InstanceType"], "price_ondemand": od_price,
                "price_spot_catalog": spot_price, "disk_gb": spec.resources.disk_gb,
                "private_ip": inst.get("PrivateIpAddress"), "public_ip": inst.get("PublicIpAddress"),
                "lifecycle": inst.get("InstanceLifecycle") or "normal", "ssh_user": opts.ssh_user,
                "key_file": str(key_path(cluster.id)), "proxy_command": opts.ssh_proxy_command,
            }
            meta["ssh"] = dataclasses.asdict(self._target(meta, inst["InstanceId"]))
            with self._store_lock:
                self.store.upsert_node(cluster.id, rank, status="up", address=inst.get("PrivateIpAddress"),
                                       instance_id=inst["InstanceId"], zone=zone, meta=meta)
        # the region/zone that had capacity may not be the plan's first choice: the plan and the cluster say
        # where the nodes are and what they cost (core opens the cost intervals from this plan)
        plan.region, plan.zone, plan.price_per_hour = reg.name, zone, price
        with self._store_lock:
            self.store.update_cluster(cluster.id, region=reg.name, price_per_hour=price)
        self._write_ssh_config()

    def _write_ssh_config(self, exclude: str | None = None) -> None:
        write_ssh_config(self.store, self.report, self._store_lock, exclude)

    # ---- ssh ----

    def _target(self, node_meta: dict[str, Any], instance_id: str) -> Any:
        from gtrain.remote.ssh import SSHTarget

        proxy = node_meta.get("proxy_command")
        host = instance_id if proxy else (node_meta.get("public_ip") or node_meta.get("private_ip") or "")
        return SSHTarget(host=host, port=22, user=node_meta.get("ssh_user") or "ubuntu",
                         identity_file=node_meta.get("key_file"), proxy_command=proxy)

    def _wait_ssh(self, cluster: Cluster, opts: AWSOptions) -> None:
        nodes = self.store.nodes(cluster.id)
        region = nodes[0].meta.get("region") if nodes else cluster.region
        ec2 = self.ec2(region or "", opts.profile)
        wait_ssh(cluster, self.store, self.report, self._store_lock,
                 host_keys=lambda node: self._console_keys(ec2, node.instance_id or ""),
                 host_key_wait_s=opts.host_key_wait_s, ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s,
                 max_workers=self._max_workers, key_source="the console output",
                 hint="check aws.ssh_cidr / aws.ssh_proxy_command; `gtrain down` removes them")

    def _console_keys(self, ec2: Any, iid: str) -> list[str]:
        for latest in (True, False):
            try:
                with _aws("get_console_output"):
                    out = ec2.get_console_output(InstanceId=iid, **({"Latest": True} if latest else {}))
            except ProviderError:
                continue
            keys = host_keys_from_console(str(out.get("Output") or ""))
            if keys:
                return keys
            return []
        return []

    def runners(self, cluster: Cluster) -> list[Runner]:
        from gtrain.remote.ssh import SSHRunner

        out: list[Runner] = []
        for node in self.store.nodes(cluster.id):
            target = self._target(node.meta, node.instance_id or "")
            r: SSHRunner = SSHRunner(target, cluster=cluster.name, label=f"node {node.rank} ({node.instance_id})",
                                     address=node.address or node.meta.get("private_ip") or target.host)
            out.append(r)
        return out

    # ---- describe ----

    def _regions_of(self, cluster: Cluster) -> list[str]:
        regions: list[str] = []

        def add(r: Any) -> None:
            if isinstance(r, str) and r and r not in regions:
                regions.append(r)

        add(cluster.region)
        for n in self.store.nodes(cluster.id):
            add(n.meta.get("region"))
        for res in self.store.resources(cluster.id):
            add(res.region)
        res_spec = cluster.spec.get("resources") or {}
        add(res_spec.get("region"))
        for r in res_spec.get("regions") or []:
            add(r)
        return regions

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        profile = self._profile(cluster)
        nodes = {n.rank: n for n in self.store.nodes(cluster.id)}
        found: dict[int, dict[str, Any]] = {}
        for region in self._regions_of(cluster):
            for inst in self._find_instances(region, cluster.id, profile, states=[*LIVE_STATES, "terminated"]):
                rank = int(_tagdict(inst).get(TAG_RANK, "-1"))
                node = nodes.get(rank)
                if node is not None and node.instance_id and inst["InstanceId"] != node.instance_id:
                    continue  # an older instance of that rank (a failed zone)
                found[rank] = inst
        out = []
        for rank in sorted(set(nodes) | set(found)):
            node = nodes.get(rank)
            got = found.get(rank)
            if got is None:
                out.append(NodeStatus(rank, "missing", node.address if node else None,
                                      "no instance tagged with this cluster and rank"))
                continue
            out.append(self._node_status(rank, got, node.address if node else None,
                                         by_gtrain=cluster.status in ("terminating", "terminated")
                                         or (node is not None and node.status in ("terminated", "deleted"))))
        return out

    @staticmethod
    def _node_status(rank: int, inst: dict[str, Any], address: str | None, by_gtrain: bool) -> NodeStatus:
        state = inst["State"]["Name"]
        reason = inst.get("StateReason") or {}
        code = str(reason.get("Code") or "")
        why = reason.get("Message") or inst.get("StateTransitionReason") or ""
        spot = inst.get("InstanceLifecycle") == "spot"
        addr = address or inst.get("PrivateIpAddress")
        if state in ("shutting-down", "terminated"):
            if code.startswith("Server.SpotInstance") or (spot and not by_gtrain):
                return NodeStatus(rank, "preempted", addr, f"{inst['InstanceId']}: {why or code}".strip())
            return NodeStatus(rank, "terminated", addr, f"{inst['InstanceId']}: {why or code}".strip())
        mapped = {"pending": "pending", "running": "running", "stopping": "stopped", "stopped": "stopped"}
        return NodeStatus(rank, mapped.get(state, state), addr, inst["InstanceId"])

    # ---- terminate ----

    def terminate(self, cluster: Cluster) -> None:
        profile = self._profile(cluster)
        ids_by_region: dict[str, set[str]] = {}
        for n in self.store.nodes(cluster.id):
            if n.instance_id and n.meta.get("region"):
                ids_by_region.setdefault(n.meta["region"], set()).add(n.instance_id)
        left: list[str] = []
        for region in self._regions_of(cluster):
            left += self.teardown(region, cluster.id, profile, known_ids=ids_by_region.get(region, set()),
                                  cluster=cluster)
        self._write_ssh_config(exclude=cluster.id)
        drop_key(cluster.id)
        if left:
            raise ProviderError(f"{cluster.name}: resources tagged {TAG_CLUSTER}={cluster.id} remain after down:\n"
                                + "\n".join(f"  - {x}" for x in left),
                                hint=f"run `gtrain down {cluster.name}` again, or `gtrain gc --yes`")

    def _terminate_ids(self, cluster: Cluster | None, region: str, ids: list[str], profile: str | None) -> None:
        if not ids:
            return
        ec2 = self.ec2(region, profile)
        for i in range(0, len(ids), 500):
            try:
                with _aws(f"{region}: terminate_instances"):
                    ec2.terminate_instances(InstanceIds=ids[i:i + 500])
            except ProviderError as e:
                if not _is_not_found(e):
                    raise
                for iid in ids[i:i + 500]:  # one unknown id fails the whole call: go one by one
                    with contextlib.suppress(ProviderError), _aws(f"{region}: terminate_instances"):
                        ec2.terminate_instances(InstanceIds=[iid])
        self._wait_gone(region, ids, profile)
        if cluster is not None:
            with self._store_lock:
                for res in self.store.resources(cluster.id, live_only=True):
                    if res.kind == "instance" and res.ref in ids:
                        self.store.mark_resource(res.id, "deleted")

    def _wait_gone(self, region: str, ids: list[str], profile: str | None, timeout: float = 900.0) -> None:
        ec2 = self.ec2(region, profile)
        deadline = time.monotonic() + timeout
        delay = 0.25
        pending = list(ids)
        while pending:
            alive: list[str] = []
            for i in range(0, len(pending), 200):
                chunk = pending[i:i + 200]
                try:
                    with _aws(f"{region}: describe_instances"):
                        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
                            {"Name": "instance-id", "Values": chunk}])
                        for page in pages:
                            for r in page["Reservations"]:
                                alive += [x["InstanceId"] for x in r["Instances"]
                                          if x["State"]["Name"] != "terminated"]
                except ProviderError as e:
                    if not _is_not_found(e):
                        raise
            pending = alive
            if not pending:
                return
            if time.monotonic() > deadline:
                raise ProviderError(f"{region}: instances not terminated after {timeout:.0f}s: {', '.join(pending)}")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def teardown(self, region: str, cluster_id: str, profile: str | None, *, known_ids: set[str] | None = None,
                 cluster: Cluster | None = None) -> list[str]:
        """Delete everything tagged ``gtrain:cluster=cluster_id`` in ``region`` (plus ``known_ids``); returns
        what still exists afterwards (empty when clean). Used by ``down`` and ``gtrain gc``."""
        ec2 = self.ec2(region, profile)
        ids = {i["InstanceId"] for i in self._find_instances(region, cluster_id, profile)} | set(known_ids or ())
        if ids:
            self.report.info(f"{region}: terminating {len(ids)} instance(s)")
            self._terminate_ids(cluster, region, sorted(ids), profile)
        name = resource_name(cluster_id)
        # placement group (by its deterministic name; the API lists them by tag too)
        pgs = {name}
        with contextlib.suppress(ProviderError):
            pgs |= {p["GroupName"] for p in self._list(ec2, region, "placement-group", cluster_id)}
        for pg in sorted(pgs):
            try:
                with _aws(f"{region}: delete_placement_group {pg}"):
                    ec2.delete_placement_group(GroupName=pg)
            except ProviderError as e:
                if not (_is_not_found(e) or _code(e) in ("InvalidPlacementGroup.Unknown", "UnreadableResponse")):
                    raise
        # security groups (they can stay "in use" for a while after the instances are gone)
        sgs = {g["GroupId"] for g in self._list(ec2, region, "security-group", cluster_id)}
        with _aws(f"{region}: describe_security_groups"):
            sgs |= {g["GroupId"] for g in ec2.describe_security_groups(
                Filters=[{"Name": "group-name", "Values": [name]}])["SecurityGroups"]}
        for sg in sorted(sgs):
            self._retry_dependency(lambda sg=sg: ec2.delete_security_group(GroupId=sg),  # type: ignore[misc]
                                   f"{region}: delete_security_group {sg}")
        # key pairs
        kps = {k["KeyName"] for k in self._list(ec2, region, "key-pair", cluster_id)}
        with _aws(f"{region}: describe_key_pairs"):
            kps |= {k["KeyName"] for k in ec2.describe_key_pairs(
                Filters=[{"Name": "key-name", "Values": [name]}])["KeyPairs"]}
        for kp in sorted(kps):
            with _aws(f"{region}: delete_key_pair {kp}"):
                ec2.delete_key_pair(KeyName=kp)
        # volumes and interfaces that outlived their instance (DeleteOnTermination off, or detached)
        for v in self._list(ec2, region, "volume", cluster_id):
            if v.get("State") in ("available", "error"):
                self._retry_dependency(lambda v=v: ec2.delete_volume(VolumeId=v["VolumeId"]),  # type: ignore[misc]
                                       f"{region}: delete_volume {v['VolumeId']}")
        for ni in self._list(ec2, region, "network-interface", cluster_id):
            if ni.get("Status") == "available":
                self._retry_dependency(
                    lambda ni=ni: ec2.delete_network_interface(NetworkInterfaceId=ni["NetworkInterfaceId"]),  # type: ignore[misc]
                    f"{region}: delete_network_interface {ni['NetworkInterfaceId']}")
        if cluster is not None:
            with self._store_lock:
                for res in self.store.resources(cluster.id, live_only=True):
                    if res.region == region:
                        self.store.mark_resource(res.id, "deleted")
        return [f"{region}: {kind} {ref}" for kind, ref in self.list_tagged(region, cluster_id, profile)]

    def _retry_dependency(self, fn: Callable[[], Any], what: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        delay = 1.0
        while True:
            try:
                with _aws(what):
                    fn()
                return
            except ProviderError as e:
                if _is_not_found(e):
                    return
                if _code(e) not in ("DependencyViolation", "InvalidVolume.Busy", "IncorrectState") \
                        or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 15.0)

    def _list(self, ec2: Any, region: str, kind: str, cluster_id: str | None) -> list[dict[str, Any]]:
        """Every ``kind`` in ``region`` tagged with the cluster (any gtrain cluster when ``cluster_id`` is None)."""
        flt = ([{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}] if cluster_id
               else [{"Name": "tag-key", "Values": [TAG_CLUSTER]}])
        with _aws(f"{region}: listing {kind}s"):
            if kind == "instance":
                return [i for p in ec2.get_paginator("describe_instances").paginate(
                    Filters=[*flt, {"Name": "instance-state-name", "Values": LIVE_STATES}])
                    for r in p["Reservations"] for i in r["Instances"]]
            if kind == "security-group":
                return [g for p in ec2.get_paginator("describe_security_groups").paginate(Filters=flt)
                        for g in p["SecurityGroups"]]
            if kind == "key-pair":
                return list(ec2.describe_key_pairs(Filters=flt)["KeyPairs"])
            if kind == "placement-group":
                return list(ec2.describe_placement_groups(Filters=flt)["PlacementGroups"])
            if kind == "volume":
                return [v for p in ec2.get_paginator("describe_volumes").paginate(Filters=flt) for v in p["Volumes"]]
            if kind == "network-interface":
                return [n for p in ec2.get_paginator("describe_network_interfaces").paginate(Filters=flt)
                        for n in p["NetworkInterfaces"]]
        raise ValueError(kind)

    RESOURCE_KINDS = ("instance", "volume", "network-interface", "security-group", "key-pair", "placement-group")
    _ID_KEYS = {"instance": "InstanceId", "volume": "VolumeId", "network-interface": "NetworkInterfaceId",
                "security-group": "GroupId", "key-pair": "KeyName", "placement-group": "GroupName"}

    def list_tagged(self, region: str, cluster_id: str | None, profile: str | None = None,
                    on_unlistable: Callable[[str, str], None] | None = None) -> list[tuple[str, str]]:
        """(kind, id) of every live resource in ``region`` tagged with the cluster (or with any cluster)."""
        ec2 = self.ec2(region, profile)
        out: list[tuple[str, str]] = []
        for kind in self.RESOURCE_KINDS:
            try:
                items = self._list(ec2, region, kind, cluster_id)
            except ProviderError as e:
                if kind == "placement-group" and _code(e) not in CREDENTIAL_CODES:
                    if on_unlistable:  # an endpoint without placement groups (moto): say so, go on
                        on_unlistable(kind, e.message)
                    continue
                raise
            for it in items:
                if kind == "volume" and it.get("State") == "deleted":
                    continue
                if kind == "network-interface" and it.get("Status") == "in-use" and it.get("Attachment"):
                    continue  # goes with its instance
                out.append((kind if cluster_id else f"{kind}:{_tagdict(it).get(TAG_CLUSTER, '?')}",
                            str(it[self._ID_KEYS[kind]])))
        return out

    # ---- price ----

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        node = next((n for n in self.store.nodes(cluster.id) if n.rank == interval.node_rank), None)
        meta: dict[str, Any] = node.meta if node is not None else {}
        stop = interval.stopped_at or time.time()
        seconds = max(0.0, stop - interval.started_at)
        billed = billed_seconds(seconds, self.billing_minimum_s)
        notes: list[str] = []
        estimate = False
        if interval.market == "spot":
            od = float(meta.get("price_ondemand") or 0.0)
            catalog_spot = float(meta.get("price_spot_catalog") or interval.price_per_hour)
            rate, why = self._spot_rate(cluster, meta, interval.started_at, stop, od)
            if rate is None:
                rate, estimate = catalog_spot, True
                notes.append(f"spot: {why}; used the catalog's spot estimate ${catalog_spot:g}/h")
            else:
                notes.append(f"spot: ${rate:.4f}/h averaged from the spot price history")
        else:
            rate = interval.price_per_hour
            notes.append(f"on-demand ${rate:g}/h stored at start")
        compute = billed * rate / 3600.0
        disk = float(meta.get("disk_gb") or 0)
        ebs_rate = self._ebs_rate(meta.get("region") or cluster.region)
        ebs = disk_cost(disk, ebs_rate, billed)
        if seconds and seconds < self.billing_minimum_s:
            notes.append(f"billed the {self.billing_minimum_s:.0f} s minimum")
        if disk:
            notes.append(f"EBS gp3 {disk:g} GB ${ebs:.6f}")
        return IntervalCost(round(compute + ebs, 6), estimate=estimate, note="; ".join(notes))

    def _spot_rate(self, cluster: Cluster, meta: dict[str, Any], start: float, stop: float,
                   on_demand: float) -> tuple[float | None, str]:
        """Time-weighted spot $/h over [start, stop] from the price history, or (None, why not)."""
        region, zone, itype = meta.get("region") or cluster.region, meta.get("zone"), meta.get("instance_type")
        if not (region and zone and itype):
            return None, "no zone recorded for this node"
        key = (region, zone, itype, int(start), int(stop))
        points = self._spot_cache.get(key)
        if points is None:
            try:
                ec2 = self.ec2(region, self._profile(cluster))
                pts: list[tuple[float, float]] = []
                with _aws(f"{region}: describe_spot_price_history"):
                    for page in ec2.get_paginator("describe_spot_price_history").paginate(
                            InstanceTypes=[itype], ProductDescriptions=["Linux/UNIX"], AvailabilityZone=zone,
                            StartTime=dt.datetime.fromtimestamp(start, dt.UTC),
                            EndTime=dt.datetime.fromtimestamp(max(stop, start + 1), dt.UTC)):
                        for p in page["SpotPriceHistory"]:
                            pts.append((_epoch(p["Timestamp"]), float(p["SpotPrice"])))
            except GtrainError as e:
                return None, f"spot price history unavailable ({e.message[:120]})"
            points = sorted(pts)
            self._spot_cache[key] = points
        if not points:
            return None, "no spot price history for this interval"
        # the first record is the price in effect at `start` (AWS returns the last change before it)
        total = 0.0
        span = max(stop - start, 1e-9)
        for i, (ts, p) in enumerate(points):
            seg_start = start if i == 0 else max(ts, start)
            seg_end = min(points[i + 1][0], stop) if i + 1 < len(points) else stop
            if seg_end > seg_start:
                total += p * (seg_end - seg_start)
        rate = total / span if stop > start else points[0][1]
        lo = min(p for _, p in points)
        if on_demand and (lo < SPOT_IMPLAUSIBLE_FRACTION * on_demand or rate > on_demand * 1.0001):
            return None, (f"the spot price history is implausible (${lo:g}/h against ${on_demand:g}/h on-demand)")
        return rate, ""


def _glob(pattern: str, name: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, pattern)
