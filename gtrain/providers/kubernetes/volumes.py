"""The spec's ``volumes:`` on kubernetes (docs/volumes.md): ``type: pvc``, a PersistentVolumeClaim of the
namespace named like the volume, labelled ``app.kubernetes.io/managed-by=gtrain`` and ``gtrain.dev/volume=NAME``
(never ``gtrain.dev/cluster``: neither ``down`` nor ``gtrain gc``'s object sweep deletes one), made once by ``up``
(or ``gtrain volume create``), mounted at ``mount`` in every pod of every launch, left by ``down``, deleted only by
``gtrain volume delete``. A part of :class:`gtrain.providers.kubernetes.provider.KubernetesProvider`.

- Size: ``size_gb`` is required and asked as ``<size_gb>Gi``; an existing claim is never shrunk (the API server
  refuses it: "spec.resources.requests.storage: Forbidden: field can not be less than previous value"): a smaller
  ``size_gb`` is refused at ``up`` (exit 2); a larger one expands the claim (where its StorageClass allows).
- Access mode: ``ReadWriteOnce`` for one pod; the pods of a multi-node cluster sit on different nodes (the Job's
  anti-affinity), so they need ``ReadWriteMany`` (``ReadOnlyMany`` with ``read_only: true``). An existing claim
  whose modes do not cover that is refused at ``up``. ``kubernetes.storage_class`` picks the StorageClass
  (default: the cluster's default class).
- Held: ``up`` writes the cluster into the claim's annotations (``gtrain.dev/held-by``), ``down`` removes it. A
  claim held by another live cluster (its anchor ConfigMap exists) is refused read-write, and read-only unless
  the claim is ``ReadOnlyMany``/``ReadWriteMany``.
- A claim of that name that gtrain did not make (no ``gtrain.dev/volume`` label: the old ``kubernetes.volumes``
  claims) is mounted as it is and never deleted or resized by gtrain.
- Charge: ``kubernetes.storage_price_per_gb_month`` (default 0: a cluster's storage price is its operator's).

API reference: PersistentVolumeClaim v1
(https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/persistent-volume-claim-v1/),
access modes (https://kubernetes.io/docs/concepts/storage/persistent-volumes/#access-modes), expansion
(https://kubernetes.io/docs/concepts/storage/persistent-volumes/#expanding-persistent-volumes-claims).
"""

from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.providers.kubernetes import objects as ko
from gtrain.providers.kubernetes.api import edge, is_not_found
from gtrain.spec.volumes import VolumeInfo, type_of

if TYPE_CHECKING:
    from gtrain.providers.kubernetes.host import KubeHost
    from gtrain.providers.kubernetes.options import KubernetesOptions
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import Volume
    from gtrain.state import Cluster

LABEL_VOLUME = "gtrain.dev/volume"
MANAGED = {"app.kubernetes.io/managed-by": "gtrain"}
ANN_HELD_BY = "gtrain.dev/held-by"
ANN_HELD_NAME = "gtrain.dev/held-by-name"
ANN_CREATED = "gtrain.dev/created"
RWO, ROX, RWX = "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"
_QTY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "k": 10**3,
          "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def gib(quantity: Any) -> int | None:
    """A storage quantity ("20Gi", "500M", "1Ti") in GiB, rounded up; None when unreadable."""
    m = _QTY.match(str(quantity or "").strip())
    if not m:
        return None
    return math.ceil(float(m.group(1)) * _UNITS[m.group(2)] / 2**30)


def pvc_volumes(spec: ClusterSpec) -> list[tuple[int, Volume]]:
    return [(i, v) for i, v in enumerate(spec.volumes or []) if type_of(spec, v) == "pvc"]


def access_mode(vol: Volume, num_nodes: int) -> str:
    """The mode every pod of the cluster needs: one pod RWO; pods on several nodes RWX (ROX when read-only)."""
    if num_nodes > 1:
        return ROX if vol.read_only else RWX
    return RWO


def covers(modes: list[str], need: str) -> bool:
    """Whether a claim of ``modes`` serves pods that need ``need`` (RWX serves all; one pod: RWOP too)."""
    return need in modes or RWX in modes or (need == RWO and "ReadWriteOncePod" in modes)


