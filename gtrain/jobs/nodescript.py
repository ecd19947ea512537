"""The default job backend: node scripts started detached over the provider's runners.

Right for machines with their own disk reached by a runner (local directories, SSH hosts, cloud VMs). Each
node gets the workdir, its rendered ``launch.sh``/``rank.sh`` (and ``setup.sh``) under ``ROOT/jobs/<id>/``;
``launch.sh`` starts the launcher and writes the node's ``state.json`` and every rank's exit file, so a job's
truth stays on its nodes after the CLI that launched it has gone (see :mod:`gtrain.remote.nodeside`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, GtrainError, RemoteCommandError, RemoteError
from gtrain.events import SILENT, Reporter
from gtrain.jobs.backend import (
    JobBackend,
    JobDescription,
    JobPlan,
    JobRequest,
    JobState,
    LogLine,
    NodeEnded,
    NodeJobStatus,
    RankStatus,
    aggregate,
)
from gtrain.jobs.render import NodeContext, render_all
from gtrain.remote.fanout import parallel
from gtrain.remote.tree import call_all, detached, run_on_nodes, use_tree

if TYPE_CHECKING:
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec, Job
    from gtrain.state import Cluster
    from gtrain.state import Job as JobRecord

DRY_RUN_PORT = 29500
#: how long node 0 may take to hand over its nodes.json (then: every node is asked, as without it)
BEAT_READ_TIMEOUT_S = 10.0
#: one read of node 0's nodes.json serves every caller within this (`status`: the job's state, the node rows,
#: the ssh provider's describe; the watcher: the provider's view and the nodes' own word)
BEAT_READ_TTL_S = 1.0
_beat_reads: dict[tuple[str, str, str], tuple[float, dict[str, Any] | None]] = {}
_beat_lock = threading.Lock()
#: set by :func:`direct_reads`
_beat_direct: contextvars.ContextVar[bool] = contextvars.ContextVar("gtrain_beat_direct", default=False)


def job_dir(runner: Runner, job_id: str) -> str:
    return f"{runner.root}/jobs/{job_id}"


def secret_stdin(job: Job) -> bytes:
    """The job's secrets as ``NAME=value\\0`` pairs, sent on stdin: never written to a node's disk."""
    from gtrain.tracking import secret_names

    return b"".join(f"{n}={os.environ[n]}".encode() + b"\x00" for n in [*job.secrets, *secret_names(job)])


def launcher_of(spec: ClusterSpec, job: Job) -> tuple[str, int, dict[str, Any], list[str]]:
    """The job's launcher, checked (exit 2 naming the field): its name, processes per node (the launcher's
    default: the node's GPUs, else 1; JAX: one per node), its options and the warnings of its check. Every
    backend renders its nodes' commands from these (node scripts here, Slurm's batch script)."""
    from gtrain.jobs.launchers import get_launcher
    from gtrain.spec.launchers import OPTION_MODELS
    from gtrain.spec.torchft import problem

    if found := problem(spec):  # job.fault_tolerance: torchft needs launcher torchrun (and a provider of machines)
        raise ConfigError(found[1], field=found[0])
    launcher = get_launcher(job.launcher)
    nproc = job.nproc_per_node or launcher.default_nproc(job.gpus_per_node or spec.resources.gpus_per_node)
    derived, notes = launcher.check(spec, spec.workdir_path(), nproc)
    block = getattr(job, job.launcher) if job.launcher in OPTION_MODELS else None
    options = {**(block.model_dump() if block is not None else {}), **derived}
    return launcher.name, nproc, options, notes


def node_contexts(cluster: Cluster, spec: ClusterSpec, job: Job, runners: list[Runner], job_id: str,
                  master_port: int) -> list[NodeContext]:
    """Every node's render context."""
    from gtrain import tracking
    from gtrain.spec.checkpoints import run_key
    from gtrain.spec.elastic import rendezvous_settings, torchrun_settings

    name, nproc, options, notes = launcher_of(spec, job)
    elastic: dict[str, Any] = {"max_restarts": job.max_restarts,
                               **(torchrun_settings(spec, cluster.provider) if spec.elastic
                                  else rendezvous_settings(len(runners)))}
    addrs = [r.address for r in runners]
    key = run_key(cluster.name, job.run_id, job.run, job.checkpoint_dir)
    env = {**tracking.env(job, job_id, key), **job.env}
    out = []
    for rank, r in enumerate(runners):
        workdir = f"{r.root}/workdir"
        ctr = container_fields(cluster, spec, job, job_id, rank, workdir, job_dir(r, job_id)) if job.image else {}
        out.append(NodeContext(
            job_id=job_id, cluster=cluster.name, node_rank=rank, num_nodes=len(runners), node_ips=addrs,
            node_addr=r.address, master_addr=addrs[0], master_port=master_port, nproc_per_node=nproc,
            job_dir=job_dir(r, job_id), workdir=workdir, checkpoint_dir=f"{workdir}/{job.checkpoint_dir}",
            python=job.python or ("python3" if job.image else r.python), argv=job.argv,
            env={**spec.resources.accelerator_env(), **env},
            secret_names=[*job.secrets, *tracking.secret_names(job)],
            setup=job.setup, launcher=name, launcher_options=options,
            launcher_notes=notes, checkpoint_store=job.checkpoint_store or "", **ctr,
            checkpoint_env=job.checkpoint_tuning.to_env() if job.checkpoint_tuning else {},
            checkpoint_key=key, **elastic,
        ))
    if job.fault_tolerance == "torchft":  # each node its own replica group; node 0 runs the Lighthouse
        from gtrain.jobs.launchers.torchrun import torchft_fields

        fields, note = torchft_fields(spec, addrs[0], master_port, len(runners), cluster.market)
        for c in out:
            c.fault_tolerance, c.torchft = "torchft", fields
        if note:
            out[0].launcher_notes = [*out[0].launcher_notes, note]
    return out


