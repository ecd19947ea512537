"""gtrain's Python API. The CLI is a thin layer over these functions.

    import gtrain
    res = gtrain.up("spec.yaml")
    job = gtrain.launch(cluster="demo")
    final = gtrain.wait("demo", on_line=print)
    gtrain.pull("demo", to="ckpts")
    report = gtrain.down("demo")

Every function takes an optional :class:`~gtrain.events.Reporter` for progress and raises
:mod:`gtrain.errors` exceptions; none prints.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.events import SILENT, Reporter

if TYPE_CHECKING:
    from collections.abc import Callable

    from gtrain.context import Context
    from gtrain.costs.report import CostReport
    from gtrain.jobs.backend import LogLine
    from gtrain.runs.cluster import DownResult, UpResult
    from gtrain.runs.launch import LaunchResult
    from gtrain.spec import ClusterSpec
    from gtrain.state import Job
    from gtrain.sync.pull import PullResult

SpecLike = "ClusterSpec | str | os.PathLike[str]"


def _ctx(report: Reporter | None) -> Context:
    from gtrain.context import Context

    return Context(report=report or SILENT)


def _spec(spec: Any, name: str | None = None) -> ClusterSpec:
    from gtrain.spec import ClusterSpec, load_spec

    if isinstance(spec, ClusterSpec):
        return spec.model_copy(update={"name": name}) if name else spec
    return load_spec(spec, name=name)


def up(spec: Any, *, name: str | None = None, dry_run: bool = False, keep_failed: bool = False,
       recreate: bool = False, report: Reporter | None = None) -> UpResult:
    """Provision the cluster. A failed or interrupted up deletes what it made unless ``keep_failed``; a
    cluster that is up with another shape is refused unless ``recreate`` (down, then up)."""
    from gtrain.runs import cluster

    ctx = _ctx(report)
    try:
        return cluster.up(_spec(spec, name), ctx, dry_run=dry_run, keep_failed=keep_failed, recreate=recreate)
    finally:
        ctx.store.close()


def launch(spec: Any = None, *, cluster: str | None = None, name: str | None = None, force: bool = False,
           dry_run: bool = False, replace_bad: bool = False, fresh: bool = False, queue: bool = False,
           priority: int | None = None, report: Reporter | None = None) -> LaunchResult:
    from gtrain.errors import ConfigError
    from gtrain.runs import launch as jobs

    ctx = _ctx(report)
    try:
        if spec is None and cluster is None:
            raise ConfigError("give a SPEC or --cluster NAME", field="SPEC")
        parsed = _spec(spec, name or cluster) if spec is not None else None
        cname = cluster or (parsed.name if parsed else None)
        assert cname is not None
        c = ctx.cluster(cname)
        if parsed is None:
            parsed = ctx.spec_of(c)
        elif parsed.resources.any_of and c.extra.get("any_of"):  # the candidate it landed on, with this job
            parsed = ctx.spec_of(c).model_copy(update={"job": parsed.job, "base_dir": parsed.base_dir})
        elif parsed.provider != c.provider or not (parsed.min_nodes or parsed.num_nodes) <= c.num_nodes <= \
                parsed.num_nodes:  # an elastic cluster may have min..max nodes now
            raise ConfigError(f"num_nodes: the spec asks for {parsed.num_nodes} {parsed.provider} node(s), cluster "
                              f"{c.name!r} has {c.num_nodes} {c.provider} node(s)", field="num_nodes",
                              hint="`gtrain up --recreate` to reshape it, or launch with the spec it was made from")
        return jobs.launch(c, parsed, ctx, force=force, dry_run=dry_run, replace_bad=replace_bad, fresh=fresh,
                           queue=queue, priority=priority)
    finally:
        ctx.store.close()


def preview(spec: Any, *, name: str | None = None, report: Reporter | None = None) -> Any:
    """A job before its cluster exists: the plan, the price and every node's rendered scripts; touches nothing."""
    from gtrain.runs.preview import preview as job_preview

    ctx = _ctx(report)
    try:
        return job_preview(_spec(spec, name), ctx)
    finally:
        ctx.store.close()


