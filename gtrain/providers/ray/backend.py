"""The Ray job backend: one Ray job per launch, submitted over the Jobs REST API (see
:mod:`gtrain.providers.ray.driver` for what runs on the cluster).

``dryrun`` renders every node's scripts from the shared templates (the same launcher lines as every other
backend; bundle K's node IP filled in by the driver once the placement group is placed) and the job's
submission; ``submit`` zips the workdir with the scripts and the driver, uploads it as the job's
``working_dir`` and submits the job, the secrets in a one-off GCS package the driver reads and deletes (never in its
runtime_env); ``describe`` reads the job's
status and its driver's ``[gtrain]`` lines; ``log_iter`` reads the job's log, rank-prefixed lines; ``cancel``
stops the job and waits until none of its actors is alive. See docs/providers/ray.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, ProviderError
from gtrain.events import SILENT, Reporter
from gtrain.jobs.backend import (
    JobBackend,
    JobDescription,
    JobPlan,
    JobRequest,
    JobState,
    LogLine,
    NodeEnded,
    aggregate,
)
from gtrain.jobs.render import NodeContext
from gtrain.providers.ray import states
from gtrain.providers.ray.api import RayAPI, stop_job
from gtrain.spec.queue import job_gpus

if TYPE_CHECKING:
    from gtrain.providers.ray.execjob import RayExec
    from gtrain.state import Job as JobRecord

DRIVER = "_gtrain/driver.py"
#: Ray keeps a working_dir package in its GCS, bounded by the gRPC message size (ray's packaging.py: 512 MiB)
PACKAGE_LIMIT = 500 * 1024 * 1024
_TERMINAL_RAY = ("STOPPED", "SUCCEEDED", "FAILED")


def ip_token(k: int) -> str:
    return f"__GTRAIN_RAY_IP_{k}__"


class RayBackend(JobBackend):
    name = "ray"
    scheduler_packs = True

    @property
    def api(self) -> RayAPI:
        return RayAPI(str((self.cluster.extra.get("ray") or {}).get("address") or ""))

    @property
    def runners(self) -> list[RayExec]:
        """Each node's folder for gtrain's checkpoint tool (the probe, a recovery's collect and archive): reached
        through short Ray jobs, one per step for every node (:mod:`gtrain.providers.ray.execjob`)."""
        from gtrain.providers.ray.execjob import ExecBatch, RayExec
        from gtrain.providers.ray.options import RayOptions

        if "_runners" not in self.__dict__:  # the same ones each time: a queued write_file rides with the next run
            opts = RayOptions.model_validate(self.cluster.spec.get("ray") or {})
            env = {str(k): str(v) for k, v in (opts.runtime_env.get("env_vars") or {}).items()}
            root = f"{opts.root}/{self.cluster.id}"
            batch = ExecBatch(self.api, self.cluster.id, opts.driver_python, env, self.num_nodes)
            self.__dict__["_runners"] = [RayExec(batch, k, f"{root}/node-{k}") for k in range(self.num_nodes)]
        return list(self.__dict__["_runners"])

    def submission(self, job: JobRecord) -> str:
        """The Ray job of the job's current attempt: recorded at submit; a relaunch (attempt N) records it after
        gtrain's own record of the attempt is written, so it is found by its metadata then."""
        sid = str(job.info.get("ray_submission") or "")
        attempt = int(job.info.get("attempt") or 1)
        if not sid or int(job.info.get("ray_attempt") or 1) == attempt:
            return sid
        found: dict[str, str] = self.__dict__.setdefault("_attempts", {})
        key = f"{job.id}/{attempt}"
        if key not in found:
            mine = [rj for rj in self.api.jobs() if (rj.get("metadata") or {}).get("gtrain_job") == job.id
                    and (rj.get("metadata") or {}).get("gtrain_attempt") == str(attempt)]
            if not mine:
                return sid  # not submitted (yet): the last attempt's
            found[key] = str(max(mine, key=lambda rj: rj.get("start_time") or 0)["submission_id"])
        return found[key]

    def reserve(self, request: JobRequest) -> JobRequest:
        """The rendezvous port: from the job id (any port of bundle 0's node; the job's own processes only),
        in 20000-31999: above Ray's worker ports (10002-19999 by default) and below Linux's ephemeral ports
        (32768-60999), which any outgoing connection of the node may hold (seen: torchrun's EADDRINUSE)."""
        request.master_port = 20000 + zlib.crc32(request.job_id.encode()) % 12000
        return request

    # ---- plan and submit -------------------------------------------------------------------------

    def dryrun(self, request: JobRequest) -> JobPlan:
        from gtrain.jobs.nodescript import launcher_of
        from gtrain.jobs.render import render_all
        from gtrain.providers.ray.options import PLACEMENTS, parse_options
        from gtrain.spec.checkpoints import run_key

        spec = request.spec
        job = spec.job
        assert job is not None
        opts = parse_options(spec)
        n = self.num_nodes
        port = request.master_port or 29500
        root = f"{opts.root}/{self.cluster.id}"
        ips = [ip_token(k) for k in range(n)]
        launcher, nproc, options, notes = launcher_of(spec, job)
        contexts, files = [], {}
        for k in range(n):
            ctx = NodeContext(
                job_id=request.job_id, cluster=self.cluster.name, node_rank=k, num_nodes=n, node_ips=ips,
                node_addr=ips[k], master_addr=ips[0], master_port=port, nproc_per_node=nproc,
                job_dir=f"{root}/node-{k}/jobs/{request.job_id}", workdir=f"{root}/node-{k}/workdir",
                checkpoint_dir=f"{root}/node-{k}/workdir/{job.checkpoint_dir}",
                python=job.python or "__GTRAIN_RAY_PYTHON__", argv=job.argv, env=dict(job.env),
                secret_names=list(job.secrets), max_restarts=job.max_restarts, launcher=launcher,
                launcher_options=options, launcher_notes=notes, checkpoint_store=job.checkpoint_store or "",
                checkpoint_env=job.checkpoint_tuning.to_env() if job.checkpoint_tuning else {},
                checkpoint_key=run_key(self.cluster.name, job.run_id, job.run, job.checkpoint_dir))
            contexts.append(ctx)
            files[k] = render_all(ctx)
        gpus = job_gpus(spec, job)  # job.gpus_per_node: Ray packs bundles on a node's GPUs
        driver_plan = {"job_id": request.job_id, "submission_id": request.job_id, "num_nodes": n,
                       "bundle": opts.bundle(gpus), "strategy": PLACEMENTS[opts.placement], "root": root,
                       "checkpoint_dir": job.checkpoint_dir, "secret_names": list(job.secrets),
                       "pending_timeout_s": opts.pending_timeout_s}
        env_vars = {str(k): str(v) for k, v in (opts.runtime_env.get("env_vars") or {}).items()}
        shown = {"entrypoint": f"{opts.driver_python} {DRIVER}", "submission_id": request.job_id,
                 "runtime_env": {**opts.runtime_env, "working_dir": "gcs://_ray_pkg_<hash of the workdir, "
                                 "the node scripts and the driver>.zip",
                                 "env_vars": env_vars},
                 "metadata": self.metadata(request.job_id), "driver": driver_plan}
        out: dict[int, dict[str, str]] = {0: {"ray-job.json": json.dumps(shown, indent=2)}}
        for k, named in files.items():
            out.setdefault(k, {}).update(named)
        info = {"run": job.run, "argv": job.argv, "nproc_per_node": nproc, "num_nodes": n,
                "master": f"bundle 0's node:{port}", "checkpoint_dir": job.checkpoint_dir, "workdir": request.workdir,
                "env_names": sorted(job.env), "secret_names": list(job.secrets), "backend": self.name,
                "ray_address": self.api.address, "ray_root": root}
        return JobPlan(request, out, info, {"contexts": contexts, "files": files, "driver": driver_plan,
                                            "runtime_env": opts.runtime_env, "env_vars": env_vars,
                                            "entrypoint": f"{opts.driver_python} {DRIVER}"})

    def metadata(self, job_id: str, attempt: int = 1) -> dict[str, str]:
        return {"gtrain_cluster": self.cluster.id, "gtrain_job": job_id, "gtrain": "1", "gtrain_attempt": str(attempt)}

    def package(self, plan: JobPlan, submission_id: str) -> tuple[str, bytes]:
        """The working_dir zip (the workdir at its top, ``_gtrain/`` beside it) and its ``_ray_pkg_`` name."""
        from gtrain.sync.workdir import list_workdir

        here = Path(__file__).resolve().parent
        workdir = Path(plan.request.workdir)
        buf = io.BytesIO()
        stamp = (2020, 1, 1, 0, 0, 0)
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for rel in list_workdir(workdir):
                if rel.split("/")[0] == "_gtrain":
                    continue
                z.write(str(workdir / rel), rel)

            def put(name: str, data: bytes, mode: int = 0o644) -> None:
                info = zipfile.ZipInfo(f"_gtrain/{name}", date_time=stamp)
                info.external_attr = mode << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)

            put("driver.py", (here / "driver.py").read_bytes())
            put("nodeside.py", (here.parent.parent / "remote" / "nodeside.py").read_bytes())
            put("nodemask.py", (here.parent.parent / "remote" / "nodemask.py").read_bytes())
            put("plan.json", json.dumps({**plan.private["driver"], "submission_id": submission_id}).encode())
            for k, named in plan.private["files"].items():
                for fname, text in named.items():
                    put(f"node-{k}/{fname}", text.encode(), 0o755)
            if plan.request.spec.job is not None and plan.request.spec.job.checkpoint_store:
                from gtrain.checkpoints.bundle import bundle

                put("gtrain-ckpt.pyz", bundle())
        data = buf.getvalue()
        if len(data) > PACKAGE_LIMIT:
            raise ConfigError(f"job.workdir: {str(workdir)!r} zips to {len(data) >> 20} MiB, more than the "
                              f"{PACKAGE_LIMIT >> 20} MiB a Ray working_dir carries", field="job.workdir",
                              hint="leave big files out with .gtrainignore and read data from shared storage")
        return f"_ray_pkg_{hashlib.sha1(data).hexdigest()[:32]}.zip", data

    def submit(self, plan: JobPlan, report: Reporter | None = None) -> str:
        rep = report or SILENT
        api = self.api
        attempt = int(plan.info.get("attempt") or 1)
        sid = base = plan.job_id if attempt == 1 else f"{plan.job_id}-a{attempt}"
        tries = 1
        while api.job(sid) is not None:  # a relaunch begun before (a watcher killed halfway): a new Ray job
            tries += 1
            sid = f"{base}-{tries}"
        plan.private["driver"]["attempt"] = attempt
        job = plan.request.spec.job
        assert job is not None
        plan.private["driver"]["secrets_uri"] = self._upload_secrets(api, job.secrets)
        name, data = self.package(plan, sid)
        uri = api.upload_package(name, data)
        env_vars = dict(plan.private["env_vars"])  # never the secrets: a job's runtime_env is public
        runtime_env = {**plan.private["runtime_env"], "working_dir": uri}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        body = {"entrypoint": plan.private["entrypoint"], "submission_id": sid, "runtime_env": runtime_env,
                "metadata": self.metadata(plan.job_id, attempt), "entrypoint_num_cpus": 0}
        api.submit(body)
        store = self.provider.store
        store.update_job(plan.job_id, status=JobState.PENDING.value,
                         info={**store.get_job(plan.job_id).info, "ray_submission": sid, "ray_attempt": attempt,
                               "ray_address": api.address})
        rep.info(f"job {plan.job_id} submitted to Ray at {api.address} as {sid} "
                 f"({len(data) // 1024} KiB working_dir)")
        self._wait_runtime_env(sid, rep)
        return plan.job_id

    @staticmethod
    def _upload_secrets(api: RayAPI, names: list[str]) -> str | None:
        """The secrets as NUL-separated ``NAME=value`` records in a one-off package of the cluster's GCS under a
        random name (not in the job's runtime_env, entrypoint or working_dir): the driver reads and deletes it."""
        import os
        import secrets

        if not names:
            return None
        records = b"".join(f"{n}={os.environ[n]}".encode() + b"\x00" for n in names)
        return api.upload_package(f"_ray_pkg_{secrets.token_hex(16)}.zip", records)

    def _wait_runtime_env(self, sid: str, rep: Reporter, limit_s: float = 600) -> None:
        """While Ray builds the job's runtime_env (PENDING): wait; a runtime_env that failed is the spec's."""
        deadline = time.monotonic() + limit_s
        said = False
        while time.monotonic() < deadline:
            rj = self.api.job(sid) or {}
            status = rj.get("status")
            if status != "PENDING":
                if status == "FAILED" and rj.get("error_type") == "RUNTIME_ENV_SETUP_FAILURE":
                    msg = str(rj.get("message") or "").strip()
                    raise ConfigError(f"ray.runtime_env: Ray could not build the job's runtime_env: {msg[-1500:]}",
                                      field="ray.runtime_env", hint="fix ray.runtime_env (pip/conda/env_vars); "
                                      "nothing of the job runs")
                return
            if not said and time.monotonic() > deadline - limit_s + 5:
                rep.info(f"Ray is setting up job {sid}'s runtime_env ...")
                said = True
            time.sleep(0.5)

    # ---- state -----------------------------------------------------------------------------------

    def _read(self, job: JobRecord) -> tuple[dict[str, Any] | None, str]:
        sid = self.submission(job)
        if not sid:
            return None, ""
        cache: dict[str, tuple[dict[str, Any] | None, str]] = self.__dict__.setdefault("_cache", {})
        if sid in cache:
            return cache[sid]
        rj = self.api.job(sid)
        logs = self.api.logs(sid) if rj is not None and rj.get("status") != "PENDING" else ""
        if rj is not None and rj.get("status") in _TERMINAL_RAY:
            rj = self.api.job(sid)  # its log is complete once the status says so
            logs = self.api.logs(sid)
            cache[sid] = (rj, logs)
        return rj, logs

    def describe(self, job: JobRecord, nodes: list[int] | None = None) -> JobDescription:
        if not job.info.get("ray_submission"):
            raise ProviderError(f"job {job.id}: no Ray job recorded for it (the submit did not finish)")
        rj, logs = self._read(job)
        statuses, reason = states.node_statuses(rj, states.parse(logs), self.num_nodes)
        state, code = aggregate(statuses)
        if any(s.state is JobState.PREEMPTED for s in statuses) and state is not JobState.SUCCEEDED:
            state, code = JobState.PREEMPTED, None
        picked = [s for s in statuses if nodes is None or s.node in nodes]
        return JobDescription(job.id, state, code, picked, reason)

    def cancel(self, job: JobRecord, nodes: list[int] | None = None, grace_s: float = 10) -> None:
        """Stop the Ray job (its driver stops every node's part) and wait until none of its actors lives."""
        sid = self.submission(job)
        if sid:
            stop_job(self.api, sid, grace_s)
            self.__dict__.get("_cache", {}).pop(sid, None)

    # ---- output ----------------------------------------------------------------------------------

    def _mine(self, logs: str, node: int) -> list[LogLine]:
        """Node ``node``'s lines of the job's log (``[gtrain-log K R] text``), rank-tagged; node 0 also shows the
        driver's word on the whole job (pending, placed, a node lost, ...)."""
        mine: list[LogLine] = []
        for text in logs.splitlines():
            m = states.LOG_LINE.match(text)
            if m and int(m.group(1)) == node:
                mine.append(LogLine(node, None if m.group(2) == "-" else int(m.group(2)), m.group(3)))
            elif node == 0 and states.DRIVER_SAYS.match(text):
                mine.append(LogLine(node, None, text))
        return mine

    def log_iter(self, job: JobRecord, node: int, rank: int | None = None, *, follow: bool = False,
                 tail: int | None = None, since: int = 0) -> Iterator[LogLine | NodeEnded]:
        """The node's lines; with ``follow``, read from the Jobs API's log stream (``/logs/tail``, a WebSocket)
        as they come, until the node's part ends (the whole log read once more then, so none is missed)."""
        seen = [0]

        def new(mine: list[LogLine]) -> Iterator[LogLine]:
            for i, line in enumerate(mine):
                if i < seen[0]:
                    continue
                seen[0] = i + 1
                if seen[0] <= since or (rank is not None and line.rank != rank):
                    continue
                yield line

        if not follow:
            mine = self._mine(self._read(job)[1], node)
            if tail is not None:
                seen[0] = max(0, len(mine) - tail)
            yield from new(mine)
            return
        said, text, polling = "", "", False
        stream: Iterator[str | None] | None = None
        while True:
            sid = self.submission(job)
            rj = self.api.job(sid) if sid else None
            status = (rj or {}).get("status")
            if stream is None and not polling and rj is not None and status != "PENDING":
                try:
                    stream = self.api.tail(sid)
                except ProviderError:
                    polling = True  # no stream (a proxy in the way): the whole log, read every 0.5 s
            over = rj is None or status in _TERMINAL_RAY
            if stream is not None:
                cycle = time.monotonic() + 0.5
                for chunk in stream:  # what came until the stream idles or half a second passed
                    if chunk is None:
                        break
                    text += chunk
                    if time.monotonic() > cycle:
                        break
                else:
                    over = True  # Ray closes the stream when the job has ended
                logs = text[:text.rfind("\n") + 1]
            else:
                logs = self._read(job)[1]
            if over:
                self.__dict__.get("_cache", {}).pop(sid, None)
                rj, logs = self._read(job)  # the whole log of an ended job: every line, whatever the stream got
            yield from new(self._mine(logs, node))
            statuses, reason = states.node_statuses(rj, states.parse(logs), self.num_nodes)
            state, _ = aggregate(statuses)
            st = statuses[node]
            if st.state is JobState.PENDING and st.detail.startswith("Ray job PENDING") and st.detail != said:
                said = st.detail
                yield LogLine(node, None, f"[gtrain] node {node} is pending ({st.detail})")
            if st.state.terminal or state.terminal:  # this snapshot of the log has all of the node's lines
                yield NodeEnded(node, st.state if st.state.terminal else state, st.detail or reason,
                                reason if state is JobState.FAILED else None)
                return
            if stream is None:
                time.sleep(0.5)
