"""The Kubernetes job backend: one Indexed Job per launch (see :mod:`~gtrain.providers.kubernetes.objects`).

``dryrun`` renders every node's scripts from the shared templates (the same launcher lines as every other
backend; rank = completion index, rendezvous at pod 0's stable name) and the objects; ``submit`` creates the
ConfigMap, the headless Service and the Job, removing what it made when one is refused. ``describe`` is one
list of the job's pods and one get of the Job; ``log_iter`` follows pod K's log; ``cancel`` deletes the Job
(foreground), its pods, Service and ConfigMap and waits until no pod is left. See docs/providers/kubernetes.md.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.events import SILENT, Reporter
from gtrain.jobs.backend import (
    CANCEL_EXIT,
    JobBackend,
    JobDescription,
    JobPlan,
    JobRequest,
    JobState,
    LogLine,
    NodeEnded,
    NodeJobStatus,
    aggregate,
)
from gtrain.jobs.render import NodeContext
from gtrain.providers.kubernetes import objects as ko
from gtrain.providers.kubernetes.api import call, edge, is_not_found

if TYPE_CHECKING:
    from gtrain.providers.kubernetes.host import KubeHost
    from gtrain.state import Job as JobRecord


#: at most this many rank-exit markers end a pod's log (one per rank of the pod)
_MARKERS_MAX = 256
#: the newest lines of a pod kept at `cancel` (what the run archive keeps of a node: runlog.archive.MAX_LOG_LINES)
_KEEP_MAX = 200_000


def ship_bundle() -> bytes:
    from gtrain.checkpoints.bundle import bundle

    return bundle()


class KubernetesBackend(JobBackend):
    name = "kubernetes"
    scheduler_packs = True
    checkpoint_tool = "plan"  # pods exist only once the Job is: its pods carry the tool (a ConfigMap)
    logs_go_with_job = True  # cancel deletes the pods, and their logs with them: `down` keeps them first
    provider: KubeHost

    @property
    def namespace(self) -> str:
        return str(self.cluster.extra.get("kubernetes", {}).get("namespace") or "default")

    @property
    def client(self) -> Any:
        return self.provider.client(self.cluster)

    def reserve(self, request: JobRequest) -> JobRequest:
        """The rendezvous port: from the job id (pods have their own network; any port is free there)."""
        request.master_port = 20000 + zlib.crc32(request.job_id.encode()) % 20000
        return request

    # ---- plan and submit -------------------------------------------------------------------------

    def dryrun(self, request: JobRequest) -> JobPlan:
        from gtrain.jobs.nodescript import launcher_of
        from gtrain.jobs.render import render_all
        from gtrain.providers.kubernetes.options import parse_options
        from gtrain.spec.checkpoints import run_key

        spec = request.spec
        job = spec.job
        assert job is not None
        opts = parse_options(spec)
        name = ko.k8s_name(request.job_id, self.cluster.name)
        port = request.master_port or 29500
        n = self.num_nodes
        hosts = [ko.pod_host(name, k) for k in range(n)]
        launcher, nproc, options, notes = launcher_of(spec, job)
        files: dict[int, dict[str, str]] = {}
        store_key = run_key(self.cluster.name, job.run_id, job.run, job.checkpoint_dir) if job.checkpoint_store else ""
        for k in range(n):
            ctx = NodeContext(
                job_id=request.job_id, cluster=self.cluster.name, node_rank=k, num_nodes=n, node_ips=hosts,
                node_addr=hosts[k], master_addr=hosts[0], master_port=port, nproc_per_node=nproc,
                job_dir=ko.job_dir(k), workdir=f"{ko.ROOT}/workdir",
                checkpoint_dir=f"{ko.ROOT}/workdir/{job.checkpoint_dir}", python=job.python or "python3",
                argv=job.argv, env=dict(job.env), secret_names=list(job.secrets), setup=job.setup,
                max_restarts=job.max_restarts, launcher=launcher, launcher_options=options, launcher_notes=notes,
                checkpoint_store=job.checkpoint_store or "", checkpoint_key=store_key,
                checkpoint_env=job.checkpoint_tuning.to_env() if job.checkpoint_tuning else {})
            files[k] = {f"node-{k}/{fname}": text for fname, text in render_all(ctx).items()}
            if job.checkpoint_store:  # run by the pod's entry before launch.sh: the store takes a write from here
                files[k][f"node-{k}/ckpt-probe.sh"] = ko.probe_script(ctx.python, dict(job.env),
                                                                      job.checkpoint_store, store_key, k)
        data = ko.bundle(Path(request.workdir), files)
        extra = self.cluster.extra.get("kubernetes", {})
        label = tuple(extra["gpu_label"]) if extra.get("gpu_label") else None
        if label is None and (key := opts.label_key()) and (value := opts.label_value(key, spec.resources.gpu_name)):
            label = (key, value)
        tool = ship_bundle() if job.checkpoint_store else None
        objs = ko.objects(request, opts, name, port, nproc, data, label, tool)  # type: ignore[arg-type]
        shown = ko.objects(request, opts, name, port, nproc, None, label, b"" if tool else None)  # type: ignore[arg-type]
        out = {0: {"objects.yaml": ko.dump_yaml(shown)}}
        for k, named in files.items():
            out.setdefault(k, {}).update({f: t for f, t in named.items() if not f.split("/")[-1].endswith(".py")})
        info = {"run": job.run, "argv": job.argv, "nproc_per_node": nproc, "num_nodes": n,
                "master": f"{hosts[0]}:{port}", "checkpoint_dir": job.checkpoint_dir, "workdir": request.workdir,
                "env_names": sorted(job.env), "secret_names": list(job.secrets), "backend": self.name,
                "k8s_name": name, "namespace": opts.namespace, "bundle_bytes": len(data)}
        if store_key:
            info["checkpoint_key"] = store_key
        return JobPlan(request, out, info, {"objects": objs})

    def submit(self, plan: JobPlan, report: Reporter | None = None) -> str:
        from lightkube import codecs
        from lightkube.types import CascadeType

        rep = report or SILENT
        made: list[Any] = []
        sec = ko.secret(plan.request, self.namespace, plan.info["k8s_name"])
        objs = ko.with_attempt(plan.private["objects"], int(plan.info.get("attempt") or 1))
        try:
            for obj in ([sec] if sec else []) + objs:
                res = codecs.from_dict(obj)
                call(self.client.create, f"create {obj['kind']} {obj['metadata']['name']}", self.namespace, res)
                made.append(res)
        except BaseException:
            for res in reversed(made):  # nothing of the job is left when one object is refused
                try:
                    self.client.delete(type(res), res.metadata.name, namespace=self.namespace,
                                       cascade=CascadeType.FOREGROUND)
                except Exception:  # noqa: BLE001  (best effort; the original error is what the user needs)
                    pass
            raise
        store = self.provider.store
        store.update_job(plan.job_id, status=JobState.PENDING.value,
                         info={**store.get_job(plan.job_id).info, "k8s_name": plan.info["k8s_name"],
                               "submitted_at": time.time()})
        rep.info(f"job {plan.job_id} created as Indexed Job {self.namespace}/{plan.info['k8s_name']} "
                 f"({plan.info['bundle_bytes'] // 1024} KiB bundle)")
        if plan.info.get("checkpoint_key"):
            rep.info(f"checkpoint store {plan.request.spec.job.checkpoint_store}/{plan.info['checkpoint_key']}: "  # type: ignore[union-attr]
                     "each pod probes a write, restores the newest checkpoint, then uploads beside the job")
        return plan.job_id

    # ---- state -----------------------------------------------------------------------------------

    def _objects(self, job: JobRecord) -> tuple[dict[str, Any] | None, dict[int, dict[str, Any]]]:
        """(the Job, or None when gone; node K -> its newest pod)."""
        from lightkube.resources.batch_v1 import Job
        from lightkube.resources.core_v1 import Pod

        from gtrain.providers.kubernetes.states import index_of

        name = str(job.info.get("k8s_name") or "")
        if not name:
            return None, {}
        ns = self.namespace
        kjob: dict[str, Any] | None
        try:
            kjob = self.client.get(Job, name, namespace=ns).to_dict()
        except Exception as e:
            if not is_not_found(e):
                with edge(f"get Job {name}", ns):
                    raise
            kjob = None
        with edge(f"list pods of {name}", ns):
            pods = [p.to_dict() for p in self.client.list(Pod, namespace=ns, labels={"job-name": name})]
        newest: dict[int, dict[str, Any]] = {}
        for p in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or "")):
            newest[index_of(p)] = p
        return kjob, newest

    def describe(self, job: JobRecord, nodes: list[int] | None = None) -> JobDescription:
        from gtrain.providers.kubernetes.states import job_flags, pod_status

        kjob, pods = self._objects(job)
        suspended, failed = job_flags(kjob)
        statuses = [pod_status(k, pods.get(k), suspended) if pods.get(k) is not None or not failed else
                    NodeJobStatus(k, JobState.CANCELLED, CANCEL_EXIT, "pod deleted: the Job failed")
                    for k in range(self.num_nodes)]
        for s in statuses:  # a pod that succeeded has no termination message: its log's tail says its ranks
            pod = pods.get(s.node)
            if s.state is JobState.SUCCEEDED and not s.ranks and pod is not None:
                s.ranks = self._ranks_of(pod["metadata"]["name"], int(job.info.get("nproc_per_node") or 1))
        if kjob is None and job.info.get("k8s_name"):  # deleted (cancel/down): what is not over was cancelled
            statuses = [s if s.state.terminal else NodeJobStatus(s.node, JobState.CANCELLED, CANCEL_EXIT, "deleted")
                        for s in statuses]
        state, code = aggregate(statuses)
        if job.info.get("pending_timeout"):  # cancelled by the pending timeout: a failure, with the reason
            return JobDescription(job.id, JobState.FAILED, 1, [s for s in statuses if nodes is None or s.node in nodes],
                                  str(job.info["pending_timeout"]))
        if any(s.state is JobState.PREEMPTED for s in statuses) and state is not JobState.SUCCEEDED:
            state, code = JobState.PREEMPTED, None
        reason = failed or next((f"pod {s.node}: {s.detail}" for s in statuses if s.state is JobState.PENDING
                                 or s.state is JobState.PREEMPTED or s.detail.startswith("OOMKilled")), "")
        picked = [s for s in statuses if nodes is None or s.node in nodes]
        return JobDescription(job.id, state, code, picked, reason)

    def _pending_too_long(self, job: JobRecord, detail: str) -> bool:
        """Past kubernetes.pending_timeout_s since the submit and still Pending: record why, cancel the job (its
        pods hold no GPU and never will), True."""
        from gtrain.providers.kubernetes.options import KubernetesOptions

        fresh = self.provider.store.get_job(job.id)
        if fresh.info.get("pending_timeout"):
            return True
        opts = KubernetesOptions.model_validate(self.cluster.spec.get("kubernetes") or {})
        since = float(fresh.info.get("submitted_at") or time.time())
        limit = opts.pending_timeout_s
        if limit is None or time.time() - since < limit:
            return False
        why = (f"still Pending after {limit:g}s (kubernetes.pending_timeout_s): {detail}; the job was cancelled, "
               "nothing of it is left")
        self.provider.store.update_job(job.id, status=JobState.FAILED.value, exit_code=1,
                                       info={**fresh.info, "pending_timeout": why})
        self.cancel(fresh, grace_s=0)
        return True

    def _ranks_of(self, pod: str, nproc: int) -> list[Any]:
        from gtrain.providers.kubernetes.states import rank_exits

        cache: dict[str, list[Any]] = self.__dict__.setdefault("_rank_cache", {})
        if pod not in cache:  # an ended pod's log does not change: read once
            cache[pod] = rank_exits("\n".join(self._log_lines(pod, False, nproc + 2)))
        return cache[pod]

    def cancel(self, job: JobRecord, nodes: list[int] | None = None, grace_s: float = 10) -> None:
        """Delete the job's objects (foreground: the Job goes after its pods) and wait until no pod is left. The
        pods' logs go with them: each pod's lines are kept first in the run archive, where `logs` reads them."""
        name = job.info.get("k8s_name")
        if name:
            try:
                self._keep_lines(job)
            except Exception:  # noqa: BLE001 - keeping the lines is best effort: the cancel goes on whatever fails
                pass
            self.provider.delete_labelled(self.cluster, {ko.LABEL_JOB: ko.labels("", job.id)[ko.LABEL_JOB]},
                                          grace_s=grace_s)

    def _kept(self, job: JobRecord, node: int) -> Path:
        from gtrain.state.runs import kept_log

        return kept_log(self.provider.store.home, job.cluster_id, job.id, node)

    def _keep_lines(self, job: JobRecord) -> None:
        from gtrain.state.runs import write_kept_log

        _, pods = self._objects(job)
        for node in sorted(pods):
            if ((pods[node].get("status") or {}).get("phase")) == "Pending":
                continue  # nothing written yet
            write_kept_log(self._kept(job, node), [(i.rank, i.text) for i in self.log_iter(job, node, tail=_KEEP_MAX)
                                                   if isinstance(i, LogLine)])

    # ---- output ----------------------------------------------------------------------------------

    def log_iter(self, job: JobRecord, node: int, rank: int | None = None, *, follow: bool = False,
                 tail: int | None = None, since: int = 0) -> Iterator[LogLine | NodeEnded]:
        seen = 0
        said = ""
        kept_read = False
        while True:
            _, pods = self._objects(job)
            pod = pods.get(node)
            phase = ((pod or {}).get("status") or {}).get("phase")
            if pod is None and not kept_read and self._kept(job, node).exists():  # cancelled: the lines kept then
                from gtrain.state.runs import read_kept_log

                kept_read = True
                kept = [LogLine(node, r, body) for r, body in list(read_kept_log(self._kept(job, node)))[since:]
                        if rank is None or r == rank]  # as the archive reads them: the rank's, then its tail
                yield from (kept[-tail:] if tail else []) if tail is not None and not follow else kept
            if pod is not None and phase != "Pending":
                pname = pod["metadata"]["name"]
                if not follow and tail is not None:  # the last `tail` of the job's own lines: gtrain's rank-exit
                    # markers end a pod's log (one per rank), so ask for that many more and drop them here
                    got = list(self._log_lines(pname, False, tail + _MARKERS_MAX))
                    lines: Iterable[str] = [x for x in got if not x.startswith(ko.RANK_EXIT)][-tail:] if tail else []
                else:
                    lines = self._log_lines(pname, follow, None)
                count = 0
                for text in lines:
                    count += 1
                    if count <= seen:
                        continue
                    seen = count
                    if seen <= since:
                        continue
                    if text.startswith(ko.RANK_EXIT):  # gtrain's own marker (describe reads it), not the job's
                        continue
                    r, body = _split_rank(text)
                    if rank is None or r == rank:
                        yield LogLine(node, r, body)
            if not follow:
                return
            desc = self.describe(job, [node])
            st = desc.nodes[0] if desc.nodes else None
            if st is not None and st.state is JobState.PENDING and st.detail != said:
                said = st.detail
                yield LogLine(node, None, f"[gtrain] pod {node} is Pending ({st.detail})")
            if st is not None and st.state is JobState.PENDING and self._pending_too_long(job, st.detail):
                job = self.provider.store.get_job(job.id)
                why = str(job.info["pending_timeout"])
                yield LogLine(node, None, f"[gtrain] {why}")
                yield NodeEnded(node, JobState.FAILED, why, why if node == 0 else None)
                return
            if st is None or st.state.terminal:
                if pod is not None and phase in (None, "Pending", "Running"):
                    continue  # ended while streaming: read what the pod wrote last
                yield NodeEnded(node, st.state if st else desc.state, st.detail if st else desc.reason,
                                desc.reason if node == 0 and desc.state is JobState.FAILED else None)
                return
            time.sleep(0.5)

    def _log_lines(self, pod: str, follow: bool, tail: int | None) -> Iterator[str]:
        try:
            yield from self.client.log(pod, namespace=self.namespace, follow=follow, tail_lines=tail,
                                       newlines=False)
        except Exception as e:
            if not is_not_found(e):
                with edge(f"read the log of pod {pod}", self.namespace):
                    raise


def _split_rank(text: str) -> tuple[int | None, str]:
    if text.startswith("[rank "):
        head, _, body = text.partition("] ")
        num = head[len("[rank "):]
        if num.isdigit():
            return int(num), body
    return None, text
