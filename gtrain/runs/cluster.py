"""Cluster lifecycle: up, down, status. Provider-independent; talks to providers through their ABC."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.context import Context
from gtrain.costs.report import CostReport, cluster_cost
from gtrain.errors import ClusterNotFound, ConfigError, GtrainError
from gtrain.state import Cluster, StateStore

if TYPE_CHECKING:
    from gtrain.providers.base import Plan, Provider
    from gtrain.spec import ClusterSpec

__all__ = ["Context", "DownResult", "UpResult", "down", "status", "up"]


@dataclass
class UpResult:
    plan: Plan
    cluster: Cluster | None
    created: bool
    #: with ``resources.any_of``: every candidate priced, what became of each (gtrain.runs.placement.record)
    placement: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "placement": self.placement,
            "cluster": self.cluster.name if self.cluster else None,
            "cluster_id": self.cluster.id if self.cluster else None,
            "status": self.cluster.status if self.cluster else "planned",
            "created": self.created,
            "plan": self.plan.to_dict(),
        }


def up(spec: ClusterSpec, ctx: Context, *, dry_run: bool = False, keep_failed: bool = False,
       recreate: bool = False) -> UpResult:
    """Provision the spec's cluster. An up that fails (or is interrupted) deletes what it made unless
    ``keep_failed``; an existing cluster whose shape differs from the spec is refused unless ``recreate``."""
    from gtrain.locks import cluster_lock

    if spec.resources.any_of:  # several candidates: tried in order (gtrain.runs.placement)
        return _up_any_of(spec, ctx, dry_run=dry_run, keep_failed=keep_failed, recreate=recreate)
    provider = ctx.provider(spec.provider)
    plan = provider.plan(spec)  # raises ConfigError before anything is made
    if dry_run:
        return UpResult(plan, None, False)
    with cluster_lock(ctx.store.home, spec.name, "up"):
        cluster, done = existing_cluster(spec, ctx, recreate=recreate, shape=spec.to_yaml_dict(), plan=plan)
        if done is not None:
            return done
        return provision(spec, ctx, plan, cluster, keep_failed=keep_failed)


def _up_any_of(spec: ClusterSpec, ctx: Context, *, dry_run: bool, keep_failed: bool, recreate: bool) -> UpResult:
    from gtrain.locks import cluster_lock
    from gtrain.runs import placement

    all_offers, plannable = placement.prepare(spec, ctx)
    if dry_run:
        first = placement.choose(spec, plannable)
        assert first.plan is not None
        return UpResult(first.plan, None, False, placement=placement.record(spec, all_offers))
    with cluster_lock(ctx.store.home, spec.name, "up"):
        cluster, done = existing_cluster(spec, ctx, recreate=recreate, shape=spec.to_yaml_dict())
        if done is not None:
            return done

        def attempt(o: placement.Offer, c: Cluster | None, extra: dict[str, Any]) -> UpResult:
            assert o.plan is not None
            return provision(o.spec, ctx, o.plan, c, keep_failed=keep_failed, extra=extra)

        return placement.try_in_order(spec, ctx, all_offers, plannable, cluster, attempt)


def existing_cluster(spec: ClusterSpec, ctx: Context, *, recreate: bool, shape: dict[str, Any],
                     plan: Plan | None = None) -> tuple[Cluster | None, UpResult | None]:
    """Under the cluster's lock: (a cluster to resume provisioning, None), (None, the result when the cluster
    is already up with this ``shape``), or (None, None) for a new one. One up with another shape is refused
    unless ``recreate``."""
    existing = ctx.store.find_cluster(spec.name)
    if existing is not None and existing.status == "stopped":
        raise ConfigError(f"cluster {spec.name!r} is stopped", field="name",
                          hint=f"`gtrain start {spec.name}` brings its nodes back, `gtrain down {spec.name}` "
                               "deletes it")
    if existing is not None and existing.status == "up":
        changed = spec_changes(existing.extra.get("any_of", {}).get("spec") or existing.spec, shape)
        if not changed:
            ctx.report.info(f"cluster {spec.name} is already up")
            if plan is None:  # the plan it landed on
                from gtrain.providers.base import Plan as P

                plan = P(**{k: v for k, v in existing.extra.get("plan", {}).items() if k in P.__dataclass_fields__})
            return None, UpResult(plan, existing, False, placement=existing.extra.get("any_of"))
        if not recreate:
            raise ConfigError(
                f"cluster {spec.name!r} is up with another shape: " + "; ".join(changed),
                hint=f"`gtrain up --recreate` replaces its nodes (`gtrain down {spec.name}` + up), "
                     "or pick another --name", field=changed[0].split(":", 1)[0])
        ctx.report.info(f"recreating {spec.name}: " + "; ".join(changed))
        down(spec.name, ctx)
        existing = ctx.store.find_cluster(spec.name)
    if existing is not None and existing.status != "terminated":
        ctx.report.info(f"resuming provisioning of {spec.name} (was {existing.status})")
        return existing, None  # an interrupted up (kept with --keep-failed): provisioning is idempotent
    return None, None


def provision(spec: ClusterSpec, ctx: Context, plan: Plan, cluster: Cluster | None, *, keep_failed: bool,
              extra: dict[str, Any] | None = None) -> UpResult:
    """Make the plan's nodes for ``cluster`` (None: a new record; a terminated one, which a failed candidate
    of ``resources.any_of`` left with nothing made, is taken over). A failure deletes what it made unless
    ``keep_failed``."""
    provider = ctx.provider(spec.provider)
    fields: dict[str, Any] = dict(
        provider=spec.provider, num_nodes=spec.num_nodes, spec=spec.to_yaml_dict(), region=plan.region,
        instance_type=plan.instance_type, market=plan.market, price_per_hour=plan.price_per_hour,
        extra={"base_dir": spec.base_dir, "plan": plan.to_dict(), **(extra or {})})
    if cluster is None:
        cluster = ctx.store.create_cluster(name=spec.name, **fields)
    elif cluster.status == "terminated":
        ctx.store.update_cluster(cluster.id, status="provisioning", terminated_at=None, **fields)
        cluster = ctx.store.get_cluster_by_id(cluster.id)
    ctx.report.info(f"provisioning {plan.num_nodes} {plan.provider} node(s) for {spec.name}")
    started = time.time()
    try:
        provider.provision(spec, cluster, plan)
    except (Exception, KeyboardInterrupt) as exc:
        _failed_up(ctx, provider, cluster, plan, started, keep=keep_failed, why=exc)
        raise
    except BaseException:  # a crash-like exit (not an error, not a signal): state and tags tell what was made
        _failed_up(ctx, provider, cluster, plan, started, keep=True, why=None)
        raise
    _open_intervals(ctx.store, cluster, plan, started)
    if spec.elastic:  # num_nodes: {min, max}: the provider may have made min..max of them (gtrain.runs.elastic)
        have = len([n for n in ctx.store.node_records(cluster.id) if n.status not in ("terminated", "deleted")])
        if have < spec.num_nodes:
            ctx.store.update_cluster(cluster.id, num_nodes=have)
            ctx.report.warn(f"{spec.name}: {have} of {spec.num_nodes} node(s) now (num_nodes.min "
                            f"{spec.min_nodes}); the others join as capacity comes, while `run`, `launch --wait`, "
                            "`logs -f` or `watch` follows the job")
    ctx.store.update_cluster(cluster.id, status="up")
    ctx.event(cluster, "up", msg=f"{plan.num_nodes} {plan.provider} node(s) {plan.instance_type or ''}".strip())
    return UpResult(plan, ctx.store.get_cluster_by_id(cluster.id), True)


def _failed_up(ctx: Context, provider: Provider, cluster: Cluster, plan: Plan, started: float, *, keep: bool,
               why: BaseException | None) -> None:
    from gtrain import signals

    if not ctx.store.resources(cluster.id, live_only=True) and not ctx.store.nodes(cluster.id):
        # nothing was made: leave nothing behind, the name is free again
        ctx.store.update_cluster(cluster.id, status="terminated", terminated_at=time.time())
        return
    _open_intervals(ctx.store, cluster, plan, started)
    ctx.store.update_cluster(cluster.id, status="failed")
    if keep:  # what was made is in state (and in tags): `gtrain down` removes it, `gtrain up` resumes
        if why is not None:
            ctx.report.warn(f"up failed; its nodes are kept (--keep-failed): `gtrain down {cluster.name}` deletes "
                            f"them, `gtrain up` again resumes")
        return
    what = "interrupted" if isinstance(why, KeyboardInterrupt) else "failed"
    ctx.report.warn(f"up {what}: deleting what it made (--keep-failed keeps it for a look)")
    with signals.deferred(lambda _s: ctx.report.warn("still deleting what up made; nothing is left half-deleted")):
        _teardown(ctx, provider, cluster)


def spec_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What makes a cluster different (everything but the job): ``path: old -> new``, one per leaf."""
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif a != b:
            out.append(f"{path}: {a!r} -> {b!r}")

    walk({k: v for k, v in old.items() if k not in _NOT_SHAPE}, {k: v for k, v in new.items() if k not in _NOT_SHAPE},
         "")
    return out