def logs(cluster: str, *, job_id: str | None = None, follow: bool = False, tail: int | None = None,
         node: int | None = None, rank: int | None = None, on_line: Callable[[LogLine], None] | None = None,
         report: Reporter | None = None) -> Job:
    from gtrain.errors import ConfigError
    from gtrain.jobs.status import resolve_job
    from gtrain.runs.follow import follow as follow_job

    ctx = _ctx(report)
    try:
        gone = ctx.store.find_cluster(cluster)
        if gone is not None and gone.status in ("terminated", "stopped"):  # the lines kept at `down` / `stop`
            from gtrain.runlog import archive

            return archive.logs_from_archive(ctx.store, cluster, job_id=job_id, on_line=on_line, node=node,
                                             rank=rank, tail=tail)
        c = ctx.cluster(cluster)
        if node is not None and not 0 <= node < c.num_nodes:
            raise ConfigError(f"--node {node}: cluster {cluster} has nodes 0..{c.num_nodes - 1}", field="--node")
        if rank is not None and rank < 0:
            raise ConfigError(f"--rank {rank}: ranks count from 0", field="--rank")
        if tail is not None and tail < 0:
            raise ConfigError(f"--tail {tail}: give a number of lines, 0 or more", field="--tail")
        job = resolve_job(c, ctx, job_id)
        if follow:  # whoever waits on a job recovers it from a lost node, as its policy says
            from gtrain.runs.notify import ended
            from gtrain.runs.recovery import wait as wait_recovering

            job = wait_recovering(c, job, ctx, on_line or (lambda _line: None), tail=tail,
                                  nodes=None if node is None else [node], rank=rank)
            if node is None and rank is None:  # a follower of the whole job tells notify.on of its end
                from gtrain.state import TERMINAL_JOB
                from gtrain.tracking import finish_mlflow_run

                ended(ctx.store.get_cluster_by_id(c.id), job, ctx)
                if job.status in TERMINAL_JOB:
                    finish_mlflow_run((job.info.get("spec") or {}).get("job"), job.status)
            return job
        return follow_job(c, job, ctx, on_line or (lambda _line: None), follow=follow, tail=tail,
                           nodes=None if node is None else [node], rank=rank)
    finally:
        ctx.store.close()


def wait(cluster: str, *, job_id: str | None = None, on_line: Callable[[LogLine], None] | None = None,
         report: Reporter | None = None) -> Job:
    """Follow a job to its end; the returned record's ``exit_code`` is the job's own."""
    return logs(cluster, job_id=job_id, follow=True, on_line=on_line, report=report)


def watch(cluster: str, *, job_id: str | None = None, on_line: Callable[[LogLine], None] | None = None,
          report: Reporter | None = None) -> Job:
    """Follow the cluster's job (default: its newest) to its end, recovering it from lost nodes as its
    ``policies.recovery`` says; a recovery a killed watcher left halfway is continued, not redone."""
    return logs(cluster, job_id=job_id, follow=True, on_line=on_line, report=report)


def pull(cluster: str, *, job_id: str | None = None, to: str | os.PathLike[str] | None = None,
         node: int | None = None, report: Reporter | None = None) -> PullResult:
    from gtrain.checkpoints.store import LinkInDest
    from gtrain.errors import ConfigError, GtrainError
    from gtrain.jobs.status import resolve_job
    from gtrain.sync.pull import default_pull_dest, pull_dir

    ctx = _ctx(report)
    try:
        c = ctx.cluster(cluster)
        runners = ctx.runners(c)
        if node is not None and not 0 <= node < len(runners):
            raise ConfigError(f"--node {node}: cluster {cluster} has nodes 0..{len(runners) - 1}", field="--node")
        job = ctx.store.latest_job(c.id) if job_id is None else resolve_job(c, ctx, job_id)
        if job is not None:
            ckpt = str(job.info.get("checkpoint_dir") or "checkpoints")
        else:
            spec = ctx.spec_of(c)
            ckpt = spec.job.checkpoint_dir if spec.job else "checkpoints"
        dest = Path(to) if to else default_pull_dest(cluster, ckpt)
        if job is not None and job.info.get("checkpoint_store") and node is None:
            from gtrain.checkpoints.pull import StoreHasNoCheckpoint, pull_from_store, store_key

            ctx.report.info(f"pulling {ckpt}/ from the store {job.info['checkpoint_store']}/{store_key(job)} to "
                            f"{dest}")
            try:
                got = pull_from_store(job, dest, ctx.report)
                now = ctx.store.get_job(job.id)  # where the run's checkpoints go: down pulls the nodes' there too
                ctx.store.update_job(job.id, status=now.status, exit_code=now.exit_code,
                                     info={**now.info, "pulled_to": str(got.dest)})
                return got
            except LinkInDest:
                raise
            except GtrainError as e:  # nothing (or nothing intact) reached the store, or it cannot be read: the
                if not runners:       # nodes may hold the only copy
                    raise
                ctx.report.warn(f"{e.message if isinstance(e, StoreHasNoCheckpoint) else f'the store: {e.message}'}"
                                "; pulling what the nodes hold instead")
        if not ctx.provider(c.provider).node_disks_outlive_jobs and (job is None or _ended(job.status)):
            from gtrain.sync.pull import PullResult  # nothing is left on the nodes: no folder is made

            ctx.report.warn(f"nothing to pull: the disks of provider {c.provider}'s nodes ended with the job "
                            "(checkpoints leave through job.checkpoint_store)")
            return PullResult("", [])  # dest "": nothing was pulled, no folder was made
        picked = range(len(runners)) if node is None else [node]
        ctx.report.info(f"pulling {ckpt}/ from {'every node' if node is None else f'node {node}'} to {dest}")
        res = pull_dir([(i, runners[i], f"{runners[i].root}/workdir/{ckpt}") for i in picked], dest,
                       report=ctx.report)
        if job is not None:  # the report of the run goes next to its checkpoints
            now = ctx.store.get_job(job.id)
            ctx.store.update_job(job.id, status=now.status, exit_code=now.exit_code,
                                 info={**now.info, "pulled_to": str(res.dest)})
        return res
    finally:
        ctx.store.close()


