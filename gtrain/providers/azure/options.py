"""The ``azure:`` section of a spec: :class:`AzureOptions` and :func:`azure_options`, which validates it."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gtrain.providers.cloud.options import CloudOptions

__all__ = ["DEFAULT_IMAGE", "AzureOptions", "azure_options"]

#: the Ubuntu-HPC marketplace image: NVIDIA driver, CUDA, NCCL, InfiniBand drivers (publisher:offer:sku:version)
DEFAULT_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
_URN = re.compile(r"^[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+$")
_SUB = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class AzureOptions(CloudOptions):
    """The ``azure:`` section (ssh_cidr, ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s: CloudOptions)."""

    proxy_host: ClassVar[str] = "the VM name"
    proxy_example: ClassVar[str] = "az network bastion ssh ... (a ProxyCommand reaching %h:22)"

    subscription: str | None = Field(None, description="else AZURE_SUBSCRIPTION_ID, else the Azure CLI's default")
    ssh_user: str = Field("gtrain", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    image: str = Field(DEFAULT_IMAGE, description="marketplace image URN publisher:offer:sku:version "
                                                  "(or set resources.image_id to an image resource id)")
    os_disk_type: Literal["Premium_LRS", "StandardSSD_LRS", "Standard_LRS"] = "Premium_LRS"
    vnet_cidr: str = Field("10.77.0.0/16", description="the cluster's virtual network (its subnet is the first /24)")
    public_ip: bool | None = Field(None, description="default: yes, unless ssh_proxy_command is set")
    accelerated_networking: bool = False
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("subscription")
    @classmethod
    def _sub(cls, v: str | None) -> str | None:
        if v is not None and not _SUB.match(v):
            raise ValueError("is not an Azure subscription id (a GUID like 00000000-0000-0000-0000-000000000000)")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not _URN.match(v):
            raise ValueError("must be a marketplace URN publisher:offer:sku:version, e.g. " + DEFAULT_IMAGE)
        return v

    @field_validator("vnet_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        try:
            net = ipaddress.ip_network(v, strict=True)
        except ValueError:
            raise ValueError("must be a private IPv4 network such as 10.77.0.0/16") from None
        if net.version != 4 or not net.is_private or net.prefixlen > 24:
            raise ValueError("must be a private IPv4 network of /24 or larger, e.g. 10.77.0.0/16")
        return str(net)

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if k.lower().startswith("gtrain-") or k.lower().startswith(("azure", "microsoft", "windows")):
                raise ValueError(f"tag {k!r} is set by gtrain or reserved by Azure; pick another key")
            if not k or len(k) > 512 or len(val) > 256 or any(c in k for c in "<>%&\\?/"):
                raise ValueError(f"{k}={val!r} is not an Azure tag (name 1-512 characters without <>%&\\?/, "
                                 "value at most 256)")
        return v


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
    azure: AzureOptions = Field(default_factory=lambda: AzureOptions())


def azure_options(section: dict[str, Any] | None) -> AzureOptions:
    """Validate the spec's ``azure:`` section; a ConfigError names the field (``azure.vnet_cidr``)."""
    from gtrain.spec import translate_validation_error

    try:
        return _Section.model_validate({"azure": section or {}}).azure
    except ValidationError as e:
        raise translate_validation_error(e, _Section) from None
