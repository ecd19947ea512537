"""The provider interface: plan, provision, describe, terminate, price, and a runner per node.

A provider is an ABC, so one that misses a method fails when it is created, not halfway through ``up``.
Providers take their state store and reporter in the constructor; cloud providers also take their SDK
client (or endpoint) there, so tests point them at a moto server or an emulator without patching.
SDK exceptions are translated into :mod:`gtrain.errors` in one place per provider module.
"""

from __future__ import annotations

import json
import math
import shlex
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.errors import CapacityError, ConfigError, GtrainError, QuotaError
from gtrain.events import SILENT, Reporter

if TYPE_CHECKING:  # kept off the import path of `gtrain status` (pydantic, runners)
    from gtrain.jobs.backend import JobBackend
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval, StateStore
    from gtrain.state.nodes import NodeRecord

#: ``gtrain attach``'s record (the cluster's spec and jobs, nothing secret), kept by :meth:`Provider.keep_record`
RECORD = "gtrain-record.json"
_MAX_RECORD = 4 << 20


@dataclass
class Plan:
    """What ``up`` would make. Pure data: computing it touches nothing."""

    provider: str
    num_nodes: int
    instance_type: str | None
    market: str  # "on-demand", "spot" or "local"
    region: str | None = None
    zone: str | None = None
    gpu_name: str | None = None
    gpus_per_node: int = 0
    price_per_hour: float = 0.0  # per node
    max_hours: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cluster_price_per_hour(self) -> float:
        return self.price_per_hour * self.num_nodes

    @property
    def estimate_usd(self) -> float | None:
        return None if self.max_hours is None else round(self.cluster_price_per_hour * self.max_hours, 2)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cluster_price_per_hour"] = round(self.cluster_price_per_hour, 4)
        d["estimate_usd"] = self.estimate_usd
        return d


@dataclass
class NodeStatus:
    rank: int
    status: str  # running, stopped, terminated, preempted, missing, unreachable, ...
    address: str | None = None
    detail: str = ""


@dataclass
class IntervalCost:
    cost_usd: float
    estimate: bool = False
    note: str | None = None


@dataclass
class Orphan:
    region: str  # the region (AWS), zone or "global" (GCP) the resource lives in
    cluster_id: str
    kind: str
    id: str


@dataclass
class GCResult:
    regions: list[str]
    orphans: list[Orphan] = field(default_factory=list)
    deleted: bool = False
    left: list[str] = field(default_factory=list)  # what still exists after deleting
    warnings: list[str] = field(default_factory=list)

    @property
    def clusters(self) -> list[str]:
        return sorted({o.cluster_id for o in self.orphans})

    def to_dict(self) -> dict[str, Any]:
        return {"regions": self.regions, "clusters": self.clusters, "deleted": self.deleted,
                "orphans": [asdict(o) for o in self.orphans], "left": self.left, "warnings": self.warnings}


