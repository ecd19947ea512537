"""The ``aws:`` section of a spec: :class:`AWSOptions` and :func:`aws_options`, which validates it."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from gtrain.providers.cloud.options import CloudOptions, section_options

__all__ = ["AWSOptions", "aws_options"]


class AWSOptions(CloudOptions):
    """The ``aws:`` section of a spec (ssh_cidr, ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s: CloudOptions)."""

    proxy_host: ClassVar[str] = "the instance id"
    proxy_example: ClassVar[str] = "aws ssm start-session --target %h --document-name AWS-StartSSHSession"

    profile: str | None = Field(None, description="boto3 profile; endpoint from AWS_ENDPOINT_URL as boto3 does")
    ssh_user: str = "ubuntu"
    host_key_wait_s: float = Field(120, ge=0, description="how long to wait for host keys in the console output")
    placement_group: bool | None = Field(None, description="cluster placement group; default: multi-node only")
    efa: bool | None = Field(None, description="EFA interface; default: where the catalog says the type has it")
    image_name: list[str] | None = Field(None, description="AMI name patterns (newest match of the first used)")
    image_owner: str = "amazon"
    instance_profile: str | None = Field(None, description="IAM instance profile name or ARN for the nodes")
    tags: dict[str, str] = Field(default_factory=dict)
    vpc_id: str | None = Field(None, pattern=r"^vpc-[0-9a-f]{8,17}$",
                               description="a VPC other than the region's default one (its subnets, one per zone)")
    subnet_ids: list[str] | None = Field(
        None, min_length=1, description="the subnets nodes may go in (one VPC; their zones tried in this order)")

    @field_validator("subnet_ids")
    @classmethod
    def _subnets(cls, v: list[str] | None) -> list[str] | None:
        for s in v or []:
            import re

            if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", s):
                raise ValueError(f"{s!r} is not a subnet id (subnet-0123456789abcdef0)")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k.startswith(("gtrain:", "aws:")) or k == "Name":
                raise ValueError(f"tag {k!r} is set by gtrain or AWS; pick another key")
        return v


def aws_options(section: dict[str, Any] | None) -> AWSOptions:
    """Validate the spec's ``aws:`` section; a ConfigError names the field (``aws.ssh_cidr``)."""
    return section_options("aws", AWSOptions, section)