def container_fields(cluster: Cluster, spec: ClusterSpec, job: Job, job_id: str, rank: int, workdir: str,
                     jdir: str) -> dict[str, Any]:
    """job.image: the node's ``docker run`` for the launcher and for setup (gtrain.containers.runtime)."""
    from gtrain.containers.runtime import container_name, run_argv, vm_runtime

    ckpt = f"{workdir}/{job.checkpoint_dir}"
    mounts = [workdir, jdir] + ([] if ckpt.startswith(workdir + "/") else [ckpt])
    kw: dict[str, Any] = {"cluster": cluster.name, "job_id": job_id, "node_rank": rank,
                          "gpus": spec.resources.gpus_per_node > 0, "mounts": mounts, "workdir": workdir}
    return {"container_argv": run_argv(job, **kw), "container_setup_argv": run_argv(job, **kw, suffix="-setup"),
            "container_runtime": vm_runtime(job), "container_name": container_name(cluster.name, job_id, rank)}


def tracking_links(cluster: Cluster, job: Job) -> dict[str, str]:
    from gtrain.spec.checkpoints import run_key
    from gtrain.tracking import links

    return links(job, run_key(cluster.name, job.run_id, job.run, job.checkpoint_dir))


def read_beats(r: Runner, job_id: str, *, timeout: float = BEAT_READ_TIMEOUT_S,
               folder: str | None = None) -> dict[str, Any] | None:
    """Node 0's ``JOB/nodes.json`` (gtrain.remote.nodebeat.read: the document, node 0's clock, whether its
    aggregator runs) in one request over ``r`` (node 0's runner); None when node 0 did not answer. Read once
    per :data:`BEAT_READ_TTL_S` whoever asks."""
    import json
    import time

    from gtrain.jobs.templating import nodebeat_source
    from gtrain.remote import nodebeat
    from gtrain.remote.local import LocalRunner

    folder = folder or job_dir(r, job_id)  # else the hosts' own beat (gtrain.providers.ssh.read_pulse)
    key = (str(r.address), str(r.root), job_id or folder)
    with _beat_lock:
        got = _beat_reads.get(key)
        if got is not None and time.monotonic() - got[0] < BEAT_READ_TTL_S:
            return got[1]
    answer: dict[str, Any] | None
    if isinstance(r, LocalRunner):  # this machine's folders: read in-process, as LocalRunner.call does
        answer = dict(nodebeat.read(folder))
    else:
        try:
            res = r.run_python(nodebeat_source(), ["read", folder], timeout=timeout)
            doc = json.loads(res.stdout)
            answer = doc if isinstance(doc, dict) else None
        except (GtrainError, OSError, ValueError):
            answer = None
    with _beat_lock:
        _beat_reads[key] = (time.monotonic(), answer)
    return answer


@contextlib.contextmanager
def direct_reads() -> Iterator[None]:
    """Within it (this thread), :func:`beats` gives None: every node is asked itself, the provider's describe
    included. For reads a decision stands on (gtrain.runs.recovery.observe): a relayed word is the node's last
    beat, up to two beats old, so a node killed within them still reads as running."""
    token = _beat_direct.set(True)
    try:
        yield
    finally:
        _beat_direct.reset(token)