@dataclass
class ProviderCheck:
    """``gtrain check``: whether this machine can use a provider now, and if not why and the one command that
    fixes it. Made by the provider's own check (``registry.CHECKS``), read-only; every field one line."""

    provider: str
    ok: bool
    reason: str  # ok: what was found ("account 1234 as arn:..."); not ok: what is missing or refused
    fix: str | None = None  # the one command (or step) that makes it usable
    credentials: str | None = None  # what was found and where from (never the secret itself)
    call: str | None = None  # the harmless authorised call made, and what it answered
    quota: str | None = None  # the GPU quota in the default region, where the API tells it
    ssh_key: str | None = None  # the SSH key gtrain will use for its nodes
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Provider(ABC):
    name: ClassVar[str]
    #: the provider bills at least this many seconds per node interval (EC2 and GCE: 60)
    billing_minimum_s: ClassVar[float] = 0.0
    #: its nodes end themselves at policies.max_hours / max_cost_usd (the cost report bounds them by it)
    nodes_enforce_limits: ClassVar[bool] = False
    #: it rents what it makes by the hour: `up` and `run` show the plan's price and ask before making it
    confirms_cost: ClassVar[bool] = False
    #: a node's files outlive its job (False: pods, whose disks end with the job -- pull reads only the store)
    node_disks_outlive_jobs: ClassVar[bool] = True
    #: `gtrain gc` can sweep this provider; the word for what ``--region`` names there ("region", "zone")
    gc_scope: ClassVar[str | None] = None
    #: it can swap one node for a new machine of the same rank (``launch --replace-bad``): :meth:`replace_nodes`
    can_replace_nodes: ClassVar[bool] = False
    #: its nodes can be stopped (compute billing ends, disks and the nodes' state kept) and started again:
    #: ``gtrain stop`` / ``gtrain start`` (:meth:`stop_nodes`, :meth:`start_nodes`)
    can_stop: ClassVar[bool] = False
    #: why it cannot (said by ``gtrain stop`` / ``start``'s refusal), where ``can_stop`` is False
    cannot_stop_why: ClassVar[str | None] = None

    def __init__(self, store: StateStore, report: Reporter = SILENT) -> None:
        self.store = store
        self.report = report

    @abstractmethod
    def plan(self, spec: ClusterSpec) -> Plan:
        """Resolve the spec into a plan and a price; raise ConfigError for what can't be had."""

    @abstractmethod
    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        """Create the nodes. Record every resource in state before making it and mark it after; record
        each node (``store.upsert_node``). Idempotent: a re-run makes only what is missing."""

    @abstractmethod
    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        """The live status of each node, as the provider sees it now."""

    @abstractmethod
    def terminate(self, cluster: Cluster) -> None:
        """Delete every resource of the cluster. Idempotent; finds resources by tag where it can."""

    @abstractmethod
    def runners(self, cluster: Cluster) -> list[Runner]:
        """One runner per node, in node-rank order."""

    @abstractmethod
    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        """What one node interval cost (the $/h stored at start, the provider's billing rules)."""

    # ---- capabilities with defaults (override where the provider differs) ---------------------------

    def job_backend(self, cluster: Cluster) -> JobBackend:
        """How jobs run on this cluster. Default: node scripts started over the provider's runners."""
        from gtrain.jobs.nodescript import NodeScriptBackend

        backend: JobBackend = NodeScriptBackend(self, cluster)
        return backend

    def node_records(self, cluster: Cluster) -> list[NodeRecord]:
        return self.store.node_records(cluster.id)

    def interactive_argv(self, cluster: Cluster, node: NodeRecord) -> tuple[list[str], str | None]:
        """The argv (and cwd) of an interactive shell on ``node``: ``ssh -F $GTRAIN_HOME/ssh/config
        <cluster>-<rank>`` for a node reached over SSH, else a login shell in the node's directory."""
        import os

        if node.ssh is not None:
            from gtrain.remote.sshconfig import config_path

            return ["ssh", "-F", str(config_path(self.store)), f"{cluster.name}-{node.rank}"], None
        return [os.environ.get("SHELL", "bash"), "-l"], node.root or node.instance_id

    def ended_at(self, cluster: Cluster) -> dict[int, float]:
        """Nodes that ended on their own (a time or cost limit the nodes enforce themselves): rank -> the
        latest moment each can have run, so the cost report does not bill them up to ``down``."""
        return {}

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Find (and with ``delete``, remove) what this provider's tags say gtrain made and no live cluster
        owns. Only providers with a ``gc_scope`` have anything to sweep."""
        raise ConfigError(f"--provider {self.name}: gtrain gc has nothing to sweep there", field="--provider")

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        """``gtrain attach``: (cluster id, region) of the live cluster named ``spec.name``, found by its
        resources' tags or labels; None when nothing of it runs. Default: this provider cannot attach."""
        from gtrain.providers import attach_providers

        raise ConfigError(f"gtrain attach: provider {self.name} cannot rebuild a cluster from tags",
                          field="--provider",
                          hint=f"attach knows {', '.join(attach_providers())}; `gtrain gc` lists what tags say")

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        """``gtrain attach``: record the resources and the nodes (``store.put_node``) of ``cluster``, whose
        row the core made with the id :meth:`find_by_name` gave, and make the nodes reachable."""
        raise ConfigError(f"gtrain attach: provider {self.name} cannot rebuild a cluster from tags",
                          field="--provider")

    def keep_record(self, cluster: Cluster, body: bytes) -> None:
        """After a launch: keep ``gtrain attach``'s record (the cluster's spec and jobs, nothing secret) where
        another machine can read it. Default: ``gtrain-record.json`` in node 0's root (a scheduler's shared
        folder included); a provider whose nodes do not outlive their jobs keeps it in its own object."""
        runner = self.runners(cluster)[0]
        runner.write_file(f"{str(runner.root).rstrip('/')}/{RECORD}", body, 0o600)

    def read_record(self, cluster: Cluster) -> dict[str, Any] | None:
        """``gtrain attach``: the record :meth:`keep_record` kept, or None (none, unreadable)."""
        runner = self.runners(cluster)[0]
        try:
            res = runner.run(f"head -c {_MAX_RECORD} {shlex.quote(str(runner.root).rstrip('/') + '/' + RECORD)}",
                             timeout=60, check=False)
        except (GtrainError, OSError):
            return None
        try:
            doc = json.loads(res.stdout) if res.rc == 0 else None
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def quota_check(self, spec: ClusterSpec, plan: Plan) -> str | None:
        """Why the account's quota cannot hold ``plan`` (read-only, before anything is made), or None when it
        can or the provider cannot tell (the default). ``up`` of a ``resources.any_of`` spec skips a candidate
        with a reason, and says so; a ``GtrainError`` here only warns (provision will tell)."""
        return None

    def replace_nodes(self, cluster: Cluster, ranks: list[int]) -> None:
        """Replace the nodes of ``ranks`` by new machines of the same ranks (``launch --replace-bad`` after a
        failed preflight): the old ones are deleted and their cost intervals end now, the new ones are billed
        from their start. Only providers that rent their nodes can (``can_replace_nodes``)."""
        raise cannot_replace(self.name)

    def stop_nodes(self, cluster: Cluster, ranks: list[int] | None = None) -> list[StoppedNode]:
        """Stop the nodes (all, or ``ranks``) keeping their disks, and wait until they are stopped; record them
        ``stopped``. Returns what each stopped node still bills (its disk). Only ``can_stop`` providers can."""
        raise cannot_stop(self.name, "stop", self.cannot_stop_why)

    def start_nodes(self, cluster: Cluster, ranks: list[int] | None = None) -> list[int]:
        """Start the stopped nodes (all, or ``ranks``) again, wait until they run and answer over SSH, and
        refresh their records (addresses may change). Returns the ranks started; a node already running is left
        alone. Only ``can_stop`` providers can."""
        raise cannot_stop(self.name, "start", self.cannot_stop_why)

    # ---- shared helpers ------------------------------------------------------------------------

    def billed_cost(self, interval: CostInterval, now: float) -> float:
        stop = interval.stopped_at or now
        seconds = max(0.0, stop - interval.started_at)
        if seconds > 0 and self.billing_minimum_s:
            seconds = max(seconds, self.billing_minimum_s)
        return math.ceil(seconds) * interval.price_per_hour / 3600.0


