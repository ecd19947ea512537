"""The ``kubernetes`` provider: a namespace of a team's cluster (CoreWeave, GKE, EKS, on-premise).

``up`` checks access and capacity and creates nothing that holds GPUs: the API answers, the namespace exists,
RBAC allows what a launch does (SelfSubjectAccessReview), how many nodes carry the GPU label with enough
allocatable GPUs. Jobs run through :class:`~gtrain.providers.kubernetes.backend.KubernetesBackend`. ``down``
deletes every object labelled with the cluster id. The cost is each node's pods' running time (startTime to
finishedAt, read before they are deleted) x GPUs x ``kubernetes.price_per_gpu_hour``.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan, Provider
from gtrain.providers.kubernetes import objects as ko
from gtrain.providers.kubernetes.api import call, edge, is_not_found
from gtrain.providers.kubernetes.options import GPU_LABELS, KubernetesOptions, parse_options

if TYPE_CHECKING:
    from gtrain.jobs.backend import JobBackend
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import VolumeInfo
    from gtrain.state import Cluster, CostInterval
    from gtrain.state.nodes import NodeRecord

#: what a launch does, checked at `up` (SelfSubjectAccessReview): (verb, group, resource)
NEEDED = [("create", "batch", "jobs"), ("delete", "batch", "jobs"), ("list", "", "pods"), ("get", "", "pods/log"),
          ("create", "", "services"), ("create", "", "configmaps"), ("create", "", "secrets")]
#: and with the spec's volumes: (claims made once, held and let go by annotation)
VOLUMES_NEEDED = [("get", "", "persistentvolumeclaims"), ("create", "", "persistentvolumeclaims"),
                  ("update", "", "persistentvolumeclaims")]


class KubernetesProvider(Provider):
    name = "kubernetes"
    gc_scope: ClassVar[str | None] = "namespace"
    node_disks_outlive_jobs: ClassVar[bool] = False  # a pod's emptyDir ends with it: checkpoints go to the store

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def client(self, cluster: Cluster) -> Any:
        from gtrain.providers.kubernetes.api import client

        info = cluster.extra.get("kubernetes") or {}
        with self._lock:
            if cluster.id not in self._clients:
                self._clients[cluster.id] = client(info.get("context"), info.get("namespace") or "default")
            return self._clients[cluster.id]

    def remember_client(self, cluster: Cluster, c: Any) -> None:
        """Keep ``c`` as the cluster's client (``up`` and ``attach`` made it already)."""
        with self._lock:
            self._clients[cluster.id] = c

    # ---- plan / provision --------------------------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = parse_options(spec)
        gpus = spec.resources.gpus_per_node if spec.resources.accelerators else 0
        rate = opts.rate(spec.resources.gpu_name)
        from gtrain.providers.kubernetes.volumes import check_spec, plan_notes

        check_spec(spec, opts)
        if opts.volumes:
            self.report.warn("kubernetes.volumes is deprecated: list the claims under the spec's volumes: "
                             "(e.g. {name: CLAIM, mount: /data, size_gb: N}; docs/volumes.md)")
        plan = Plan(
            provider="kubernetes", num_nodes=spec.num_nodes,
            instance_type=f"pod:{gpus}x{spec.resources.gpu_name or 'cpu'}",
            market="kubernetes", region=f"{opts.context or 'current context'}/{opts.namespace}",
            gpu_name=spec.resources.gpu_name, gpus_per_node=gpus, price_per_hour=rate * gpus,
            max_hours=spec.policies.max_hours,
            notes=["creates nothing at `up`: each launch is an Indexed Job of "
                   f"{spec.num_nodes} pod(s) with a headless Service and a ConfigMap (`launch --dry-run` prints them)",
                   f"charged ${rate}/GPU-hour x GPUs for each pod's running time (kubernetes.price_per_gpu_hour"
                   + (", CoreWeave's list price" if opts.profile == "coreweave" and opts.price_per_gpu_hour is None
                      else "") + ")"])
        plan.notes += plan_notes(spec, opts)
        return plan

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        from gtrain.providers.kubernetes.api import client

        opts = parse_options(spec)
        c = client(opts.context, opts.namespace)
        label = self.check_cluster(spec, opts, c)
        from gtrain.providers.kubernetes.volumes import KubeVolumes, check_spec

        check_spec(spec, opts)
        KubeVolumes(self).prepare(spec, cluster, opts, c)  # refused (exit 2) before anything is made
        extra = {**cluster.extra, "kubernetes": {"context": opts.context, "namespace": opts.namespace,
                                                 "gpu_label": list(label) if label else None}}
        self.store.update_cluster(cluster.id, extra=extra)
        cluster.extra = extra
        self.remember_client(cluster, c)
        self.anchor(cluster, opts, c)
        if spec.volumes:
            KubeVolumes(self).ensure(spec, cluster, opts, c)
        for k in range(spec.num_nodes):
            self.store.upsert_node(cluster.id, k, status="up", address=f"pod {k}",
                                   instance_id=f"kubernetes:{opts.namespace}/pod-{k}", meta={})
        self.report.info(f"kubernetes namespace {opts.namespace} recorded: each launch is an Indexed Job there")

    def anchor(self, cluster: Cluster, opts: KubernetesOptions, c: Any) -> None:
        """The cluster's own object in the namespace, holding no GPU: a labelled ConfigMap naming the cluster.
        Recorded in the ledger (so `up` is idempotent and `down` marks it deleted); `gc` finds those no live cluster
        owns, with every object of theirs."""
        from lightkube import codecs

        name = ko.anchor_name(cluster.name, cluster.id)
        if any(r.kind == "configmap" and r.ref == name for r in self.store.resources(cluster.id, live_only=True)):
            return
        rid = self.store.record_resource(cluster.id, "configmap", name, region=opts.namespace)
        obj = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": opts.namespace, "labels": ko.labels(cluster.id)},
               "data": {"cluster": cluster.name, "cluster_id": cluster.id}}
        try:
            c.create(codecs.from_dict(obj))
        except Exception as e:
            from lightkube import ApiError

            if not (isinstance(e, ApiError) and e.status.code == 409):
                self.store.mark_resource(rid, "not-created")
                with edge(f"create ConfigMap {name}", opts.namespace):
                    raise
        self.store.mark_resource(rid, "created")

    def check_cluster(self, spec: ClusterSpec, opts: KubernetesOptions, c: Any) -> tuple[str, str] | None:
        """The API answers, the namespace exists, RBAC allows a launch; the nodes that fit, said plainly.
        Returns the GPU node label (key, value) the pods will select, when one is known."""
        from lightkube.resources.core_v1 import Namespace, Node

        ns = opts.namespace
        try:
            c.get(Namespace, ns)
        except Exception as e:
            if not is_not_found(e):
                with edge(f"get namespace {ns}", ns):
                    raise
            from gtrain.errors import ConfigError

            raise ConfigError(f"kubernetes.namespace: {ns!r} does not exist, nothing was created",
                              hint=f"`kubectl create namespace {ns}`, or another kubernetes.namespace",
                              field="kubernetes.namespace") from None
        from lightkube import codecs

        denied = []
        needed = NEEDED + (VOLUMES_NEEDED if spec.volumes else [])
        for verb, group, resource in needed:
            res, _, sub = resource.partition("/")
            review = codecs.from_dict({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                       "spec": {"resourceAttributes": {"namespace": ns, "verb": verb, "group": group,
                                                                       "resource": res, "subresource": sub or None}}})
            got = call(c.create, "create SelfSubjectAccessReview", ns, review)
            if not (got.status and got.status.allowed):
                denied.append(f"{verb} {resource}")
        if denied:
            from gtrain.errors import ConfigError

            raise ConfigError(f"kubernetes.namespace: RBAC denies {', '.join(denied)} in {ns!r}, nothing was created",
                              hint="ask for a Role granting jobs, pods, pods/log, services and configmaps there"
                                   + (" (and persistentvolumeclaims: the spec has volumes)" if spec.volumes else ""),
                              field="kubernetes.namespace")
        gpus = spec.resources.gpus_per_node if spec.resources.accelerators else 0
        try:
            nodes = [n.to_dict() for n in c.list(Node)]
        except Exception as e:  # noqa: BLE001  listing nodes is cluster-scoped: many namespaces' users may not
            self.report.info(f"cannot list nodes ({type(e).__name__}); capacity not checked")
            return None
        key = opts.label_key() or next((k for k in GPU_LABELS if any(k in (n["metadata"].get("labels") or {})
                                                                      for n in nodes)), None)
        value = opts.label_value(key, spec.resources.gpu_name) if key else None
        fit = []
        for n in nodes:
            nl = n["metadata"].get("labels") or {}
            if any(nl.get(k) != v for k, v in opts.node_selector.items()):
                continue
            named = str(nl.get(key, "")).lower() if key else ""
            if gpus and key and spec.resources.gpu_name and not (
                    (value and nl.get(key) == value) or spec.resources.gpu_name.lower() in named):
                continue
            alloc = int(str((n.get("status") or {}).get("allocatable", {}).get(opts.gpu_resource, "0")) or 0)
            if alloc >= gpus:
                fit.append((n["metadata"]["name"], nl.get(key) if key else None))
        said = f"{len(fit)} of {len(nodes)} node(s) have {gpus} allocatable {opts.gpu_resource}" + (
            f" and {key}={value or spec.resources.gpu_name}" if gpus and key else "")
        if len(fit) < spec.num_nodes:
            self.report.info(f"the request cannot fit now: {said}, num_nodes is {spec.num_nodes} (pods will wait "
                             "Pending until the cluster has room)")
        else:
            self.report.info(f"capacity: {said}")
        if gpus and key and spec.resources.gpu_name:
            found = value or next((v for _, v in fit if v), None)
            return (key, found) if found else None
        return None

    # ---- describe / terminate ----------------------------------------------------------------------

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        """Each node as its newest pod says: ``preempted`` when the cluster disrupted it (DisruptionTarget:
        evicted, preempted by priority, its node drained) -- what `policies.recovery` relaunches, as a spot VM's
        preemption -- else ``running`` (a node is a slot for a pod; none holds a GPU between jobs)."""
        from lightkube.resources.core_v1 import Pod

        from gtrain.providers.kubernetes.states import disruption, index_of

        ns = (cluster.extra.get("kubernetes") or {}).get("namespace") or "default"
        newest: dict[int, dict[str, Any]] = {}
        if cluster.extra.get("kubernetes"):
            with edge(f"list the pods of cluster {cluster.name}", ns):
                pods = [p.to_dict() for p in self.client(cluster).list(
                    Pod, namespace=ns, labels={ko.LABEL_CLUSTER: cluster.id[:63]})]
            for p in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or "")):
                newest[index_of(p)] = p
        out = []
        for n in self.store.nodes(cluster.id):
            pod = newest.get(n.rank)
            why = disruption(pod) if pod is not None else None
            if pod is not None and why is not None:
                out.append(NodeStatus(n.rank, "preempted", n.address, f"pod {pod['metadata']['name']}: {why}"))
            else:
                out.append(NodeStatus(n.rank, "running" if n.status == "up" else n.status, n.address,
                                      f"namespace {ns}"))
        return out

    def delete_labelled(self, cluster: Cluster, selector: dict[str, str], grace_s: float = 10) -> None:
        """Delete the Jobs (foreground), pods, Services and ConfigMaps with these labels; wait until no pod is
        left."""
        from lightkube.resources.batch_v1 import Job
        from lightkube.resources.core_v1 import ConfigMap, Pod, Secret, Service
        from lightkube.types import CascadeType

        c = self.client(cluster)
        ns = (cluster.extra.get("kubernetes") or {}).get("namespace") or "default"
        for kind in (Job, Pod, Service, ConfigMap, Secret):
            with edge(f"list {kind.__name__}s labelled {selector}", ns):
                found = list(c.list(kind, namespace=ns, labels=selector))
            if kind is Pod:
                self.record_pod_time(cluster, [p.to_dict() for p in found])
            for obj in found:
                try:
                    c.delete(kind, obj.metadata.name, namespace=ns, cascade=CascadeType.FOREGROUND,
                             grace_period=int(grace_s) if kind is Pod else None)
                except Exception as e:
                    if not is_not_found(e):
                        with edge(f"delete {kind.__name__} {obj.metadata.name}", ns):
                            raise
        deadline = time.monotonic() + grace_s + 60
        while time.monotonic() < deadline:  # the pods, then the Job (foreground: it goes after its pods)
            with edge("list pods", ns):
                if not list(c.list(Pod, namespace=ns, labels=selector)) and not list(
                        c.list(Job, namespace=ns, labels=selector)):
                    return
            time.sleep(0.2)

    def record_pod_time(self, cluster: Cluster, pods: list[dict[str, Any]]) -> None:
        """Add each pod's running time (startTime to its container's finishedAt, or now) to its node's total
        in the cluster's state, before the pods are deleted: what the cost report charges."""
        from gtrain.providers.kubernetes.states import index_of, running_seconds

        if not pods:
            return
        fresh = self.store.get_cluster_by_id(cluster.id)
        extra = dict(fresh.extra if fresh is not None else cluster.extra)
        info = dict(extra.get("kubernetes") or {})
        seen = set(info.get("pods_billed") or [])
        total = {int(k): float(v) for k, v in (info.get("pod_seconds") or {}).items()}
        for p in pods:
            uid = str((p.get("metadata") or {}).get("uid") or p["metadata"]["name"])
            k = index_of(p)
            if uid in seen or k < 0:
                continue
            seen.add(uid)
            total[k] = total.get(k, 0.0) + running_seconds(p, time.time())
        info.update(pod_seconds={str(k): v for k, v in total.items()}, pods_billed=sorted(seen)[-500:])
        extra["kubernetes"] = info
        self.store.update_cluster(cluster.id, extra=extra)
        cluster.extra = extra

    def terminate(self, cluster: Cluster) -> None:
        if cluster.extra.get("kubernetes"):
            self.delete_labelled(cluster, {ko.LABEL_CLUSTER: cluster.id[:63]})
            if cluster.spec.get("volumes"):  # the claims stay: only the cluster's hold goes
                from gtrain.providers.kubernetes.volumes import KubeVolumes

                for v in KubeVolumes(self).release(cluster):
                    self.report.info(f"volume {v.name} (claim in {v.region}) is kept: {v.size_gb}Gi at "
                                     f"${v.usd_per_gb_month:g}/GB-month (${v.usd_per_month:g}/month) until "
                                     f"`gtrain volume delete {v.name}`")
        for res in self.store.resources(cluster.id, live_only=True):
            self.store.mark_resource(res.id, "deleted")

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        from gtrain.providers.kubernetes.adopt import find_by_name

        return find_by_name(self, spec, regions)

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        from gtrain.providers.kubernetes.adopt import adopt

        adopt(self, spec, cluster, region)

    def keep_record(self, cluster: Cluster, body: bytes) -> None:
        """In the cluster's anchor ConfigMap: a pod's files end with the pod."""
        from gtrain.providers.kubernetes.adopt import keep_record

        keep_record(self, cluster, body)

    def read_record(self, cluster: Cluster) -> dict[str, Any] | None:
        from gtrain.providers.kubernetes.adopt import read_record

        return read_record(self, cluster)

    def runners(self, cluster: Cluster) -> list[Runner]:
        """Node K's runner execs in its running pod (pods/exec); pods' disks are ephemeral: checkpoints leave
        through job.checkpoint_store (or a volume)."""
        from gtrain.providers.kubernetes.podexec import PodRunner

        return [PodRunner(self, cluster, n.rank) for n in self.store.nodes(cluster.id)]

    def interactive_argv(self, cluster: Cluster, node: NodeRecord) -> tuple[list[str], str | None]:
        """`gtrain ssh`: a shell in node K's running pod through the exec API with a terminal (as ``kubectl exec
        -it POD -- bash -l``; :mod:`~gtrain.providers.kubernetes.podshell`)."""
        import sys

        from gtrain.providers.kubernetes.podexec import PodRunner

        info = cluster.extra.get("kubernetes") or {}
        pod = PodRunner(self, cluster, node.rank).pod()
        return [sys.executable, "-m", "gtrain.providers.kubernetes.podshell", str(info.get("context") or ""),
                str(info.get("namespace") or "default"), pod, "bash", "-l"], None

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Objects labelled gtrain.dev/cluster in ``regions`` (namespaces; default: those of clusters in state,
        and ``default``) of the current kubeconfig context whose cluster is not live; deleted with ``delete``."""
        from gtrain.providers.kubernetes.gc import sweep

        return sweep(self, regions, live_cluster_ids, delete)

    # ---- volumes (gtrain volume: gtrain/runs/volumes.py; gtrain/providers/kubernetes/volumes.py) ----------

    def volume_list(self, regions: list[str] | None, **options: str | None) -> list[VolumeInfo]:
        """The claims gtrain made in ``regions`` (namespaces; default: those of clusters in state, and default)."""
        from gtrain.providers.kubernetes.gc import namespaces
        from gtrain.providers.kubernetes.volumes import KubeVolumes

        return KubeVolumes(self).list_all(list(regions) if regions else namespaces(self))

    def volume_create(self, spec: ClusterSpec, name: str) -> VolumeInfo:
        from gtrain.providers.kubernetes.api import client
        from gtrain.providers.kubernetes.volumes import KubeVolumes, check_spec

        opts = parse_options(spec)
        check_spec(spec, opts)
        vols = KubeVolumes(self)
        c = client(opts.context, opts.namespace)
        [rec] = vols.ensure(spec, None, opts, c, only=name)
        claim = vols.get(c, opts.namespace, str(rec["claim"]))
        assert claim is not None
        return vols.info(c, opts.namespace, claim, opts.storage_price_per_gb_month)

    def volume_delete(self, name: str, regions: list[str] | None, **options: str | None) -> VolumeInfo | None:
        from gtrain.providers.kubernetes.gc import namespaces
        from gtrain.providers.kubernetes.volumes import KubeVolumes

        return KubeVolumes(self).delete(name, list(regions) if regions else namespaces(self))

    def node_records(self, cluster: Cluster) -> list[NodeRecord]:
        return self.store.node_records(cluster.id)

    def job_backend(self, cluster: Cluster) -> JobBackend:
        from gtrain.providers.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(self, cluster)

    # ---- cost --------------------------------------------------------------------------------------

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        from gtrain.spec import Resources

        res = cluster.spec.get("resources") or {}
        r = Resources.model_validate(res)
        gpus = r.gpus_per_node if res.get("accelerators") else 0
        opts = KubernetesOptions.model_validate(cluster.spec.get("kubernetes") or {})
        rate = opts.rate(r.gpu_name)
        fresh = self.store.get_cluster_by_id(cluster.id)
        ran = ((fresh or cluster).extra.get("kubernetes") or {}).get("pod_seconds") or {}
        slot = max(0.0, (interval.stopped_at or time.time()) - interval.started_at)
        seconds = min(slot, float(ran.get(str(interval.node_rank), 0.0)))  # its pods' running time, in the slot
        gpu_h = seconds * gpus / 3600
        return IntervalCost(round(gpu_h * rate, 6), estimate=True,
                            note=f"pods ran {seconds / 3600:.4f} hour(s) x {gpus} GPU(s) = {gpu_h:.4f} GPU-hour(s) "
                                 f"x ${rate}/GPU-hour")