def _ended(status: str) -> bool:
    from gtrain.jobs.backend import JobState

    try:
        return JobState(status).terminal
    except ValueError:
        return False


def down(cluster: str, *, yes: bool = False, report: Reporter | None = None, html_report: bool = False) -> DownResult:
    """Stop jobs and delete the cluster, and price it. With a checkpoint store, refused unless ``yes`` when the
    newest checkpoint on the nodes is not safely in the store. With ``html_report``, also write the newest job's
    HTML report (next to where its checkpoints were pulled, else in the run archive)."""
    from gtrain.runs import cluster as cl

    ctx = _ctx(report)
    try:
        res = cl.down(cluster, ctx, yes=yes)
        if html_report and not res.already_down:
            res.report = _html_report(ctx, cluster, None)
        return res
    finally:
        ctx.store.close()


def stop(cluster: str, *, report: Reporter | None = None) -> Any:
    """Stop a VM cluster's nodes, keeping their disks (``gtrain stop``): compute billing ends, disks bill on."""
    from gtrain.runs import stopstart

    ctx = _ctx(report)
    try:
        return stopstart.stop(cluster, ctx)
    finally:
        ctx.store.close()


def start(cluster: str, *, report: Reporter | None = None) -> Any:
    """Start a stopped VM cluster's nodes again (``gtrain start``); jobs can be launched once it returns."""
    from gtrain.runs import stopstart

    ctx = _ctx(report)
    try:
        return stopstart.start(cluster, ctx)
    finally:
        ctx.store.close()


def _html_report(ctx: Context, cluster: str, job_id: str | None, next_to: Path | None = None) -> str | None:
    """Write the job's report (``gtrain report``'s file); a failure is a warning, never the command's."""
    from gtrain.errors import GtrainError
    from gtrain.runlog import archive
    from gtrain.runlog.service import write_report

    try:
        c = archive.find_cluster(ctx.store, cluster)
        job = archive.find_job(ctx.store, c, job_id)
        pulled = job.info.get("pulled_to")
        if next_to is None and pulled:
            next_to = Path(str(pulled))
        out = None if next_to is not None else archive.job_dir(ctx.store.home, c.id, job.id) / "report.html"
        return str(write_report(ctx, c, job, out, next_to=next_to, fresh=False))
    except (GtrainError, OSError, ValueError) as e:
        ctx.report.warn(f"no report written: {getattr(e, 'message', e)}")
        return None


def status(cluster: str | None = None, *, refresh: bool = True, report: Reporter | None = None) -> list[dict[str, Any]]:
    from gtrain.runs import cluster as cl

    ctx = _ctx(report)
    try:
        return cl.status(ctx, cluster, refresh=refresh)
    finally:
        ctx.store.close()


def cost(*, report: Reporter | None = None) -> list[CostReport]:
    from gtrain.costs.report import history

    ctx = _ctx(report)
    try:
        return history(ctx.store, ctx.provider)
    finally:
        ctx.store.close()


