"""EC2 plumbing shared by every part of the aws provider: the resource tags, the error codes and the one place
botocore exceptions become :mod:`gtrain.errors` (:func:`translate`, used through :func:`call`), tag helpers, and
:class:`EC2Clients`, which owns the boto3 session and the EC2 clients (one per region and profile).

boto3 and botocore are imported inside functions only: importing this module does not import them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gtrain.errors import (
    CapacityError,
    ConfigError,
    CredentialsError,
    GtrainError,
    ProviderError,
    QuotaError,
)
from gtrain.providers.cloud.errors import with_code
from gtrain.providers.cloud.keys import owner

if TYPE_CHECKING:
    from gtrain.providers.aws.options import AWSOptions
    from gtrain.state import Cluster

TAG_CLUSTER = "gtrain:cluster"
TAG_CLUSTER_NAME = "gtrain:cluster-name"
TAG_OWNER = "gtrain:owner"
TAG_CREATED = "gtrain:created"
TAG_RANK = "gtrain:rank"

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

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


# ---------------------------------------------------------------------------------------------- errors


def translate(e: BaseException, what: str) -> GtrainError:
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
            with_code(ce, code)
            return ce
        if code in QUOTA_CODES:
            qe = QuotaError(text, hint="ask AWS for a higher quota (Service Quotas: 'Running On-Demand/Spot "
                                       "... instances'), or use another region")
            with_code(qe, code)
            return qe
        if code in CREDENTIAL_CODES:
            return CredentialsError(text, hint="check the profile / keys, and that the region is enabled")
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            return CredentialsError(text, hint="the IAM identity lacks this EC2 permission; see docs/providers/aws.md")
        if code.startswith("InvalidAMIID"):
            return ConfigError(text, hint="check resources.image_id (AMIs are per region)", field="resources.image_id")
        pe = ProviderError(text)
        with_code(pe, code)
        return pe
    if isinstance(e, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return ProviderError(f"{what}: cannot reach the EC2 endpoint ({e})",
                             hint="check the network / AWS_ENDPOINT_URL")
    if isinstance(e, ResponseParserError):
        pe = ProviderError(f"{what}: the endpoint sent an unreadable answer ({str(e).splitlines()[0][:200]})")
        with_code(pe, "UnreadableResponse")
        return pe
    if isinstance(e, bx.BotoCoreError):
        return ProviderError(f"{what}: {e}")
    return ProviderError(f"{what}: {type(e).__name__}: {e}")


def error_code(e: BaseException) -> str:
    return str(getattr(e, "code", "") or "")


def is_not_found(e: BaseException) -> bool:
    c = error_code(e)
    return c.endswith(NOT_FOUND_SUFFIXES) or c in ("InvalidKeyPair.NotFound", "InvalidGroup.NotFound")


@contextlib.contextmanager
def call(what: str) -> Iterator[None]:
    import botocore.exceptions as bx
    from botocore.parsers import ResponseParserError

    try:
        yield
    except (bx.BotoCoreError, bx.ClientError, ResponseParserError) as e:
        raise translate(e, what) from None


# ---------------------------------------------------------------------------------------------- helpers


def tags(d: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in d.items()]


def tagdict(obj: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in obj.get("Tags") or []}


def epoch(t: Any) -> float:
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return t.timestamp()
    return float(t)


def resource_name(cluster_id: str) -> str:
    """Key pair, security group and placement group name of a cluster."""
    return f"gtrain-{cluster_id}"


# ---------------------------------------------------------------------------------------------- clients


class EC2Clients:
    """The boto3 session and one thread-safe EC2 client per region and profile, shared by every part of
    :class:`~gtrain.providers.aws.AWSProvider` (network, instances, teardown, pricing)."""

    def __init__(self, session: Any = None, client_config: Any = None) -> None:
        self._session = session
        self._client_config = client_config
        self._clients: dict[tuple[str, str | None], Any] = {}
        self._sessions: dict[str | None, Any] = {}
        self._lock = threading.Lock()

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
                with call("creating the EC2 client"):
                    c = self._get_session(profile).client("ec2", region_name=region, config=cfg)
                self._clients[key] = c
            return c

    def session(self, profile: str | None = None) -> Any:
        """The boto3 session for ``profile`` (for the few calls that are not EC2: Service Quotas)."""
        with self._lock:
            return self._get_session(profile)

    def _get_session(self, profile: str | None) -> Any:
        if self._session is not None:
            return self._session
        s = self._sessions.get(profile)
        if s is None:
            import boto3

            s = boto3.Session(profile_name=profile) if profile else boto3.Session()
            self._sessions[profile] = s
        return s

    def find_instances(self, region: str, cluster_id: str, profile: str | None,
                       states: list[str] | None = None) -> list[dict[str, Any]]:
        """The cluster's instances in ``region``, found by tag (live ones unless ``states`` says otherwise)."""
        ec2 = self.ec2(region, profile)
        out: list[dict[str, Any]] = []
        with call(f"{region}: describe_instances"):
            for page in ec2.get_paginator("describe_instances").paginate(Filters=[
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]},
                {"Name": "instance-state-name", "Values": states or LIVE_STATES},
            ]):
                for r in page["Reservations"]:
                    out.extend(r["Instances"])
        return out


def profile_of(cluster: Cluster) -> str | None:
    """The ``aws.profile`` a cluster was made with."""
    section = cluster.spec.get("aws") or {}
    return section.get("profile") if isinstance(section, dict) else None


def base_tags(cluster: Cluster, opts: AWSOptions, name: str) -> dict[str, str]:
    """The tags on every resource of the cluster (``Name`` = ``name``)."""
    created = cluster.extra.get("aws_created") or dt.datetime.fromtimestamp(
        cluster.created_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**opts.tags, TAG_CLUSTER: cluster.id, TAG_CLUSTER_NAME: cluster.name, TAG_OWNER: owner(),
            TAG_CREATED: created, "Name": name}
