"""The job seam: how a job runs on a cluster, whatever runs it.

Shaped like TorchX's ``Scheduler``: :meth:`JobBackend.dryrun` materialises everything the job would run (the
per-node scripts, or a batch request) as a printable :class:`JobPlan`; :meth:`~JobBackend.submit` runs exactly
that plan; :meth:`~JobBackend.describe` says where the job is, per node and per rank, in one state enum;
:meth:`~JobBackend.log_iter` streams one node's (or rank's) output; :meth:`~JobBackend.cancel` stops it.

The default backend, :class:`gtrain.jobs.nodescript.NodeScriptBackend`, starts detached node scripts over
the provider's runners (local, ssh, aws, gcp). A scheduler (Slurm) implements this interface instead and is
handed out by its provider's ``Provider.job_backend(cluster)``; nothing above this layer knows which backend
it talks to.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, StateStore
    from gtrain.state import Job as JobRecord


class JobState(enum.StrEnum):
    """Where a job (or one node's part of it, or one rank) is. The stored job status is its value."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @classmethod
    def parse(cls, value: object) -> JobState:
        """A state from a node's or a scheduler's word for it; what is not known maps to UNKNOWN."""
        try:
            return cls(str(value))
        except ValueError:
            return NODE_STATES.get(str(value), cls.UNKNOWN)


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED})

#: the node scripts' own words (``JOB/state.json`` and what gtrain says of a node it cannot ask)
NODE_STATES: Mapping[str, JobState] = {
    "starting": JobState.PENDING,
    "queued": JobState.PENDING,  # waiting in the cluster's queue (gtrain.remote.nodequeue)
    "setup": JobState.PENDING,
    "missing": JobState.FAILED,
    "unreachable": JobState.UNKNOWN,
}


#: the exit code of a job that was cancelled (as a shell reports Ctrl+C)
CANCEL_EXIT = 130


@dataclass
class RankStatus:
    rank: int  # global rank
    state: JobState
    exit_code: int | None = None
    ended_at: float | None = None  # epoch seconds the rank exited


@dataclass
class NodeJobStatus:
    """One node's part of a job."""

    node: int
    state: JobState
    exit_code: int | None = None
    #: the node's own word for where it is (``missing``, ``unreachable``, a scheduler's state name)
    detail: str = ""
    error: str | None = None
    ranks: list[RankStatus] = field(default_factory=list)
    #: the node's launcher died and left workers running (they are ended by :meth:`JobBackend.cancel`)
    orphans: bool = False
    #: the backend's raw record of the node, kept in the job's info for `status --json`
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobDescription:
    job_id: str
    state: JobState
    exit_code: int | None
    nodes: list[NodeJobStatus] = field(default_factory=list)
    #: why it is where it is, in words (a scheduler's pending reason, the failing node)
    reason: str = ""


@dataclass
class JobRequest:
    """What to run: the validated spec's job on a cluster, under a job id."""

    cluster: Cluster
    spec: ClusterSpec
    job_id: str
    #: local folder synced to the nodes as the job's working directory
    workdir: str
    #: the rendezvous port, once :meth:`JobBackend.reserve` has picked one (None in a dry run)
    master_port: int | None = None


@dataclass
class JobPlan:
    """Everything :meth:`JobBackend.submit` will run, materialised: printable by ``launch --dry-run`` and
    run exactly as printed."""

    request: JobRequest
    #: node -> file name -> its text (the rendered scripts, or a batch script under node 0)
    files: dict[int, dict[str, str]] = field(default_factory=dict)
    #: what the job record keeps (rendezvous address, processes per node, checkpoint folder, ...)
    info: dict[str, Any] = field(default_factory=dict)
    #: backend state carried from dryrun to submit (runners, contexts); never printed
    private: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def job_id(self) -> str:
        return self.request.job_id

    def render(self) -> str:
        """The plan as text: each file under a header naming its node."""
        out: list[str] = []
        for node in sorted(self.files):
            for name, text in self.files[node].items():
                out.append(f"# ---- node {node}: {name} ----\n{text}")
        return "\n".join(out)


@dataclass
class LogLine:
    node: int
    rank: int | None  # None: the node's own output (setup, the launcher agent)
    text: str


@dataclass
class NodeEnded:
    """The last item of a followed node's stream: its part of the job is over, in ``state``."""

    node: int
    state: JobState
    #: the backend's own word for the end (``succeeded``, ``missing``, ``unreachable``, ``TIMEOUT``)
    detail: str = ""
    error: str | None = None
    #: the node's whole status as the node itself said it at the end of its stream (the same document
    #: :meth:`JobBackend.describe` would ask for), where the backend's stream carries one; a follower whose every
    #: node ended this way decides the job's end on these instead of asking every node again
    status: NodeJobStatus | None = None