#: spec sections that do not shape the nodes: a new job or name needs no new cluster
_NOT_SHAPE = ("job", "name")


def _open_intervals(store: StateStore, cluster: Cluster, plan: Plan, started: float) -> None:
    have = {i.node_rank for i in store.intervals(cluster.id) if i.stopped_at is None}
    for node in store.node_records(cluster.id):
        if node.rank in have or node.status in ("terminated", "deleted"):
            continue
        store.open_interval(cluster.id, node.rank, instance_type=plan.instance_type, market=plan.market,
                            price_per_hour=plan.price_per_hour,
                            started_at=node.launched_at if node.launched_at is not None else started)


@dataclass
class DownResult:
    cluster: str
    already_down: bool
    cost: CostReport
    warnings: list[str] = field(default_factory=list)
    #: the run's HTML report, when one was written (`gtrain down` writes it unless --no-report)
    report: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "already_down": self.already_down, "warnings": self.warnings,
                "cost": self.cost.to_dict(), "report": self.report}


def down(name: str, ctx: Context, *, yes: bool = True) -> DownResult:
    """Stop the cluster's jobs and delete everything it has; idempotent. Signals that arrive meanwhile are
    raised after the teardown, never in the middle of it."""
    from gtrain import signals
    from gtrain.locks import cluster_lock

    if ctx.store.find_cluster(name) is None:  # no lock file for a name that was never a cluster
        raise ClusterNotFound(name)
    with cluster_lock(ctx.store.home, name, "down"):
        # looked up again under the lock: an `up` of this name that held it may have made a new cluster
        cluster = ctx.store.find_cluster(name)
        if cluster is None:
            raise ClusterNotFound(name)
        provider = ctx.provider(cluster.provider)
        if cluster.status == "terminated":
            return DownResult(name, True, cluster_cost(ctx.store, cluster, provider))
        from gtrain.runs.safety import check_down

        unsafe = check_down(cluster, ctx, yes=yes)  # checkpoints in the store; refused when the newest is not
        with signals.deferred(lambda _s: ctx.report.warn("finishing the teardown first: nothing is left "
                                                         "half-deleted")):
            warnings = unsafe + _teardown(ctx, provider, cluster)
            cluster = ctx.store.get_cluster_by_id(cluster.id)
            report = cluster_cost(ctx.store, cluster, provider, persist=True)
    return DownResult(name, False, report, warnings)