def direct_only() -> bool:
    """Whether this thread is inside :func:`direct_reads` (no relayed word may stand for a node)."""
    return bool(_beat_direct.get())


def forget_beats(job_id: str) -> None:
    """Drop the reads of ``job_id``'s aggregate kept for :data:`BEAT_READ_TTL_S`: the job is being stopped, and
    a read from before the stop must not stand for the nodes after it (a recovery's decision read a cached
    "both running" of two nodes just stopped and killed, and did not recover)."""
    with _beat_lock:
        for key in [k for k in _beat_reads if k[2] == job_id]:
            del _beat_reads[key]


def beats(runners: list[Runner], job: JobRecord) -> dict[int, dict[str, Any]] | None:
    """Each node's word from node 0's heartbeat aggregate (gtrain.remote.nodebeat.derive: ``running``,
    ``pending``, ``dead``, an end's state, ``unreachable`` when heard and then silent past the stale timeout,
    ``unheard``); None when it cannot be used (no answer, none kept, its aggregator gone): ask every node."""
    from gtrain.remote import nodebeat

    if not runners or _beat_direct.get():
        return None
    return nodebeat.derive(read_beats(runners[0], job.id), job_id=job.id, num_nodes=len(runners),
                           stale=nodebeat.stale_s(), attempt=job.info.get("attempt", 1))


