"""The ``lambda:`` section of a spec: :class:`LambdaOptions` and :func:`lambda_options`, which validates it."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import Field, field_validator

from gtrain.providers.cloud.options import CloudOptions, section_options

__all__ = ["LambdaOptions", "lambda_options"]


class LambdaOptions(CloudOptions):
    """The ``lambda:`` section (ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s, idle_command: CloudOptions)."""

    proxy_host: ClassVar[str] = "the instance's public IP"

    ssh_user: str = Field("ubuntu", pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
                          description="the login of Lambda's image (ubuntu)")
    file_system_names: list[str] = Field(default_factory=list, max_length=1,
                                         description="a Lambda file system to attach (it must be in the region)")
    boot_timeout_s: float = Field(1200, gt=0, description="how long an instance may take to become active")

    @field_validator("file_system_names")
    @classmethod
    def _fs_names(cls, v: list[str]) -> list[str]:
        for n in v:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,59}", n):
                raise ValueError(f"{n[:40]!r} is not a Lambda file system name (up to 60 of letters, digits, ' ', "
                                 "'.', '_', '-'; no newline, NUL or other control character)")
        return v

    @field_validator("ssh_cidr")
    @classmethod
    def _lambda_cidr(cls, v: str) -> str:
        if v != "auto":
            raise ValueError("Lambda Cloud's firewall rules are account-wide (cloud.lambda.ai/firewall); gtrain "
                             "does not change them, so ssh_cidr cannot be set here: leave it out")
        return v


def lambda_options(section: dict[str, Any] | None) -> LambdaOptions:
    """Validate the spec's ``lambda:`` section; a ConfigError names the field (``lambda.ssh_user``)."""
    return section_options("lambda", LambdaOptions, section)
