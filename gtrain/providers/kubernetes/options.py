"""The spec's ``kubernetes:`` section: its model (and the CoreWeave profile), its errors as ``kubernetes.<field>``
ConfigErrors (exit 2)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gtrain.errors import ConfigError
from gtrain.spec import Float
from gtrain.spec.data import duplicates, has_control

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec

# \Z, not $: `$` matches before a final newline, and a key or list item keeps it
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?\Z")
#: where gtrain mounts its own volumes in every pod (objects.py's ROOT, BUNDLE_DIR, CKPT_DIR and /dev/shm; a test
#: holds them equal): a volume may not be at, over or inside one
GTRAIN_MOUNTS = ("/gtrain", "/gtrain-bundle", "/gtrain-ckpt", "/dev/shm")
MAX_SHM_GB = 1024

#: the GPU node labels `gpu_label: auto` looks for, in order (GPU feature discovery, CoreWeave, GKE, EKS)
GPU_LABELS = ("nvidia.com/gpu.product", "gpu.nvidia.com/class", "cloud.google.com/gke-accelerator",
              "k8s.amazonaws.com/accelerator")

#: CoreWeave's GPU class label values by gtrain's GPU names (resources.accelerators)
COREWEAVE_CLASSES = {"H100": "H100_NVLINK_80GB", "H200": "H200_NVLINK_141GB", "A100": "A100_NVLINK_80GB",
                     "A100-80GB": "A100_NVLINK_80GB", "A100-40GB": "A100_NVLINK", "L40S": "L40S",
                     "L40": "L40", "A40": "A40", "GH200": "GH200_480GB", "B200": "B200"}
#: the NCCL/InfiniBand environment of `rdma: true` (CoreWeave's documented values for its IB fabric)
RDMA_ENV = {"NCCL_IB_HCA": "ibp", "UCX_NET_DEVICES": "ibp0:1,ibp1:1,ibp2:1,ibp3:1,ibp4:1,ibp5:1,ibp6:1,ibp7:1",
            "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "0"}
RDMA_RESOURCE = "rdma/ib"
#: CoreWeave's on-demand list price of an H100 HGX GPU-hour (its profile's default chargeback rate)
COREWEAVE_PRICE = {"H100": 6.155, "H200": 6.31, "A100": 2.7, "A100-80GB": 2.7, "L40S": 2.25, "L40": 1.25}


class Volume(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    claim: str = Field(..., description="a PersistentVolumeClaim of the namespace")
    mount: str = Field(..., description="where the pods see it (an absolute path)")
    read_only: bool = Field(False, description="mounted read-only")

    @field_validator("claim")
    @classmethod
    def _claim(cls, v: str) -> str:
        if not _DNS_LABEL.match(v) and not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", v):
            raise ValueError("is not a claim name (lower-case letters, digits, '-', '.')")
        return v

    @field_validator("mount")
    @classmethod
    def _mount(cls, v: str) -> str:
        parts = v.split("/")
        if not v.startswith("/") or has_control(v) or ":" in v or ".." in parts:
            raise ValueError("must be an absolute path without '..', ':' or control characters (e.g. /data)")
        v = "/" + "/".join(p for p in parts if p not in ("", "."))
        for own in GTRAIN_MOUNTS:
            if v == "/" or v == own or own.startswith(v + "/") or v.startswith(own + "/"):
                raise ValueError(f"is at, over or inside {own}, which gtrain mounts itself ("
                                 + ", ".join(GTRAIN_MOUNTS) + "); pick another folder, e.g. /data")
        return v


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    @field_validator("key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        if v is not None and not _QUALIFIED.match(v):
            raise ValueError("is not a taint key (a qualified name like nvidia.com/gpu, no control characters)")
        return v

    @field_validator("value")
    @classmethod
    def _value(cls, v: str | None) -> str | None:
        if v is not None and not _LABEL_VALUE.match(v):
            raise ValueError("is not a taint value (at most 63 of letters, digits, '-', '_', '.'; no control "
                             "characters)")
        return v


class KubernetesOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    profile: Literal["coreweave"] | None = Field(None, description="`coreweave`: CoreWeave's GPU class label and "
                                                 "values, rdma/ib with the NCCL IB env, its list price")
    context: str | None = Field(None, description="kubeconfig context (KUBECONFIG honoured; in a pod: the "
                                                  "in-cluster config)")
    namespace: str = Field("default", description="where the Job, Service and ConfigMap go")
    gpu_resource: str = Field("nvidia.com/gpu", description="the extended resource a pod asks its GPUs as")
    gpu_label: str = Field("auto", description="the node label naming the GPU model; `auto`: the first of "
                           + ", ".join(GPU_LABELS) + " that nodes carry")
    node_selector: dict[str, str] = Field(default_factory=dict, description="more node labels the pods need")
    tolerations: list[Toleration] = Field(default_factory=list, description="taints the pods tolerate")
    priority_class: str | None = Field(None, description="the pods' priorityClassName")
    queue: str | None = Field(None, description="a Kueue LocalQueue (label kueue.x-k8s.io/queue-name; the Job "
                                                "is created suspended)")
    shm_gb: Float = Field(16, ge=0, le=MAX_SHM_GB, allow_inf_nan=False, description="/dev/shm as a memory-backed "
                          f"emptyDir of this size, GB (0: none; at most {MAX_SHM_GB})")
    volumes: list[Volume] = Field(default_factory=list, description="deprecated: list the claims under the "
                                  "spec's `volumes:` (type pvc; docs/volumes.md). PersistentVolumeClaims to mount: "
                                  "[{claim: datasets, mount: /data, read_only: true}]")
    storage_class: str | None = Field(None, description="the StorageClass of the claims `volumes:` makes "
                                      "(default: the cluster's default class)")
    storage_price_per_gb_month: float = Field(0.0, ge=0, allow_inf_nan=False, description="$ per GiB-month of "
                                              "the claims `volumes:` makes, for the cost report's standing "
                                              "charge (default 0)")
    rdma: bool = Field(False, description="ask rdma/ib, add IPC_LOCK and the NCCL_IB_* env (InfiniBand)")
    service_account: str | None = Field(None, description="the pods' serviceAccountName")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets of the namespace to pull "
                                                                             "job.image with")
    pending_timeout_s: float | None = Field(None, gt=0, description="a launch whose pods are still Pending this "
                                            "many seconds after it was created (unschedulable, not admitted by "
                                            "Kueue, an image not pulled) is cancelled and fails with the "
                                            "scheduler's reason (default: wait as long as it takes)")
    price_per_gpu_hour: float | None = Field(None, ge=0, description="$ per GPU-hour of pod running time, for the "
                                             "cost report (default 0; the coreweave profile: its list price)")

    @field_validator("context")
    @classmethod
    def _context(cls, v: str | None) -> str | None:
        if v is not None and (not v or has_control(v) or len(v) > 253):
            raise ValueError("is not a kubeconfig context name (one line of text, no control characters; "
                             "`kubectl config get-contexts` lists them)")
        return v

    @field_validator("namespace", "priority_class", "queue", "service_account")
    @classmethod
    def _dns(cls, v: str | None) -> str | None:
        if v is not None and not _DNS_LABEL.match(v):
            raise ValueError("is not a Kubernetes name (1-63 of a-z, 0-9, '-'; starts and ends alphanumeric)")
        return v

    @field_validator("storage_class")
    @classmethod
    def _storage_class(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 253 or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z", v)):
            raise ValueError("is not a StorageClass name (lower-case letters, digits, '-', '.'; `kubectl get "
                             "storageclass` lists them)")
        return v

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        for s in v:
            if not _DNS_LABEL.match(s):
                raise ValueError(f"{s!r} is not a Secret name")
        return v

    @field_validator("gpu_resource", "gpu_label")
    @classmethod
    def _qualified(cls, v: str) -> str:
        if not _QUALIFIED.match(v):
            raise ValueError("is not a qualified name like nvidia.com/gpu")
        return v

    @field_validator("node_selector", mode="before")
    @classmethod
    def _raw_labels(cls, v: Any) -> Any:  # before stripping: a key's trailing newline is no label either
        if isinstance(v, dict):
            for k, val in v.items():
                if (isinstance(k, str) and has_control(k)) or (isinstance(val, str) and has_control(val)):
                    raise ValueError(f"{str(k)[:40]!r}: a label key or value holds a control character (newline, "
                                     "NUL, escape); write label keys like example.com/pool, values like gpu-a")
        return v

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not _QUALIFIED.match(k):
                raise ValueError(f"{k!r} is not a label key (a qualified name like example.com/pool, no control "
                                 "characters)")
            if not _LABEL_VALUE.match(val):
                raise ValueError(f"the value of {k!r} is not a label value (at most 63 of letters, digits, '-', "
                                 "'_', '.'; no control characters)")
        return v

    @field_validator("volumes")
    @classmethod
    def _distinct_mounts(cls, v: list[Volume]) -> list[Volume]:
        if twice := duplicates([x.mount for x in v]):
            raise ValueError(f"mount {twice} given more than once; give each volume its own folder")
        return v

    # ---- what the profile decides --------------------------------------------------------------

    def label_key(self) -> str | None:
        """The GPU label key, or None for `auto` (the provider looks at the nodes)."""
        if self.gpu_label != "auto":
            return self.gpu_label
        return "gpu.nvidia.com/class" if self.profile == "coreweave" else None

    def label_value(self, key: str, gpu_name: str | None) -> str | None:
        if not gpu_name:
            return None
        if key == "gpu.nvidia.com/class":
            return COREWEAVE_CLASSES.get(gpu_name.upper(), gpu_name)
        return None  # other labels' values name models in their own words: matched at `up`, not pinned

    def use_rdma(self) -> bool:
        return self.rdma or self.profile == "coreweave"

    def rate(self, gpu_name: str | None) -> float:
        if self.price_per_gpu_hour is not None:
            return self.price_per_gpu_hour
        if self.profile == "coreweave":
            return COREWEAVE_PRICE.get((gpu_name or "").upper(), 0.0)
        return 0.0


def parse_options(spec: ClusterSpec) -> KubernetesOptions:
    from gtrain.spec import translate_validation_error

    raw: dict[str, Any] | None = spec.section("kubernetes")
    try:
        opts = KubernetesOptions.model_validate(raw or {})
    except ValidationError as e:
        err = translate_validation_error(e, KubernetesOptions)
        fields = "|".join(KubernetesOptions.model_fields)  # a problem starts with its field; a "; " inside one stays
        msg = re.sub(rf"(invalid spec: |; )(?=(?:{fields})\b)", r"\1kubernetes.", err.message)
        raise ConfigError(msg, hint=err.hint, field=f"kubernetes.{err.field}") from None
    if spec.resources.use_spot:
        raise ConfigError("resources.use_spot: true — spot capacity on Kubernetes is the node pool's business",
                          hint="remove use_spot; pick spot nodes with kubernetes.node_selector/tolerations",
                          field="resources.use_spot")
    if spec.job is not None and not spec.job.image:
        raise ConfigError("job.image: provider kubernetes runs every pod from a container image, none is given",
                          hint="e.g. job.image: nvcr.io/nvidia/pytorch:25.01-py3", field="job.image")
    if spec.job is not None and spec.job.data:
        raise ConfigError("job.data: not supported on provider kubernetes yet",
                          hint="mount the data as a volume (volumes: with type pvc; docs/volumes.md)",
                          field="job.data")
    return opts