@dataclass
class RunResult:
    cluster: str
    job_id: str | None = None
    exit_code: int | None = None
    status: str | None = None
    pulled: PullResult | None = None
    down: DownResult | None = None
    errors: list[str] = field(default_factory=list)
    report: str | None = None
    #: each recovery from a lost node (gtrain.runs.recovery), and why the run stopped recovering
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    recovery_stopped: str | None = None
    #: the rank that failed first: ``{node, rank, exit_code}`` (None when nothing failed)
    failed_first: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster, "job_id": self.job_id, "exit_code": self.exit_code, "status": self.status,
            "failed_first": self.failed_first,
            "pulled": self.pulled.to_dict() if self.pulled else None,
            "down": self.down.to_dict() if self.down else None, "errors": self.errors, "report": self.report,
            "recoveries": self.recoveries, "recovery_stopped": self.recovery_stopped,
        }


def run(spec: Any, *, name: str | None = None, keep: bool = False, to: str | os.PathLike[str] | None = None,
        on_line: Callable[[LogLine], None] | None = None, report: Reporter | None = None,
        html_report: bool = False, replace_bad: bool = False, fresh: bool = False) -> RunResult:
    """up + launch + wait + pull + down. The cluster is torn down whatever happens (unless ``keep``),
    Ctrl+C included, so nothing is left running that nobody watches."""
    from gtrain.errors import GtrainError
    from gtrain.runs.launch import check_job

    parsed = _spec(spec, name)
    check_job(parsed)  # bad workdir / script / secrets: exit 2 before anything is created
    if replace_bad:
        from gtrain.providers import provider_class
        from gtrain.providers.base import cannot_replace

        if not provider_class(parsed.provider).can_replace_nodes:
            raise cannot_replace(parsed.provider)
    from gtrain.sync.pull import check_dest, default_pull_dest

    ckpt = parsed.job.checkpoint_dir if parsed.job else "checkpoints"
    check_dest(Path(to) if to else default_pull_dest(parsed.name, ckpt))  # before anything is created
    res = RunResult(parsed.name)
    rep = report or SILENT
    created = False
    pull_failed = False
    try:
        created = up(parsed, report=rep).created
        launched = launch(parsed, replace_bad=replace_bad, fresh=fresh, report=rep)
        res.job_id = launched.job_id
        final = wait(parsed.name, job_id=launched.job_id, on_line=on_line, report=rep)
        res.exit_code, res.status = final.exit_code, final.status
        res.recoveries = list(final.info.get("recoveries") or [])
        res.recovery_stopped = final.info.get("recovery_stopped")
        res.failed_first = final.info.get("failed_first") if final.exit_code else None  # not an earlier attempt's
        try:
            res.pulled = pull(parsed.name, job_id=launched.job_id, to=to, report=rep)
        except GtrainError as e:  # the nodes may hold the only copy: keep them, and do not exit 0
            pull_failed = True
            res.errors.append(f"pull: {e.message}")
            rep.warn(res.errors[-1])
            if not keep and (created or res.job_id):
                rep.warn(f"cluster {parsed.name} kept up: its checkpoints are not safe elsewhere; "
                         f"`gtrain pull {parsed.name} --to DIR`, then `gtrain down {parsed.name}`")
            if not res.exit_code:
                res.exit_code = 1
    except KeyboardInterrupt as exc:  # Ctrl+C, SIGTERM, SIGHUP: tear down, and say what it cost
        res.status = "interrupted"
        if not keep and (created or res.job_id):
            rep.warn("interrupted: tearing the cluster down")
            res.down = down(parsed.name, yes=True, report=rep)
        exc.run_result = res  # type: ignore[attr-defined]  # the CLI prints the cost report from it
        raise
    finally:
        if (not keep and not pull_failed and (created or res.job_id) and res.down is None
                and res.status != "interrupted"):
            try:  # down pulls what is only on the nodes first; when it cannot, it keeps them
                res.down = down(parsed.name, yes=True, report=rep)
            except GtrainError as e:
                res.errors.append(f"down: {e.message}")
                rep.warn(f"{res.errors[-1]}; cluster {parsed.name} kept up")
                if not res.exit_code:
                    res.exit_code = 1
    if html_report and res.job_id:  # next to the pulled checkpoints (`gtrain run` writes it unless --no-report)
        ctx = _ctx(rep)
        try:
            pulled_to = Path(res.pulled.dest) if res.pulled and res.pulled.dest else None
            res.report = _html_report(ctx, parsed.name, res.job_id, pulled_to)
        finally:
            ctx.store.close()
    return res