def aggregate(nodes: list[NodeJobStatus]) -> tuple[JobState, int | None]:
    """The job's state and exit code from its nodes' states."""
    names = [n.detail for n in nodes]
    if "unreachable" in names:
        return JobState.FAILED, 255
    if all(n.state.terminal for n in nodes):
        if all(n.state is JobState.SUCCEEDED for n in nodes):
            return JobState.SUCCEEDED, 0
        if any(n.state is JobState.FAILED for n in nodes):  # a node failed; others may have been stopped for it
            return JobState.FAILED, job_exit_code(nodes)
        if any(n.state is JobState.PREEMPTED for n in nodes):
            return JobState.PREEMPTED, None
        return JobState.CANCELLED, CANCEL_EXIT
    if "missing" in names and not any(n.state is JobState.RUNNING for n in nodes):
        return JobState.FAILED, 1
    if any(n.state is JobState.RUNNING for n in nodes):
        return JobState.RUNNING, None
    return JobState.PENDING, None


def first_failed(nodes: list[NodeJobStatus]) -> dict[str, int | None] | None:
    """The rank that failed first (in time, across nodes) as ``{node, rank, exit_code}``; a node that failed
    with no rank's exit code known gives ``rank: None``; None when nothing failed."""
    failed = [(r.ended_at or 0.0, n.node, r.rank, r.exit_code) for n in nodes for r in n.ranks if r.exit_code]
    if failed:
        _t, node, rank, code = min(failed)
        return {"node": node, "rank": rank, "exit_code": code}
    for n in nodes:
        if n.state is JobState.FAILED and n.exit_code:
            return {"node": n.node, "rank": None, "exit_code": n.exit_code}
    return None


def job_exit_code(nodes: list[NodeJobStatus]) -> int:
    """The job's own exit code: the first rank (in time, across nodes) that exited non-zero."""
    failed = [(r.ended_at or 0.0, r.exit_code) for n in nodes for r in n.ranks if r.exit_code]
    if failed:
        return int(min(failed)[1] or 1)
    for n in nodes:
        if n.exit_code:
            return n.exit_code
    return 1


class NodeProvider(Protocol):
    """What a job backend is handed by the provider that makes it (``Provider.job_backend(cluster)``): the
    state store, the reporter and a way to reach each node. :class:`gtrain.providers.base.Provider` is one; the
    seam is declared here so that this layer never imports the providers' (the providers sit above jobs)."""

    store: StateStore
    report: Reporter

    def runners(self, cluster: Cluster) -> list[Runner]: ...


class JobBackend(ABC):
    """How jobs run on one cluster. Made by ``Provider.job_backend(cluster)``."""

    #: the backend's name (``node-script``, ``slurm``), shown by `status` and stored with each job
    name: str = "job-backend"
    #: where gtrain's checkpoint tool (``job.checkpoint_store``, gtrain.runs.ship) reaches the nodes.
    #: ``"runners"``: copied to each node over the backend's ``runners`` before the submit, which also probe the
    #: store, archive an attempt's files and collect the survivors' newest checkpoints before a relaunch.
    #: ``"plan"``: the backend's own plan carries it (its nodes exist only once submitted: pods, a scheduler's
    #: workers); each node probes, restores, uploads and flushes by itself, ``dryrun`` puts the run's store folder
    #: in ``plan.info["checkpoint_key"]`` and ``submit`` hands ``plan.info["attempt"]`` to the nodes.
    checkpoint_tool: str = "runners"
    #: True where cancelling the job deletes its lines (kubernetes: the pods and their logs): `down` keeps a
    #: running job's lines in the run archive before it stops the job, not only after.
    logs_go_with_job: bool = False
    #: True where a scheduler places the job on its nodes (slurm, kubernetes, ray): ``job.gpus_per_node`` is
    #: mapped to its request (gtrain.spec.queue.job_gpus) and the scheduler packs; else gtrain's queue packs
    scheduler_packs: bool = False

    def __init__(self, provider: NodeProvider, cluster: Cluster) -> None:
        self.provider = provider
        self.cluster = cluster

    def reserve(self, request: JobRequest) -> JobRequest:
        """Before a real submit: pick what the plan needs from the live cluster (a free rendezvous port).
        A dry run skips this. Default: nothing to pick."""
        return request

    @abstractmethod
    def dryrun(self, request: JobRequest) -> JobPlan:
        """Materialise the job (scripts, batch request) without touching anything that runs it."""

    @abstractmethod
    def submit(self, plan: JobPlan, report: Any = None) -> str:
        """Start exactly ``plan``; returns the job id. On failure nothing of the job is left running."""

    @abstractmethod
    def describe(self, job: JobRecord, nodes: list[int] | None = None) -> JobDescription:
        """Where the job is now, per node and per rank (only ``nodes``' when given), asked of whatever runs it
        (never only of the state database)."""

    @abstractmethod
    def log_iter(self, job: JobRecord, node: int, rank: int | None = None, *, follow: bool = False,
                 tail: int | None = None, since: int = 0) -> Iterator[LogLine | NodeEnded]:
        """One node's output lines (only ``rank``'s when given): its last ``tail`` lines, or from line
        ``since`` on. With ``follow``, go on until the node's part of the job has ended, then yield one
        :class:`NodeEnded`."""

    @abstractmethod
    def cancel(self, job: JobRecord, nodes: list[int] | None = None, grace_s: float = 10) -> None:
        """Stop the job (on ``nodes`` only, when given) and everything it started; idempotent."""

    @property
    def num_nodes(self) -> int:
        return self.cluster.num_nodes
