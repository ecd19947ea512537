"""job.image, job.image_credentials and job.container: the shared spec fields every backend reads."""

from __future__ import annotations

import pytest

from gtrain.errors import ConfigError
from gtrain.spec import ClusterSpec
from gtrain.spec.containers import image_registry


def _spec(**job: object) -> ClusterSpec:
    return ClusterSpec.model_validate({"name": "c", "job": {"run": "train.py", **job}})


@pytest.mark.parametrize("ref", ["nvcr.io/nvidia/pytorch:25.01-py3", "python:3.11-slim", "localhost:5000/a/b",
                                 "ubuntu@sha256:" + "a" * 64, "Registry.Example.com:443/team/img:v1"])
def test_image_references_docker_takes_are_accepted(ref: str) -> None:
    assert _spec(image=ref).job.image == ref  # type: ignore[union-attr]


@pytest.mark.parametrize("ref", ["UPPER/case", "a b", "img:", "-rf", "img:tag:tag", "a//b", "x\x00y", "a" * 600])
def test_bad_image_references_are_refused(ref: str) -> None:
    with pytest.raises(Exception, match="image"):
        _spec(image=ref)


def test_registry_of_a_reference() -> None:
    assert image_registry("nvcr.io/nvidia/pytorch:25.01-py3") == "nvcr.io"
    assert image_registry("localhost:5000/x") == "localhost:5000"
    assert image_registry("pytorch/pytorch") == "docker.io"
    assert image_registry("python") == "docker.io"


def test_credentials_name_a_variable_and_need_an_image() -> None:
    s = _spec(image="x/y", image_credentials={"username": "$oauthtoken", "password_secret": "NGC_API_KEY"})
    assert s.job.image_credentials.password_secret == "NGC_API_KEY"  # type: ignore[union-attr]
    with pytest.raises(Exception, match="environment variable name"):
        _spec(image="x/y", image_credentials={"username": "u", "password_secret": "hunter2!"})
    with pytest.raises(Exception, match="need job.image"):
        _spec(container={"runtime": "docker"})


def test_load_names_the_field(tmp_path) -> None:
    from gtrain.spec import load_spec
    p = tmp_path / "s.yaml"
    p.write_text("name: c\njob: {run: train.py, image: 'Bad Image'}\n")
    with pytest.raises(ConfigError, match=r"job\.image"):
        load_spec(p)