def check_spec(spec: ClusterSpec, opts: KubernetesOptions) -> None:
    """Before anything is made: sizes given, no mount shared with kubernetes.volumes (one line, exit 2)."""
    for i, vol in pvc_volumes(spec):
        if vol.size_gb is None:
            raise ConfigError(f"volumes[{i}].size_gb: required for a PersistentVolumeClaim ({vol.name})",
                              hint="add size_gb: 100 (GiB; an existing claim is never shrunk)",
                              field=f"volumes[{i}].size_gb")
        for old in opts.volumes:
            if old.mount == vol.mount or old.mount.startswith(vol.mount + "/") or vol.mount.startswith(old.mount + "/"):
                raise ConfigError(f"volumes[{i}].mount: {vol.mount} overlaps kubernetes.volumes' {old.mount} "
                                  f"(claim {old.claim})", hint="move the claim into volumes: (kubernetes.volumes "
                                  "is deprecated) or pick another folder", field=f"volumes[{i}].mount")


def plan_notes(spec: ClusterSpec, opts: KubernetesOptions) -> list[str]:
    vols = pvc_volumes(spec)
    notes = []
    if vols:
        sc = f"StorageClass {opts.storage_class}" if opts.storage_class else "the default StorageClass"
        notes.append("volumes: PersistentVolumeClaims " + ", ".join(
            f"{v.name} ({v.size_gb}Gi {access_mode(v, spec.num_nodes)} at {v.mount})" for _, v in vols)
            + f" in {opts.namespace} ({sc}); made once, found by label {LABEL_VOLUME}=NAME, mounted in every pod, "
            "kept by `down` until `gtrain volume delete NAME`"
            + (f" (${opts.storage_price_per_gb_month:g}/GB-month)" if opts.storage_price_per_gb_month else ""))
    if opts.volumes:
        notes.append("kubernetes.volumes is deprecated: list the claims under volumes: (type pvc; docs/volumes.md)")
    return notes


def _holder(claim: dict[str, Any]) -> tuple[str, str] | None:
    ann = (claim.get("metadata") or {}).get("annotations") or {}
    cid = ann.get(ANN_HELD_BY)
    return (str(cid), str(ann.get(ANN_HELD_NAME) or cid)) if cid else None