#: the market of a stopped node's cost interval: only its disk bills (``gtrain stop``, a cloud's lifetime)
STOPPED_MARKET = "stopped"


@dataclass
class StoppedNode:
    """A stopped node and what it still bills: its disk(s), at ``usd_per_hour``."""

    rank: int
    disk_gb: float
    disk_usd_per_gb_month: float
    disk_label: str  # "EBS gp3", "pd-balanced"

    @property
    def usd_per_hour(self) -> float:
        return self.disk_gb * self.disk_usd_per_gb_month / 730.0  # the clouds' month of 730 hours

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usd_per_hour": round(self.usd_per_hour, 6)}


def cannot_stop(provider: str, verb: str, why: str | None = None) -> ConfigError:
    """The error of ``gtrain stop`` / ``start`` on a provider whose nodes cannot be stopped (exit 2), with the
    provider's reason (``Provider.cannot_stop_why``) where it gives one."""
    reason = f" ({why})" if why else ""
    return ConfigError(f"gtrain {verb}: provider {provider} cannot stop and start its nodes{reason}", field="provider",
                       hint="only VM clusters (aws, gcp) can be stopped; `gtrain down NAME` deletes a cluster, "
                            "and nodes that gtrain does not rent cost nothing while idle")


def cannot_replace(provider: str) -> ConfigError:
    """The error of ``--replace-bad`` on a provider whose nodes are not its own to replace (exit 2)."""
    return ConfigError(f"--replace-bad: cannot replace nodes on provider {provider}", field="--replace-bad",
                       hint="only a provider that rents its nodes can make new ones; fix or swap the named node "
                            "yourself, or launch without --replace-bad")


@dataclass
class PartialStart:
    """What an elastic start (``num_nodes: {min, max}``) keeps when the cloud refused some of its nodes for capacity
    or quota (:func:`partial_start`): the new ranks to keep, those made past a gap (deleted: an elastic cluster's
    nodes are ranks 0..n-1, the lowest missing first), and the ranks left pending with the cloud's reason. The
    pending ranks get no node record and their ledger rows stay ``not-created``, as aws's MinCount..MaxCount start
    leaves them; ``gtrain.runs.elastic.grow`` asks for them again through the provider's ``provision``."""

    keep: list[int]
    drop: list[int]
    pending: list[int]
    why: str

    def note(self, where: str, have: int, spec: ClusterSpec) -> str:
        """The line ``up`` says (with the cluster's own ``N of M node(s) now`` after it)."""
        return (f"{where}: node(s) {', '.join(map(str, self.pending))} pending, {have} of {spec.num_nodes} made "
                f"(num_nodes.min {spec.min_nodes}): {self.why}")


def partial_start(spec: ClusterSpec, have: list[int], made: list[int], refused: dict[int, BaseException],
                  required: set[int] | frozenset[int] = frozenset()) -> PartialStart | None:
    """Whether a start whose ``refused`` ranks failed may keep the rest (``made``, next to the ranks the cluster
    ``have`` already): only for an elastic spec, only when every refusal is a capacity or quota answer, never
    without a ``required`` rank (a replacement of a recorded node), and only with at least the nodes that bring the
    cluster to ``num_nodes.min`` (and one) -- aws's ``MinCount`` rule. None: the start fails as a fixed one does."""
    if not spec.elastic or not refused or not all(isinstance(e, CapacityError | QuotaError)
                                                   for e in refused.values()):
        return None
    present = set(have) | set(made)
    top = 0
    while top in present:
        top += 1
    keep = sorted(r for r in made if r < top)
    if required - set(range(top)) or len(keep) < max(1, (spec.min_nodes or spec.num_nodes) - len(have)):
        return None
    first = refused[min(refused)]
    why = str(getattr(first, "message", None) or first).splitlines()[0]
    return PartialStart(keep, sorted(r for r in made if r >= top), list(range(top, spec.num_nodes)), why)