def _teardown(ctx: Context, provider: Provider, cluster: Cluster) -> list[str]:
    from gtrain.jobs.status import cancel_active_jobs

    warnings: list[str] = []
    ctx.store.update_cluster(cluster.id, status="terminating")
    try:
        early = ctx.backend(cluster).logs_go_with_job
    except GtrainError:
        early = False
    if early:  # cancelling deletes the job's lines (kubernetes: the pods' logs): keep them before, not only after
        _keep_runs(ctx, cluster, warnings, event=False)
    try:
        cancel_active_jobs(cluster, ctx)
    except GtrainError as e:  # an unreachable node must not keep us from deleting what costs money
        warnings.append(f"could not stop jobs cleanly: {e.message}")
        ctx.report.warn(warnings[-1])
    _keep_runs(ctx, cluster, warnings)
    ended = _ended_on_their_own(cluster, provider, ctx)
    ctx.report.info(f"terminating {cluster.num_nodes} node(s) of {cluster.name}")
    provider.terminate(cluster)
    now = time.time()
    for rank, at in ended.items():
        ctx.store.close_node_interval(cluster.id, rank, at=min(at, now))
    ctx.store.close_intervals(cluster.id, at=now)
    ctx.store.set_nodes_status(cluster.id, "terminated")
    ctx.store.update_cluster(cluster.id, status="terminated", terminated_at=now)
    return warnings


