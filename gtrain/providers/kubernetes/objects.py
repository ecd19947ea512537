"""The objects one launch creates, as plain dicts shaped like the Kubernetes API's (what ``launch --dry-run``
prints as YAML and what the client sends): an Indexed Job, the headless Service its pods' ``subdomain`` names
(``publishNotReadyAddresses``: pod 0's name resolves before any pod is ready) and a ConfigMap with the job's
bundle (the workdir and every node's rendered scripts, one gzipped tar, at most :data:`BUNDLE_LIMIT`).

Each pod runs :data:`ENTRY`: it unpacks the bundle into ``/gtrain``, runs node K's ``launch.sh`` (K = the
completion index), and copies each local rank's log into the pod log prefixed ``[rank R]``."""

from __future__ import annotations

import base64
import io
import tarfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError

if TYPE_CHECKING:
    from gtrain.jobs.backend import JobRequest
    from gtrain.providers.kubernetes.options import KubernetesOptions

#: the gzipped bundle's limit: a ConfigMap holds at most 1 MiB, base64 makes 4 bytes of every 3
BUNDLE_LIMIT = 700 * 1024
ROOT = "/gtrain"
BUNDLE_DIR = "/gtrain-bundle"
LABEL_CLUSTER = "gtrain.dev/cluster"
LABEL_JOB = "gtrain.dev/job"
#: the line each pod ends its log with, per rank that exited (read back from the termination message)
RANK_EXIT = "[gtrain] rank-exit"

ENTRY = r"""set -uo pipefail
K="${JOB_COMPLETION_INDEX:?not a pod of an Indexed Job}"
mkdir -p /gtrain && tar -xzf /gtrain-bundle/bundle.tgz -C /gtrain || { echo "[gtrain] bundle unreadable"; exit 96; }
D=/gtrain/node-$K
mkdir -p "$D/logs"
bash "$D/launch.sh" &
lp=$!
trap 'kill -TERM "$lp" 2>/dev/null' TERM INT
(seen=" "; while :; do  # each rank's log into the pod log, prefixed, from when the rank makes it
  alive=0; kill -0 "$lp" 2>/dev/null && alive=1
  for f in "$D"/logs/rank-*.log; do
    [ -e "$f" ] && [ "${seen#* $f }" = "$seen" ] || continue
    seen="$seen$f "; r=${f##*/rank-}; r=${r%.log}
    (tail -n +1 -F --pid="$lp" "$f" 2>/dev/null | sed -u "s/^/[rank $r] /") &
  done
  [ "$alive" = 1 ] || break; sleep 0.2
done; wait) &
wait "$lp"; rc=$?
while kill -0 "$lp" 2>/dev/null; do wait "$lp"; rc=$?; done
wait
for f in "$D"/logs/rank-*.exit; do  # read back from the log's tail (a failed pod's termination message)
  [ -e "$f" ] || continue
  r=${f##*/rank-}; echo "[gtrain] rank-exit ${r%.exit} $(cat "$f")"
done
exit "$rc"
"""


def k8s_name(job_id: str, cluster: str) -> str:
    """The Job's (and Service's) name: DNS-1035, short enough that ``<name>-<index>`` is a pod hostname."""
    tail = job_id[len(cluster) + 1:] if job_id.startswith(cluster + "-") else job_id
    tail = tail.replace("-", "")[-12:] if tail.replace("-", "").isalnum() else tail[-12:]
    return f"{cluster[:30].rstrip('-')}-{tail}".lower()


def anchor_name(cluster: str, cluster_id: str) -> str:
    """The cluster's own ConfigMap (made at `up`): ``gtrain-<name>-<id tail>``, a DNS-1123 name."""
    tail = "".join(ch for ch in cluster_id.lower() if ch.isalnum())[-8:]
    return f"gtrain-{cluster.lower()[:40].strip('-.')}-{tail}"


def pod_host(name: str, k: int) -> str:
    """Pod K's stable name, resolvable in the namespace through the headless Service."""
    return f"{name}-{k}.{name}"


def labels(cluster_id: str, job_id: str | None = None) -> dict[str, str]:
    out = {LABEL_CLUSTER: cluster_id[:63], "app.kubernetes.io/managed-by": "gtrain"}
    if job_id:
        out[LABEL_JOB] = job_id[-63:].strip("-_.")
    return out


def bundle(workdir: Path, files: dict[int, dict[str, str]]) -> bytes:
    """The gzipped tar of ``workdir/`` and ``node-K/`` (node K's scripts), checked against the ConfigMap limit."""
    from gtrain.sync.workdir import list_workdir

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for rel in list_workdir(workdir):
            tar.add(str(workdir / rel), arcname=f"workdir/{rel}", recursive=False)
        for k, named in files.items():
            for name, text in named.items():
                data = text.encode()
                info = tarfile.TarInfo(f"{name}" if name.startswith("node-") else f"node-{k}/{name}")
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    if len(data) > BUNDLE_LIMIT:
        raise ConfigError(
            f"job.workdir: {str(workdir)!r} packs to {len(data) // 1024} KiB, more than the {BUNDLE_LIMIT // 1024} KiB "
            "a ConfigMap carries on provider kubernetes", field="job.workdir",
            hint="bake the code into job.image (and set job.workdir to a small folder), or leave big files out "
                 "with .gtrainignore")
    return data


