"""What the cloud sections (``aws:``, ``gcp:``) share: who may reach port 22, how gtrain gets there, how long
it waits, and what a node runs once it has been idle."""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Any, ClassVar, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from gtrain.spec.data import has_control

#: powers the node off: on EC2 that terminates it (InstanceInitiatedShutdownBehavior), on GCE it stops it
IDLE_COMMAND = ("sudo", "-n", "shutdown", "-h", "now")


def check_cidr(v: str) -> str:
    """``ssh_cidr`` validation shared by the provider sections: 'auto' or a network."""
    if v == "auto":
        return v
    try:
        net = ipaddress.ip_network(v, strict=False)
    except ValueError:
        raise ValueError("must be 'auto' or a CIDR such as 203.0.113.7/32 (an address and a prefix length the "
                         "address family allows)") from None
    return str(net)


class CloudOptions(BaseModel):
    """The fields every cloud section has. Subclasses say what ``%h`` is in their proxy command."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    proxy_host: ClassVar[str] = "the instance"
    proxy_example: ClassVar[str] = "ssh -W %h:22 bastion"

    ssh_cidr: str = Field("auto", description="who may reach port 22: 'auto' = this machine's public /32")
    ssh_proxy_command: str | None = Field(None, description="OpenSSH ProxyCommand; %h = the instance")
    wait_ssh: bool = Field(True, description="wait until every node answers over SSH")
    ssh_timeout_s: float = Field(900, gt=0)
    poll_s: float = Field(2.0, gt=0, le=60)
    idle_command: list[str] = Field(default_factory=lambda: list(IDLE_COMMAND), min_length=1,
                                    description="what a node runs to power itself off: once policies.idle_minutes "
                                    "is up, and (aws) once what is left of its time limit after `gtrain start`")

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        return check_cidr(v)

    @field_validator("ssh_proxy_command")
    @classmethod
    def _proxy(cls, v: str | None) -> str | None:
        if v is not None and has_control(v):
            raise ValueError("holds a control character (newline, NUL, escape); write it on one line")
        if v is not None and "%h" not in v:
            raise ValueError(f"must contain %h ({cls.proxy_host}), e.g. '{cls.proxy_example}'")
        return v

    @field_validator("idle_command")
    @classmethod
    def _idle(cls, v: list[str]) -> list[str]:
        if any(not a or has_control(a) for a in v):
            raise ValueError("an argument is empty or holds a control character (newline, NUL, escape)")
        return v


T = TypeVar("T", bound=BaseModel)


@functools.cache
def _section_model(name: str, model: type[BaseModel], required: bool) -> type[BaseModel]:
    """``{NAME: model}`` with nothing else allowed: what a spec's provider section is validated as, so an error's
    location reads ``NAME.field``."""
    field = Field(..., alias=name) if required else Field(default_factory=model, alias=name)
    out: type[BaseModel] = create_model(f"{model.__name__}Section", __config__=ConfigDict(extra="forbid"),
                                        section=(model, field))
    return out


def section_options(name: str, model: type[T], section: dict[str, Any] | None, *, required: bool = False) -> T:
    """Validate the spec's ``NAME:`` section as ``model``; a ConfigError names the field (``NAME.field``), exit 2.
    ``required``: the model has fields with no default (an absent section is then an error naming them)."""
    from gtrain.spec import translate_validation_error

    wrapper = _section_model(name, model, required)
    try:
        got = wrapper.model_validate({name: section or {}})
    except ValidationError as e:
        raise translate_validation_error(e, wrapper) from None
    return cast(T, got.section)  # type: ignore[attr-defined]


def image_ref(v: str) -> str:
    """A container image a provider's section names (``runpod.image``, ``vast.image``): registry/name:tag or
    @digest, no control characters."""
    if has_control(v) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", v):
        raise ValueError("is not a container image reference (registry/name:tag or @digest)")
    return v