def _keep_runs(ctx: Context, cluster: Cluster, warnings: list[str], *, event: bool = True) -> None:
    """Before the nodes go: every job's logs, metrics and telemetry into the run archive ($GTRAIN_HOME/runs),
    so `logs`, `plot` and `report` work on a cluster that is gone. Never stops a teardown."""
    from gtrain.runlog import archive

    try:
        archive.archive_cluster(ctx, cluster)
    except Exception as e:  # noqa: BLE001 - whatever fails here is a warning: the teardown goes on, nothing leaks
        why = e.message if isinstance(e, GtrainError) else f"{type(e).__name__}: {e}"
        warnings.append(f"could not keep the jobs' logs: {why}")
        ctx.report.warn(warnings[-1])
    if event:
        ctx.event(cluster, "down")


def _ended_on_their_own(cluster: Cluster, provider: Provider, ctx: Context) -> dict[int, float]:
    """Nodes that ended on their own (a limit the nodes enforce): rank -> the latest moment each ran."""
    try:
        out = provider.ended_at(cluster)
    except GtrainError as e:
        ctx.report.warn(f"could not ask which nodes ended on their own ({e.message}); billing them until now")
        return {}
    for rank in sorted(out):
        ctx.report.info(f"node {rank} had already ended on its own; billed up to its time limit at most")
    return out


def _recovery_note(cluster: Cluster, job: Any, ctx: Context) -> str | None:
    """Who recovers a lost node of the job now (gtrain.runs.recovery), only for a job that asked for
    recovery or had one: the recovery module stays off `gtrain status`'s import path otherwise."""
    info = job.info if job is not None else {}
    asked = int((info.get("recovery_policy") or {}).get("max_restarts", 0) or 0) > 0
    if not (asked or info.get("recoveries") or info.get("recovery_stopped")):
        return None
    from gtrain.runs.recovery import status_note

    return status_note(cluster, job, ctx)


def _beats(cluster: Cluster, job: Any, ctx: Context) -> dict[int, dict[str, Any]] | None:
    """Each node's word from node 0's heartbeat aggregate (gtrain.jobs.nodescript.beats), for a node-script job
    not over yet; None: none to read (another backend, an older job, node 0 not answering)."""
    from gtrain.state import TERMINAL_JOB

    if job.status in TERMINAL_JOB and job.info.get("final"):
        return None
    try:
        backend = ctx.backend(cluster)
        from gtrain.jobs.nodescript import NodeScriptBackend, beats

        return beats(backend.runners, job) if isinstance(backend, NodeScriptBackend) else None
    except GtrainError:
        return None


class _NodeZero:
    """Progress asked of node 0 alone (rank 0's metrics are there: gtrain.state.progress.combine measures rank
    0, else the lowest rank with samples), in the background; every node is asked (runlog.progress.Live) when
    node 0 did not answer."""

    def __init__(self, cluster: Cluster, job: Any, ctx: Context) -> None:
        import threading

        from gtrain.runlog import progress

        self.cluster, self.job, self.ctx = cluster, job, ctx
        self.answers: list[dict[str, Any] | None] | None = None
        runners = ctx.runners(cluster)[:1]
        self._thread = threading.Thread(target=self._run, args=(progress, runners), daemon=True,
                                        name="gtrain-progress")
        self._thread.start()

    def _run(self, progress: Any, runners: list[Any]) -> None:
        try:
            self.answers = progress.ask(runners, self.job.id)
        except Exception:  # noqa: BLE001 -- progress is a nicety: never the command's failure
            self.answers = None

    def result(self, wait_s: float = 10.0) -> list[dict[str, Any] | None] | None:
        from gtrain.runlog.progress import Live

        self._thread.join(wait_s)
        got = self.answers
        if got and got[0] is not None:
            return got
        return Live(self.cluster, self.job, self.ctx).result(wait_s)


def _progress(cluster: Cluster, job: Any, ctx: Context, beating: bool) -> Any:
    """The job's progress read beside `status`'s state read: from node 0 while the heartbeat aggregate
    answers (one request), else every node (runlog.progress.Live)."""
    if beating:
        return _NodeZero(cluster, job, ctx)
    from gtrain.runlog.progress import Live

    return Live(cluster, job, ctx)