def objects(request: JobRequest, opts: KubernetesOptions, name: str, master_port: int, nproc: int,
            bundle_bytes: bytes | None, gpu_label: tuple[str, str] | None) -> list[dict[str, Any]]:
    """The ConfigMap, headless Service and Indexed Job of one launch (``bundle_bytes`` None: elided)."""
    spec, cluster = request.spec, request.cluster
    job = spec.job
    assert job is not None and job.image
    ns = opts.namespace
    lab = labels(cluster.id, request.job_id)
    meta = {"name": name, "namespace": ns, "labels": lab}
    n = cluster.num_nodes
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                          "binaryData": {"bundle.tgz": base64.b64encode(bundle_bytes).decode() if bundle_bytes
                                         is not None else "<the workdir and node scripts, gzipped tar>"}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
           "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {LABEL_JOB: lab[LABEL_JOB]},
                    "ports": [{"name": "rdzv", "port": master_port, "targetPort": master_port}]}}
    gpus = spec.resources.gpus_per_node if spec.resources.accelerators else 0
    limits: dict[str, Any] = {}
    if gpus:
        limits[opts.gpu_resource] = str(gpus)
    env = [{"name": "GTRAIN_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    env += [{"name": s, "valueFrom": {"secretKeyRef": {"name": name, "key": s}}} for s in job.secrets]  # no values
    security: dict[str, Any] = {}
    if opts.use_rdma():
        from gtrain.providers.kubernetes.options import RDMA_ENV, RDMA_RESOURCE

        limits[RDMA_RESOURCE] = "1"
        env += [{"name": k, "value": v} for k, v in RDMA_ENV.items() if k not in job.env]
        security = {"capabilities": {"add": ["IPC_LOCK"]}}
    mounts = [{"name": "bundle", "mountPath": BUNDLE_DIR, "readOnly": True},
              {"name": "work", "mountPath": ROOT}]
    volumes: list[dict[str, Any]] = [{"name": "bundle", "configMap": {"name": name}}, {"name": "work", "emptyDir": {}}]
    if opts.shm_gb:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{int(opts.shm_gb * 1024)}Mi"}})
    for i, v in enumerate(opts.volumes):
        mounts.append({"name": f"vol{i}", "mountPath": v.mount, "readOnly": v.read_only})
        volumes.append({"name": f"vol{i}", "persistentVolumeClaim": {"claimName": v.claim, "readOnly": v.read_only}})
    container: dict[str, Any] = {
        "name": "node", "image": job.image, "command": ["bash", "-c", ENTRY], "env": env, "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError"}
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    if security:
        container["securityContext"] = security
    selector = dict(opts.node_selector)
    if gpu_label is not None:
        selector.setdefault(*gpu_label)
    pod: dict[str, Any] = {
        "restartPolicy": "Never", "subdomain": name, "containers": [container], "volumes": volumes,
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {LABEL_JOB: lab[LABEL_JOB]}},
             "topologyKey": "kubernetes.io/hostname"}]}}}
    if selector:
        pod["nodeSelector"] = selector
    if opts.tolerations:
        pod["tolerations"] = [t.model_dump(exclude_none=True) for t in opts.tolerations]
    if opts.priority_class:
        pod["priorityClassName"] = opts.priority_class
    if opts.service_account:
        pod["serviceAccountName"] = opts.service_account
    if opts.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    job_meta = dict(meta)
    if opts.queue:
        job_meta = {**meta, "labels": {**lab, "kueue.x-k8s.io/queue-name": opts.queue}}
    kjob = {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta,
            "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 0,
                     "suspend": bool(opts.queue),
                     "template": {"metadata": {"labels": lab}, "spec": pod}}}
    return [cm, svc, kjob]


def secret(request: JobRequest, namespace: str, name: str) -> dict[str, Any] | None:
    """The job's Secret (job.secrets' values from this machine's environment), created at submit only: the
    values never reach the Job, its pods' specs, the ConfigMap, `launch --dry-run` or state."""
    import os

    job = request.spec.job
    assert job is not None
    if not job.secrets:
        return None
    missing = [s for s in job.secrets if s not in os.environ]
    if missing:
        raise ConfigError(f"job.secrets: {', '.join(missing)} not set in this environment", field="job.secrets",
                          hint="export it before `gtrain launch`, or drop it from job.secrets")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(request.cluster.id, request.job_id)},
            "stringData": {s: os.environ[s] for s in job.secrets}}


def dump_yaml(objs: list[dict[str, Any]]) -> str:
    import yaml

    return "---\n".join(yaml.safe_dump(o, sort_keys=False, width=120) for o in objs)


def checksum(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}"