class NodeScriptBackend(JobBackend):
    name = "node-script"

    def __init__(self, provider: Any, cluster: Cluster) -> None:
        super().__init__(provider, cluster)
        self._runners: list[Runner] | None = None
        self._runners_lock = threading.Lock()
        from gtrain.remote.fanout import window_size

        #: how many of this backend's log streams may be opening their node's connection at once
        self._connect_slots = threading.BoundedSemaphore(window_size())

    @property
    def runners(self) -> list[Runner]:
        """The nodes' runners, made once: every follower thread asks at once (1,000 streams each made all 1,000
        runners from the state, 35% of a 1,000-node `logs`' CPU and ~800 MB, until this lock)."""
        if self._runners is None:
            with self._runners_lock:
                if self._runners is None:
                    self._runners = self.provider.runners(self.cluster)
        return self._runners

    # ---- plan and submit -------------------------------------------------------------------------

    def reserve(self, request: JobRequest) -> JobRequest:
        request.master_port = int(self.runners[0].call("free_port"))
        return request

    def dryrun(self, request: JobRequest) -> JobPlan:
        job = request.spec.job
        assert job is not None  # checked by jobs.launch.check_job
        port = request.master_port or DRY_RUN_PORT
        ctxs = node_contexts(self.cluster, request.spec, job, self.runners, request.job_id, port)
        master = f"{ctxs[0].master_addr}:{port}"
        info = {"run": job.run, "argv": job.argv, "nproc_per_node": ctxs[0].nproc_per_node,
                "num_nodes": len(ctxs), "master": master, "checkpoint_dir": job.checkpoint_dir,
                "workdir": request.workdir, "env_names": sorted(job.env), "secret_names": list(job.secrets),
                "backend": self.name, "tracking_links": tracking_links(self.cluster, job)}
        return JobPlan(request, {c.node_rank: render_all(c) for c in ctxs}, info, {"contexts": ctxs})

    def submit(self, plan: JobPlan, report: Reporter | None = None, nodes: list[int] | None = None) -> str:
        """Start the job on every node (``nodes``: on those only -- an elastic run's replacement joining)."""
        from gtrain.sync.workdir import list_workdir

        rep = report or SILENT
        job = plan.request.spec.job
        assert job is not None
        runners, ctxs = self.runners, plan.private["contexts"]
        picked = list(range(len(runners))) if nodes is None else list(nodes)
        local = Path(plan.request.workdir)
        try:
            files = list_workdir(local)
            secret_in = secret_stdin(job)
            if job.image:  # once per node, before anything of the job starts; a failure starts nothing
                from gtrain.containers.pull import pull_all

                pull_all(job, [runners[i] for i in picked], rep)

            def prepare(i: int) -> None:
                r, c = runners[i], ctxs[i]  # the folders and every node script in one command
                r.write_files({f"{c.job_dir}/{name}": text.encode() for name, text in plan.files[i].items()},
                              0o700, folders=[c.workdir, f"{c.job_dir}/logs"])

            parallel(prepare, picked)
            from gtrain.jobs.workdir import ship_workdir  # pushed below a few nodes, else one bundle pulled

            ship_workdir(job, runners, ctxs, picked, local, files, secret_in, rep)
            if job.data:
                from gtrain.jobs.data import fetch_data

                fetch_data(job, [runners[i] for i in picked], [ctxs[i] for i in picked], secret_in, rep)
            if job.setup:
                rep.info("running setup on every node" if nodes is None else f"running setup on node(s) {picked}")
                parallel(lambda i: self._setup(i, ctxs[i], secret_in, rep), picked)

            def start(i: int) -> None:
                q = shlex.quote(ctxs[i].job_dir)
                runners[i].start_detached(f"exec bash {q}/launch.sh >{q}/node.log 2>&1", stdin=secret_in)

            if use_tree([runners[i] for i in picked]):  # many nodes: through relays, at most once per node
                once = os.urandom(6).hex()  # this submit's: a later one (a relaunch) starts again
                cmds = [detached(f"exec bash {shlex.quote(ctxs[i].job_dir)}/launch.sh >{shlex.quote(ctxs[i].job_dir)}"
                                 "/node.log 2>&1", True) for i in picked]
                got = run_on_nodes([runners[i] for i in picked], cmds, stdin=[secret_in] * len(picked),
                                   timeout=60, once=[f"{ctxs[i].job_dir}/.started-{once}" for i in picked])
                for i, g in zip(picked, got, strict=True):
                    if g.error is not None or g.rc != 0:
                        raise RemoteCommandError(runners[i].label, "start launch.sh", g.rc if g.rc is not None
                                                 else 255, g.error or g.stderr)
            else:
                parallel(start, picked)
        except BaseException:
            # don't leave half a job behind on the nodes that did start
            try:
                parallel(lambda r: _stop_node(r, job_dir(r, plan.job_id), 2), [runners[i] for i in picked])
            except Exception:  # noqa: BLE001 - best effort; the original error is what matters
                pass
            raise
        return plan.job_id

    def _setup(self, i: int, c: NodeContext, secret_in: bytes, rep: Reporter) -> None:
        r = self.runners[i]
        tail: list[str] = []

        def on_line(text: str) -> None:
            tail.append(text)
            del tail[:-30]
            rep.line(i, None, text)

        cmd = f"bash {shlex.quote(c.job_dir)}/setup.sh"
        if c.container_setup_argv:  # job.image: setup runs inside the image (secrets on stdin, as without)
            cmd = f"{shlex.join(c.container_setup_argv)} {cmd}"
        rc = r.stream(cmd, on_line, stdin=secret_in)
        if rc != 0:
            raise RemoteCommandError(r.label, "job.setup", rc, "\n".join(tail))

    # ---- the truth from the nodes ----------------------------------------------------------------

    def _node_state(self, i: int, job_id: str) -> dict[str, Any]:
        r = self.runners[i]
        try:
            return dict(r.call("job_state", job_dir(r, job_id), timeout=60))
        except RemoteError as e:
            return {"state": "unreachable", "error": e.message, "ranks": {}}

    def describe(self, job: JobRecord, nodes: list[int] | None = None) -> JobDescription:
        picked = list(range(len(self.runners))) if nodes is None else nodes
        rs = [self.runners[i] for i in picked]
        if use_tree(rs):  # many nodes: through relays (gtrain/remote/tree.py), one answer per node
            raws = [g if isinstance(g, dict) else {"state": "unreachable", "error": g.message, "ranks": {}}
                    for g in call_all(rs, "job_state", [[job_dir(r, job.id)] for r in rs], timeout=60)]
        else:
            raws = parallel(lambda i: self._node_state(i, job.id), picked)
        statuses = [node_status(i, raw) for i, raw in zip(picked, raws, strict=True)]
        state, code = aggregate(statuses)
        return JobDescription(job.id, state, code, statuses)

    def describe_from_beats(self, job: JobRecord) -> JobDescription:
        """:meth:`describe` in one request while the job runs: the nodes that node 0's aggregate says run, heard
        within two beats (``nodebeat.on_time``), as their last beat said (their ended ranks included); every
        other node (late, silent, never heard, pending, ended, dead) asked itself as :meth:`describe` does.
        Without an aggregate (an older job, node 0 not answering, its aggregator gone): :meth:`describe`. A
        node's beat goes out at once when its state changes (half a second), else every
        ``GTRAIN_HEARTBEAT_S``: for reading (`status`); a caller acting on the job (fail-fast) asks
        :meth:`describe`."""
        from gtrain.remote.nodebeat import on_time

        got = beats(self.runners, job)
        if got is None:
            return self.describe(job)
        known = {i: b for i, b in got.items() if b["word"] == "running" and on_time(b)}
        rest = [i for i in range(len(self.runners)) if i not in known]
        asked = dict(zip(rest, parallel(lambda i: self._node_state(i, job.id), rest), strict=True)) if rest else {}
        statuses = []
        for i in range(len(self.runners)):
            if i in asked:
                statuses.append(node_status(i, asked[i]))
                continue
            entry = known[i]["entry"]
            statuses.append(node_status(i, {"state": "running", "exit_code": None,
                                            "ranks": entry.get("exits") if isinstance(entry.get("exits"), dict)
                                            else {}, "via": "heartbeat", "heartbeat_age": known[i]["age"],
                                            "step": known[i]["step"]}))
        state, code = aggregate(statuses)
        return JobDescription(job.id, state, code, statuses)

    def cancel(self, job: JobRecord, nodes: list[int] | None = None, grace_s: float = 10) -> None:
        picked = list(range(len(self.runners))) if nodes is None else nodes

        def one(i: int) -> None:
            r = self.runners[i]
            try:
                _stop_node(r, job_dir(r, job.id), grace_s)
            except RemoteError:
                pass  # unreachable now: the state read that follows reports it

        try:
            parallel(one, picked)
        finally:  # what node 0's aggregate said before the stop is not what the nodes say after it
            forget_beats(job.id)

    # ---- output ----------------------------------------------------------------------------------

    def log_iter(self, job: JobRecord, node: int, rank: int | None = None, *, follow: bool = False,
                 tail: int | None = None, since: int = 0) -> Iterator[LogLine | NodeEnded]:
        import json

        r = self.runners[node]
        cmd, stdin = r.follow_command(job_dir(r, job.id), follow=follow, tail=tail)
        q: queue.Queue[tuple[str, Any]] = queue.Queue()

        def on_raw(raw: str) -> None:
            if raw.startswith("\x00END\t"):
                q.put(("end", raw.split("\t", 1)[1]))
                return
            tag, _, text = raw.partition("\t")
            q.put(("line", (None if tag == "-" else int(tag) if tag.isdigit() else None, text)))

        def pump() -> None:
            try:
                if hasattr(r, "connect"):  # every follower thread starts at once: connect within the fan-out's
                    with self._connect_slots:  # window (1,000 at once left 199 of 1,000 nodes unreached)
                        r.connect()
                r.stream(cmd, on_raw, stdin=stdin)
            except GtrainError as e:
                q.put(("error", e.message))
            finally:
                q.put(("done", None))

        threading.Thread(target=pump, daemon=True, name=f"gtrain-logs-{node}").start()
        seen = 0
        while True:
            kind, payload = q.get()
            if kind == "line":
                r_rank, text = payload
                seen += 1
                if seen > since and (rank is None or r_rank == rank):
                    yield LogLine(node, r_rank, text)
            elif kind == "end":
                try:
                    doc = json.loads(payload)
                except ValueError:
                    doc = None
                doc = doc if isinstance(doc, dict) else None
                word = doc.get("state") if doc is not None else "unknown"
                # nodeside.follow's END carries its job_state document: the node's own word, as describe asks it
                yield NodeEnded(node, JobState.parse(word), str(word),
                                status=node_status(node, doc) if doc is not None else None)
            elif kind == "error":
                yield NodeEnded(node, JobState.UNKNOWN, "unreachable", payload)
            elif kind == "done":
                return


def _stop_node(r: Runner, jdir: str, grace_s: float) -> None:
    """Stop the job on one node, then remove its container (job.image) whatever was left of its launcher."""
    from gtrain.containers.runtime import cleanup_command

    r.call("cancel", jdir, str(int(grace_s)), timeout=60 + grace_s)
    r.run(cleanup_command(jdir), timeout=120, check=False)


def node_status(i: int, raw: dict[str, Any]) -> NodeJobStatus:
    """One node's ``job_state`` document as a typed status."""
    word = str(raw.get("state"))
    ranks = [RankStatus(int(k), JobState.SUCCEEDED if int(v[0]) == 0 else JobState.FAILED, int(v[0]), float(v[1]))
             for k, v in sorted((raw.get("ranks") or {}).items(), key=lambda kv: int(kv[0]))]
    code = raw.get("exit_code")
    return NodeJobStatus(i, JobState.parse(word), code if isinstance(code, int) else None, word, raw.get("error"),
                         ranks, bool(raw.get("orphans")), raw)