def _node_row(n: Any, live: dict[int, Any], beat: dict[int, dict[str, Any]] | None) -> dict[str, Any]:
    """One node's row: the provider's word, except a node heard by node 0 and then silent past the heartbeat's
    stale timeout: ``unreachable`` whatever the provider says (not ``running``)."""
    row = {"rank": n.rank, "address": n.address, "zone": n.zone,
           "status": live[n.rank].status if n.rank in live else n.status,
           "detail": live[n.rank].detail if n.rank in live else ""}
    b = (beat or {}).get(n.rank)
    if b is not None:
        age = b["age"]
        row["heartbeat"] = {"word": b["word"], "age_s": None if age is None else round(float(age), 1),
                            "step": b["step"]}
        if b["word"] == "unreachable":
            row["status"], row["detail"] = "unreachable", f"no heartbeat for {float(age):.0f} s (node 0's aggregate)"
    return row


def status(ctx: Context, name: str | None = None, *, refresh: bool = True) -> list[dict[str, Any]]:
    """Clusters from state. With a name (and ``refresh``), the newest job's state is asked of the nodes."""
    if name is not None:
        clusters = [ctx.cluster(name)]
    else:
        clusters = ctx.store.list_clusters()
    out = []
    now = time.time()
    for c in clusters:
        job = ctx.store.latest_job(c.id)
        reading: Any = None
        beat: dict[int, dict[str, Any]] | None = None
        if job is not None and name is not None and refresh and c.status == "up":
            from gtrain.jobs.status import refresh_job
            from gtrain.state import TERMINAL_JOB

            beat = _beats(c, job, ctx)  # node 0's heartbeat aggregate: one request (docs/scale.md)
            # its step and rate, beside the state read: from node 0 (rank 0's metrics) while it beats, or once
            # the job is over (nothing changes on the nodes then; every node asked only when node 0 cannot say)
            over = job.status in TERMINAL_JOB and bool(job.info.get("final"))
            reading = _progress(c, job, ctx, beat is not None or over)
            job = refresh_job(c, job, ctx, act=False)  # read-only: reports, never stops anything
        jobs = ctx.store.jobs(c.id) if name is not None else ([job] if job else [])
        live: dict[int, Any] = {}
        if name is not None and refresh and c.status == "up":
            live = {s.rank: s for s in ctx.provider(c.provider).describe(c)}
        newest: dict[str, Any] = {}  # the newest job's step, rate, ETA and world size (gtrain.runlog.progress)
        if job is not None:
            from gtrain.runlog.progress import fields

            newest = fields(c, job, reading.result() if reading else None,
                            home=ctx.store.home if name is not None else None)
        out.append({
            "name": c.name, "id": c.id, "provider": c.provider, "num_nodes": c.num_nodes,
            # nodes that all stopped themselves (policies.idle_minutes on GCE) make a stopped cluster too
            "status": "stopped" if live and all(s.status == "stopped" for s in live.values()) else c.status,
            "instance_type": c.instance_type, "market": c.market, "region": c.region,
            "price_per_hour": round(c.price_per_hour * c.num_nodes, 4), "created_at": c.created_at,
            "price_source": c.extra.get("price_source"),  # live (...) / estimate (catalog ...): docs/catalog.md
            "uptime_hours": round((now - c.created_at) / 3600, 4),
            "nodes": [_node_row(n, live, beat) for n in ctx.store.nodes(c.id)] if name is not None else None,
            "jobs": [{"id": j.id, "status": j.status, "exit_code": j.exit_code, "created_at": j.created_at,
                      "by": j.info.get("by"),
                      "ended_at": j.ended_at, "run": j.info.get("run"), "attempt": j.info.get("attempt", 1),
                      "recoveries": j.info.get("recoveries") or [],
                      "tracking": j.info.get("tracking_links") or {},
                      **(newest if job is not None and j.id == job.id else {})} for j in jobs if j is not None],
            "recovery": _recovery_note(c, job, ctx) if name is not None and c.status == "up" else None,
            "placement": c.extra.get("any_of"),  # resources.any_of: every candidate and why it was passed over
            "by": c.extra.get("by"),  # who ran `up`: user@host, or the CI run's URL
        })
    return out
