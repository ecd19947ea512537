"""The ``nebius:`` section of a spec: :class:`NebiusOptions` and :func:`nebius_options`, which validates it."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from gtrain.providers.cloud.options import CloudOptions, section_options

__all__ = ["NebiusOptions", "nebius_options"]

#: Nebius ids: a kind prefix, a dash, then a region code and letters/digits (``project-e00abc...``)
ID = r"^[a-z][a-z0-9]*-[a-z0-9]{3,40}$"
#: Nebius's Ubuntu 22.04 image with the NVIDIA driver and CUDA 12 (https://docs.nebius.com/compute/storage/boot-disk-images)
DEFAULT_IMAGE_FAMILY = "ubuntu22.04-cuda12"


class NebiusOptions(CloudOptions):
    """The ``nebius:`` section (ssh_cidr, ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s, idle_command:
    CloudOptions)."""

    proxy_host: ClassVar[str] = "the instance's public IP"

    project_id: str = Field(..., pattern=ID, description="the project (parent id) the instances go in: "
                            "project-e00...; `nebius iam project list` lists them")
    subnet_id: str = Field(..., pattern=ID, description="the VPC subnet of the instances' network interface: "
                           "vpcsubnet-...; `nebius vpc subnet list`")
    platform: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{1,40}$",
                                 description="the platform (gpu-h100-sxm, gpu-h200-sxm, gpu-b200-sxm); default: "
                                 "the one of resources.accelerators")
    preset: str | None = Field(None, pattern=r"^\d+gpu-\d+vcpu-\d+gb$",
                               description="the preset (8gpu-128vcpu-1600gb); default: the platform's preset with "
                               "resources.accelerators' GPU count")
    image_family: str = Field(DEFAULT_IMAGE_FAMILY, pattern=r"^[a-z0-9][a-z0-9.-]{1,62}$",
                              description="the boot disk's public image family")
    disk_type: Literal["NETWORK_SSD", "NETWORK_HDD", "NETWORK_SSD_NON_REPLICATED", "NETWORK_SSD_IO_M3"] = Field(
        "NETWORK_SSD", description="the boot disk's type")
    infiniband_fabric: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{1,40}$",
                                          description="the GPU cluster's InfiniBand fabric (fabric-2, fabric-3, ...); "
                                          "default: the platform's first fabric in gtrain's table")
    public_ip: bool = Field(True, description="give each instance a public address (else reach it over "
                            "ssh_proxy_command)")
    ssh_user: str = Field("gtrain", pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
                          description="the user cloud-init makes, with the cluster's key")
    ssh_port: int = Field(22, ge=1, le=65535, description="the port sshd listens on in the image")
    boot_timeout_s: float = Field(1200, gt=0, description="how long an instance may take to run")

    @field_validator("ssh_cidr")
    @classmethod
    def _nebius_cidr(cls, v: str) -> str:
        if v != "auto":
            raise ValueError("gtrain makes no security group on Nebius (the subnet's own rules apply): leave "
                             "ssh_cidr out, and restrict port 22 on the subnet's security group")
        return v

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[1-9]\d*gpu-\d+vcpu-\d+gb", v):
            raise ValueError("must be <n>gpu-<n>vcpu-<n>gb (e.g. 8gpu-128vcpu-1600gb)")
        return v


def nebius_options(section: dict[str, Any] | None) -> NebiusOptions:
    """Validate the spec's ``nebius:`` section; a ConfigError names the field (``nebius.subnet_id``)."""
    return section_options("nebius", NebiusOptions, section, required=True)
