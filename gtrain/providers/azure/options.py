"""The ``azure:`` section of a spec: :class:`AzureOptions` and :func:`azure_options`, which validates it."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from gtrain.providers.cloud.options import CloudOptions, section_options
from gtrain.spec.data import has_control

__all__ = ["DEFAULT_IMAGE", "AzureOptions", "azure_options"]

#: the Ubuntu-HPC marketplace image: NVIDIA driver, CUDA, NCCL, InfiniBand drivers (publisher:offer:sku:version)
DEFAULT_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
_URN = re.compile(r"^[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+$")
#: user names Azure refuses for a VM's admin account (learn.microsoft.com, Azure Linux VM FAQ: "What are the
#: username requirements when creating a VM?")
RESERVED_USERS = frozenset({
    "administrator", "admin", "user", "user1", "test", "user2", "test1", "user3", "admin1", "1", "123", "a",
    "actuser", "adm", "admin2", "aspnet", "backup", "console", "david", "guest", "john", "owner", "root", "server",
    "sql", "support", "support_388945a0", "sys", "test2", "test3", "user4", "user5"})
#: Azure's limit of tags on one resource, and the gtrain-* tags gtrain adds (cluster, cluster-name, owner,
#: created; rank on a VM)
MAX_TAGS = 50
GTRAIN_TAGS = 5
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

    @field_validator("ssh_user")
    @classmethod
    def _user(cls, v: str) -> str:
        if v.lower() in RESERVED_USERS:
            raise ValueError("is a user name Azure reserves (root, admin, administrator, user, test, guest, ...); "
                             "pick another, e.g. gtrain")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not _URN.match(v):
            raise ValueError("must be a marketplace URN publisher:offer:sku:version, e.g. " + DEFAULT_IMAGE)
        return v

    @field_validator("vnet_cidr")
    @classmethod
    def _vnet_cidr(cls, v: str) -> str:  # its own name: `_cidr` would replace CloudOptions' ssh_cidr check
        try:
            net = ipaddress.ip_network(v, strict=True)
        except ValueError:
            raise ValueError("must be a private IPv4 network such as 10.77.0.0/16") from None
        if net.version != 4 or not net.is_private or net.prefixlen > 24 or net.is_loopback or net.is_link_local \
                or net.overlaps(ipaddress.ip_network("0.0.0.0/8")):
            raise ValueError("must be a private IPv4 network of /24 or larger, e.g. 10.77.0.0/16")
        return str(net)

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_TAGS - GTRAIN_TAGS:
            raise ValueError(f"{len(v)} tags; Azure allows {MAX_TAGS} on a resource and gtrain adds {GTRAIN_TAGS} "
                             f"(gtrain-*): give at most {MAX_TAGS - GTRAIN_TAGS}")
        for k, val in v.items():
            if k.lower().startswith("gtrain-") or k.lower().startswith(("azure", "microsoft", "windows")):
                raise ValueError(f"tag {k!r} is set by gtrain or reserved by Azure; pick another key")
            if not k or len(k) > 512 or len(val) > 256 or any(c in k for c in "<>%&\\?/") or has_control(k + val):
                raise ValueError(f"{k}={val!r} is not an Azure tag (name 1-512 characters without <>%&\\?/, "
                                 "value at most 256)")
        return v


def azure_options(section: dict[str, Any] | None) -> AzureOptions:
    """Validate the spec's ``azure:`` section; a ConfigError names the field (``azure.vnet_cidr``)."""
    return section_options("azure", AzureOptions, section)