class KubeVolumes:
    """Finding, making, holding and releasing the spec's claims; ``gtrain volume`` for kubernetes."""

    def __init__(self, provider: KubeHost) -> None:
        self.provider = provider
        self.store = provider.store
        self.report = provider.report

    # ---- finding ----

    @staticmethod
    def get(c: Any, ns: str, name: str) -> dict[str, Any] | None:
        from lightkube.resources.core_v1 import PersistentVolumeClaim

        try:
            return dict(c.get(PersistentVolumeClaim, name, namespace=ns).to_dict())
        except Exception as e:
            if is_not_found(e):
                return None
            with edge(f"get PersistentVolumeClaim {name}", ns):
                raise

    @staticmethod
    def live(c: Any, ns: str, cluster_id: str) -> bool:
        """Whether the cluster is up: its anchor ConfigMap (made at `up`, deleted at `down`) is there."""
        from lightkube.resources.core_v1 import ConfigMap

        with edge("list ConfigMaps", ns):
            return bool(list(c.list(ConfigMap, namespace=ns, labels={ko.LABEL_CLUSTER: cluster_id[:63]})))

    def info(self, c: Any, ns: str, claim: dict[str, Any], rate: float) -> VolumeInfo:
        meta, spec, st = claim.get("metadata") or {}, claim.get("spec") or {}, claim.get("status") or {}
        held = _holder(claim)
        size = gib((st.get("capacity") or {}).get("storage")) or gib(
            ((spec.get("resources") or {}).get("requests") or {}).get("storage"))
        return VolumeInfo(name=str((meta.get("labels") or {}).get(LABEL_VOLUME) or meta.get("name")),
                          provider="kubernetes", type="pvc", size_gb=size, region=ns, id=meta.get("uid"),
                          state=str(st.get("phase") or "Pending"),
                          attached_to=held[1] if held and self.live(c, ns, held[0]) else None,
                          usd_per_gb_month=rate, created=(meta.get("annotations") or {}).get(ANN_CREATED),
                          extra={"claim": meta.get("name"), "access_modes": spec.get("accessModes") or [],
                                 "storage_class": spec.get("storageClassName")})

    def list_all(self, namespaces: list[str], rate: float = 0.0) -> list[VolumeInfo]:
        from lightkube.resources.core_v1 import PersistentVolumeClaim

        from gtrain.providers.kubernetes.api import client

        out = []
        for ns in namespaces:
            c = client(None, ns)
            with edge("list PersistentVolumeClaims managed by gtrain", ns):
                claims = [p.to_dict() for p in c.list(PersistentVolumeClaim, namespace=ns, labels=MANAGED)]
            out += [self.info(c, ns, p, rate) for p in claims if LABEL_VOLUME in (p["metadata"].get("labels") or {})]
        return sorted(out, key=lambda i: (i.name, i.region or ""))

    # ---- up ----

    def prepare(self, spec: ClusterSpec, cluster: Cluster, opts: KubernetesOptions, c: Any) -> None:
        """Before anything is made: refuse a claim smaller than size_gb, of modes the pods cannot share, or held
        by another live cluster (exit 2, naming the field)."""
        ns = opts.namespace
        for i, vol in pvc_volumes(spec):
            claim = self.get(c, ns, vol.name)
            if claim is None:
                continue
            fld = f"volumes[{i}].name"
            size = gib(((claim.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage"))
            if vol.size_gb is not None and size is not None and vol.size_gb < size:
                raise ConfigError(f"volumes[{i}].size_gb: {vol.size_gb} is below claim {vol.name}'s {size}Gi (a "
                                  "PersistentVolumeClaim never shrinks)", hint=f"set size_gb: {size}",
                                  field=f"volumes[{i}].size_gb")
            modes = list((claim.get("spec") or {}).get("accessModes") or [])
            need = access_mode(vol, spec.num_nodes)
            if not covers(modes, need):
                raise ConfigError(f"{fld}: claim {vol.name} is {', '.join(modes) or 'of no access mode'}; the "
                                  f"{spec.num_nodes} pod(s) of {spec.name} on different nodes need {need}",
                                  hint=f"`gtrain volume delete {vol.name}` and let up make it {need}, or num_nodes: "
                                       "1", field=fld)
            held = _holder(claim)
            if held is None or held[0] == cluster.id or not self.live(c, ns, held[0]):
                continue
            if not (vol.read_only and (ROX in modes or RWX in modes)):
                raise ConfigError(f"{fld}: claim {vol.name} is held by cluster {held[1]}"
                                  + ("" if vol.read_only else " (read-write: one cluster at a time)"),
                                  hint=f"`gtrain down {held[1]}` first (the claim stays), or read_only: true on a "
                                       "ReadOnlyMany/ReadWriteMany claim", field=fld)

    def ensure(self, spec: ClusterSpec, cluster: Cluster | None, opts: KubernetesOptions, c: Any,
               only: str | None = None) -> list[dict[str, Any]]:
        """Make each missing claim, grow a smaller one, mark it held by ``cluster``; the records kept with the
        cluster (``extra["volumes"]``: the cost report's standing charge)."""
        ns = opts.namespace
        records = []
        for _i, vol in pvc_volumes(spec):
            if only is not None and vol.name != only:
                continue
            claim = self.get(c, ns, vol.name) or self._create(spec, vol, opts, c)
            ours = LABEL_VOLUME in ((claim.get("metadata") or {}).get("labels") or {})
            size = gib(((claim.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage"))
            changed = False
            if not ours:
                self.report.info(f"claim {vol.name} was not made by gtrain: mounted as it is (gtrain never resizes "
                                 "or deletes it)")
            elif vol.size_gb is not None and size is not None and vol.size_gb > size:
                self.report.info(f"expanding claim {vol.name} from {size}Gi to {vol.size_gb}Gi")
                claim["spec"]["resources"]["requests"]["storage"] = f"{vol.size_gb}Gi"
                changed = True
            if ours and cluster is not None:
                ann = dict(claim["metadata"].get("annotations") or {})
                held = _holder(claim)  # another live cluster's read-only hold stays (prepare allowed the share)
                if held is None or (held[0] != cluster.id and not self.live(c, ns, held[0])):
                    ann.update({ANN_HELD_BY: cluster.id, ANN_HELD_NAME: cluster.name})
                    claim["metadata"]["annotations"] = ann
                    changed = True
            if changed:
                claim = self._replace(c, ns, claim)
            info = self.info(c, ns, claim, opts.storage_price_per_gb_month)
            records.append({"name": vol.name, "id": info.id, "region": ns, "size_gb": info.size_gb,
                            "type": "pvc", "mount": vol.mount, "read_only": vol.read_only, "claim": vol.name,
                            "gtrain_made": ours, "usd_per_gb_month": info.usd_per_gb_month if ours else 0.0})
        if cluster is not None and records:
            fresh = self.store.get_cluster_by_id(cluster.id)
            extra = {**(fresh or cluster).extra, "volumes": records}
            self.store.update_cluster(cluster.id, extra=extra)
            cluster.extra = extra
        return records

    def _create(self, spec: ClusterSpec, vol: Volume, opts: KubernetesOptions, c: Any) -> dict[str, Any]:
        from lightkube import codecs

        ns = opts.namespace
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": vol.name, "namespace": ns, "labels": {**MANAGED, LABEL_VOLUME: vol.name},
                         "annotations": {ANN_CREATED: created}},
            "spec": {"accessModes": [access_mode(vol, spec.num_nodes)],
                     "resources": {"requests": {"storage": f"{vol.size_gb}Gi"}}}}
        if opts.storage_class:
            body["spec"]["storageClassName"] = opts.storage_class
        self.report.info(f"{ns}: creating PersistentVolumeClaim {vol.name} ({vol.size_gb}Gi "
                         f"{body['spec']['accessModes'][0]})")
        with edge(f"create PersistentVolumeClaim {vol.name}", ns):
            return dict(c.create(codecs.from_dict(body)).to_dict())

    @staticmethod
    def _replace(c: Any, ns: str, claim: dict[str, Any]) -> dict[str, Any]:
        from lightkube import codecs

        name = claim["metadata"]["name"]
        with edge(f"update PersistentVolumeClaim {name}", ns):
            return dict(c.replace(codecs.from_dict(claim)).to_dict())

    # ---- down ----

    def release(self, cluster: Cluster) -> list[VolumeInfo]:
        """The cluster's hold taken off each claim it held; each is left, and returned with its charge."""
        fresh = self.store.get_cluster_by_id(cluster.id)
        records = [r for r in (fresh or cluster).extra.get("volumes") or [] if isinstance(r, dict)]
        if not records:
            return []
        c = self.provider.client(cluster)
        out = []
        for r in records:
            ns = str(r.get("region") or "default")
            claim = self.get(c, ns, str(r.get("claim") or r.get("name")))
            if claim is None:
                continue
            ann = (claim.get("metadata") or {}).get("annotations") or {}
            if ann.get(ANN_HELD_BY) == cluster.id:
                for k in (ANN_HELD_BY, ANN_HELD_NAME):
                    ann.pop(k, None)
                claim["metadata"]["annotations"] = ann
                claim = self._replace(c, ns, claim)
            if r.get("gtrain_made", True):
                out.append(self.info(c, ns, claim, float(r.get("usd_per_gb_month") or 0.0)))
        return out

    # ---- gtrain volume ----

    def delete(self, name: str, namespaces: list[str]) -> VolumeInfo | None:
        from lightkube.resources.core_v1 import PersistentVolumeClaim

        from gtrain.providers.kubernetes.api import client

        for ns in namespaces:
            c = client(None, ns)
            claim = self.get(c, ns, name)
            if claim is None or LABEL_VOLUME not in ((claim.get("metadata") or {}).get("labels") or {}):
                continue  # not there, or a claim gtrain did not make: never deleted here
            info = self.info(c, ns, claim, 0.0)
            if info.attached_to:
                raise ConfigError(f"volume {name} (claim in {ns}) is held by cluster {info.attached_to}",
                                  hint=f"`gtrain down {info.attached_to}` first (it lets go of the claim)",
                                  field="NAME")
            with edge(f"delete PersistentVolumeClaim {name}", ns):
                c.delete(PersistentVolumeClaim, name, namespace=ns)
            info.state = "deleted"
            return info
        return None
