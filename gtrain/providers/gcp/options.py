"""The ``gcp:`` section of a spec: :class:`GCPOptions` and :func:`gcp_options`, which validates it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from gtrain.providers.cloud.options import CloudOptions, section_options
from gtrain.providers.gcp import api

__all__ = ["CONTAINER_IMAGE_FAMILIES", "DEFAULT_IMAGE_FAMILY", "DEFAULT_IMAGE_PROJECT", "GCPOptions", "gcp_options"]

DEFAULT_IMAGE_PROJECT = "deeplearning-platform-release"
DEFAULT_IMAGE_FAMILY = "common-cu124-ubuntu-2204-py310"
#: Deep Learning VM families that ship Docker and the NVIDIA Container Toolkit (job.image runs there as is;
#: cloud.google.com/deep-learning-vm/docs/images)
CONTAINER_IMAGE_FAMILIES = frozenset({DEFAULT_IMAGE_FAMILY})


class GCPOptions(CloudOptions):
    """The ``gcp:`` section of a spec (ssh_cidr, ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s: CloudOptions)."""

    proxy_host: ClassVar[str] = "the instance name"
    proxy_example: ClassVar[str] = "gcloud compute start-iap-tunnel %h 22 --listen-on-stdin --zone ZONE"

    project: str | None = Field(None, description="else GOOGLE_CLOUD_PROJECT / gcloud's / the credentials' project")
    ssh_user: str = Field("gtrain", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    host_key_wait_s: float = Field(120, ge=0, description="how long to wait for the host keys the guest agent "
                                   "publishes in guest attributes (hostkeys/) before trusting on first use")
    network: str = "default"
    subnetwork: str | None = None
    external_ip: bool | None = Field(None, description="default: yes, unless ssh_proxy_command is set")
    disk_type: Literal["pd-balanced", "pd-ssd", "pd-standard"] = "pd-balanced"
    image_project: str = DEFAULT_IMAGE_PROJECT
    image_family: str = DEFAULT_IMAGE_FAMILY
    service_account: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # Cloud TPU slices (resources.accelerators: tpu-...; docs/providers/tpu.md)
    runtime_version: str = Field("auto", description="TPU software version (auto: the type's default, e.g. "
                                 "v2-alpha-tpuv5 for v5p)")
    queued: bool = Field(False, description="TPU: ask through a queued resource (spot and large slices)")
    topology: str | None = Field(None, description="TPU: the slice's chip topology (2x2x4); default: the type's")

    @field_validator("project")
    @classmethod
    def _project(cls, v: str | None) -> str | None:
        import re

        if v is not None and not re.fullmatch(r"[a-z][-a-z0-9]{4,28}[a-z0-9]|[a-z0-9.:-]+", v):
            raise ValueError("is not a GCP project id (6-30 of a-z, 0-9 and -)")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if k.startswith("gtrain-") or k.startswith("goog"):
                raise ValueError(f"label {k!r} is set by gtrain or Google; pick another key")
            if not api.LABEL_KEY_RE.match(k) or not api.LABEL_VALUE_RE.match(val):
                raise ValueError(f"{k}={val!r} is not a GCE label (keys: lowercase letter first, then a-z 0-9 _ -; "
                                 "values: a-z 0-9 _ -; at most 63 each)")
        return v


def gcp_options(section: dict[str, Any] | None) -> GCPOptions:
    """Validate the spec's ``gcp:`` section; a ConfigError names the field (``gcp.ssh_cidr``)."""
    return section_options("gcp", GCPOptions, section)
