"""The ``vast:`` section of a spec: :class:`VastOptions` and :func:`vast_options`, which validates it."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from gtrain.providers.cloud.options import CloudOptions, image_ref, section_options

__all__ = ["DEFAULT_IMAGE", "IDLE_COMMAND", "VastOptions", "vast_options"]

#: the API reference's default image (create instance: ``image``); ``runtype: ssh_direct`` puts Vast's sshd in
#: front of any image, with the keys attached to the instance in authorized_keys
DEFAULT_IMAGE = "vastai/base-image:@vastai-automatic-tag"
#: an instance is a container: no ``shutdown``. Vast puts an instance-scoped key and the instance's id in every
#: container (CONTAINER_API_KEY, CONTAINER_ID); the header is read from stdin so the key is in no argv
IDLE_COMMAND = ("sh", "-c", "printf 'Authorization: Bearer %s\\n' \"$CONTAINER_API_KEY\" | curl -fsS -H @- "
                "-H 'Content-Type: application/json' -X PUT -d '{\"state\": \"stopped\"}' "
                "\"https://console.vast.ai/api/v0/instances/$CONTAINER_ID/\"")


class VastOptions(CloudOptions):
    """The ``vast:`` section (ssh_proxy_command, wait_ssh, ssh_timeout_s, poll_s, idle_command: CloudOptions)."""

    proxy_host: ClassVar[str] = "the instance's public IP"

    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=512,
                       description="the instance's container image (Vast's ssh launch mode adds sshd to it)")
    ssh_user: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description="the login in the instance")
    min_reliability: float = Field(0.95, ge=0, le=1, allow_inf_nan=False,
                                   description="skip offers whose host reliability score is lower (0..1)")
    max_usd_per_hour: float | None = Field(None, gt=0, le=10000, allow_inf_nan=False,
                                           description="the most one node may bill, $/h: offers priced above "
                                                       "it (dph_total, storage included; a bid's price) are skipped")
    bid_usd_per_hour: float | None = Field(None, gt=0, le=10000, allow_inf_nan=False,
                                           description="with resources.use_spot: the interruptible bid, $/h per "
                                                       "machine (default: each offer's min_bid)")
    min_inet_down_mbps: float | None = Field(None, gt=0, allow_inf_nan=False,
                                             description="skip offers with a slower download bandwidth (Mb/s)")
    verified: bool = Field(True, description="only hosts Vast has verified")
    max_offers: int = Field(5, ge=1, le=50, description="offers tried, cheapest first, before `up` gives up")
    boot_timeout_s: float = Field(1200, gt=0, description="how long an instance may take to run with its SSH port")
    idle_command: list[str] = Field(default_factory=lambda: list(IDLE_COMMAND), min_length=1,
                                    description="what an instance runs to stop itself once policies.idle_minutes "
                                                "is up")

    _image = field_validator("image")(image_ref)

    @field_validator("ssh_cidr")
    @classmethod
    def _vast_cidr(cls, v: str) -> str:
        if v != "auto":
            raise ValueError("Vast.ai publishes an instance's SSH port to everyone (its API has no firewall "
                             "rule), so ssh_cidr cannot be set here: leave it out (only the cluster's key is let in)")
        return v


def vast_options(section: dict[str, Any] | None) -> VastOptions:
    """Validate the spec's ``vast:`` section; a ConfigError names the field (``vast.min_reliability``)."""
    return section_options("vast", VastOptions, section)
