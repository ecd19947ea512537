"""The ``runpod:`` section of a spec: :class:`RunPodOptions` and :func:`runpod_options`, which validates it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from gtrain.providers.cloud.options import CloudOptions, image_ref, section_options

__all__ = ["DEFAULT_IMAGE", "RunPodOptions", "runpod_options"]

#: RunPod's official PyTorch image (the example of the v2 reference's ``image``): it starts sshd with the
#: ``PUBLIC_KEY`` environment variable in authorized_keys, as every RunPod official image does
DEFAULT_IMAGE = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
#: a pod is a container: ``shutdown`` is not there; the pod stops itself with the runpodctl and pod-scoped key
#: RunPod puts in every pod (RUNPOD_POD_ID names it)
IDLE_COMMAND = ("sh", "-c", 'runpodctl stop pod "$RUNPOD_POD_ID"')


class RunPodOptions(CloudOptions):
    """The ``runpod:`` section (ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s, idle_command: CloudOptions)."""

    proxy_host: ClassVar[str] = "the pod's public IP"

    cloud: Literal["SECURE", "COMMUNITY"] = Field(
        "SECURE", description="RunPod's cloud tier: SECURE (RunPod's data centers) or COMMUNITY (hosts of others)")
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=512,
                       description="the pod's container image; it must start sshd from PUBLIC_KEY as RunPod's do")
    ssh_user: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description="the login in the pod's image")
    boot_timeout_s: float = Field(1200, gt=0, description="how long a pod may take to run with its SSH port public")
    idle_command: list[str] = Field(default_factory=lambda: list(IDLE_COMMAND), min_length=1,
                                    description="what a pod runs to stop itself once policies.idle_minutes is up")

    _image = field_validator("image")(image_ref)

    @field_validator("ssh_cidr")
    @classmethod
    def _runpod_cidr(cls, v: str) -> str:
        if v != "auto":
            raise ValueError("RunPod publishes a pod's ports to everyone (its API has no firewall rule), so "
                             "ssh_cidr cannot be set here: leave it out (only the cluster's key is let in)")
        return v


def runpod_options(section: dict[str, Any] | None) -> RunPodOptions:
    """Validate the spec's ``runpod:`` section; a ConfigError names the field (``runpod.cloud``)."""
    return section_options("runpod", RunPodOptions, section)
