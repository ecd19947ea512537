"""job.image on aws/gcp: the default machine images are the ones marked as shipping a container runtime and the
NVIDIA Container Toolkit (docs/providers/aws.md, gcp.md)."""

from __future__ import annotations

import fnmatch

from gtrain.providers.aws.network import CONTAINER_IMAGE_NAMES, DEFAULT_IMAGE_NAMES
from gtrain.providers.gcp.options import CONTAINER_IMAGE_FAMILIES, DEFAULT_IMAGE_FAMILY, GCPOptions


def test_aws_default_dlamis_for_job_image_are_the_container_ready_ones() -> None:
    assert CONTAINER_IMAGE_NAMES and set(CONTAINER_IMAGE_NAMES) <= set(DEFAULT_IMAGE_NAMES)
    for pattern in CONTAINER_IMAGE_NAMES:  # the OSS-driver DLAMIs (PyTorch, Base): docker + the toolkit
        assert "OSS Nvidia Driver" in pattern
    # today's AMI names match them, the generic fallback is not among them
    names = ["Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.5.1 (Ubuntu 22.04) 20250101",
             "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20250101"]
    assert all(any(fnmatch.fnmatchcase(n, p) for p in CONTAINER_IMAGE_NAMES) for n in names)
    assert "Deep Learning AMI*Ubuntu*" not in CONTAINER_IMAGE_NAMES


def test_gcp_default_family_is_container_ready() -> None:
    assert DEFAULT_IMAGE_FAMILY in CONTAINER_IMAGE_FAMILIES
    assert GCPOptions().image_family in CONTAINER_IMAGE_FAMILIES
    assert GCPOptions().image_project == "deeplearning-platform-release"