@dataclass
class CancelResult:
    cluster: str
    job_id: str
    status: str
    exit_code: int | None
    was_running: bool

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "job_id": self.job_id, "status": self.status, "exit_code": self.exit_code,
                "was_running": self.was_running}


def cancel(cluster: str, *, job_id: str | None = None, report: Reporter | None = None) -> CancelResult:
    """Stop a job (default: the cluster's newest) and everything it started; the cluster stays up, and so do
    its checkpoints. Cancelling a job that has ended changes nothing (``was_running`` is False)."""
    from gtrain.jobs.status import cancel_job, refresh_job, resolve_job
    from gtrain.state import TERMINAL_JOB

    ctx = _ctx(report)
    try:
        c = ctx.cluster(cluster)
        job = refresh_job(c, resolve_job(c, ctx, job_id), ctx, act=False)
        was_running = job.status not in TERMINAL_JOB
        if was_running:
            ctx.report.info(f"cancelling {job.id}")
            job = cancel_job(c, job, ctx)
        return CancelResult(c.name, job.id, job.status, job.exit_code, was_running)
    finally:
        ctx.store.close()


def exec_command(cluster: str, command: str, *, node: int | None = None,
                 on_line: Callable[[LogLine], None] | None = None, report: Reporter | None = None) -> dict[int, int]:
    """Run a shell command on every node (or one), in parallel, streaming lines. Returns node -> exit code."""
    from gtrain.errors import ConfigError
    from gtrain.jobs.backend import LogLine
    from gtrain.remote.tree import exec_each  # flat, or through relays above the threshold

    ctx = _ctx(report)
    try:
        c = ctx.cluster(cluster)
        from gtrain.runs.stopstart import refuse_stopped

        refuse_stopped(c, "gtrain exec")
        runners = ctx.runners(c)
        if node is not None and not 0 <= node < len(runners):
            raise ConfigError(f"--node {node}: cluster {cluster} has nodes 0..{len(runners) - 1}", field="--node")
        picked = list(range(len(runners))) if node is None else [node]
        emit = on_line or (lambda _line: None)
        job = ctx.store.latest_job(c.id)
        ckpt = str(job.info.get("checkpoint_dir")) if job and job.info.get("checkpoint_dir") else None
        if ckpt is None:
            spec = ctx.spec_of(c)
            ckpt = spec.job.checkpoint_dir if spec.job else "checkpoints"
        addrs = [r.address for r in runners]

        def node_env(i: int) -> str:
            """The node's part of the env contract (docs/spec.md), as the job's ranks see it."""
            root = runners[i].root
            env = {"GTRAIN_CLUSTER": c.name, "GTRAIN_NODE_RANK": str(i), "GTRAIN_NUM_NODES": str(len(runners)),
                   "GTRAIN_NODE_IPS": ",".join(addrs), "GTRAIN_MASTER_ADDR": addrs[0],
                   "GTRAIN_WORKDIR": f"{root}/workdir", "GTRAIN_CHECKPOINT_DIR": f"{root}/workdir/{ckpt}"}
            if job is not None:
                env["GTRAIN_JOB_ID"] = job.id
            return "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())

        def cmd(i: int) -> str:
            return f"{node_env(i)}cd {shlex.quote(runners[i].root)}/workdir 2>/dev/null; {command}"

        # each node's lines as they come (flat), or once it is done (relays); 255: a node not reached (as ssh)
        return dict(zip(picked, exec_each(runners, picked, cmd, lambda i, text: emit(LogLine(i, None, text)),
                                          lambda i, msg: ctx.report.warn(f"node {i}: {msg}")), strict=True))
    finally:
        ctx.store.close()


def shell_argv(cluster: str, *, node: int = 0) -> tuple[list[str], str | None]:
    """The argv (and cwd) of an interactive shell on a node, as its provider reaches it
    (``Provider.interactive_argv``): ``ssh -F $GTRAIN_HOME/ssh/config <cluster>-<k>`` for SSH nodes, a login
    shell in the node's directory for local ones."""
    from gtrain.errors import ConfigError

    ctx = _ctx(None)
    try:
        c = ctx.cluster(cluster)
        from gtrain.runs.stopstart import refuse_stopped

        refuse_stopped(c, "gtrain ssh")
        nodes = ctx.nodes(c)
        if not 0 <= node < len(nodes):
            raise ConfigError(f"--node {node}: cluster {cluster} has nodes 0..{len(nodes) - 1}", field="--node")
        return ctx.provider(c.provider).interactive_argv(c, nodes[node])
    finally:
        ctx.store.close()
