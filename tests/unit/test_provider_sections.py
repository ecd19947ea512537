"""Every cloud provider's section is validated the same way (gtrain.providers.cloud.options.section_options): a
bad field is one ConfigError naming `SECTION.field` (exit 2), and a misspelt one gets its closest field, the
`lambda:` section (a field named by its alias) included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gtrain.errors import ConfigError
from gtrain.providers.aws.options import aws_options
from gtrain.providers.azure.options import azure_options
from gtrain.providers.gcp.options import gcp_options
from gtrain.providers.lambda_cloud.options import lambda_options
from gtrain.providers.nebius.options import nebius_options
from gtrain.providers.runpod.options import runpod_options
from gtrain.providers.vast.options import vast_options

NEBIUS = {"project_id": "project-e00abc", "subnet_id": "vpcsubnet-e00abc"}
CASES: list[tuple[str, Callable[[dict[str, Any] | None], Any], dict[str, Any]]] = [
    ("aws", aws_options, {}), ("azure", azure_options, {}), ("gcp", gcp_options, {}),
    ("lambda", lambda_options, {}), ("nebius", nebius_options, NEBIUS), ("runpod", runpod_options, {}),
    ("vast", vast_options, {})]


@pytest.mark.parametrize(("name", "parse", "base"), CASES, ids=[c[0] for c in CASES])
def test_a_misspelt_field_names_the_section_and_the_field_it_meant(
        name: str, parse: Callable[[dict[str, Any] | None], Any], base: dict[str, Any]) -> None:
    assert parse(dict(base)) is not None
    with pytest.raises(ConfigError) as e:
        parse({**base, "wait_shh": True})
    assert e.value.exit_code == 2 and e.value.field == f"{name}.wait_shh"
    assert "did you mean 'wait_ssh'?" in str(e.value), str(e.value)
    with pytest.raises(ConfigError) as e:
        parse({**base, "poll_s": "soon"})
    assert e.value.field == f"{name}.poll_s" and "'soon'" in str(e.value)


def test_a_section_with_required_fields_names_each_missing_one() -> None:
    with pytest.raises(ConfigError) as e:
        nebius_options(None)
    assert "nebius.project_id: required field is missing" in str(e.value)


@pytest.mark.parametrize("parse", [runpod_options, vast_options])
def test_an_image_reference_is_checked_alike(parse: Callable[[dict[str, Any] | None], Any]) -> None:
    assert parse({"image": "nvcr.io/nvidia/pytorch:25.01-py3"}).image == "nvcr.io/nvidia/pytorch:25.01-py3"
    for bad in ("a b", "img\x1b[31m", "-x"):
        with pytest.raises(ConfigError, match="is not a container image reference"):
            parse({"image": bad})
