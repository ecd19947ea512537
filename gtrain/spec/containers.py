"""The spec models of ``job.image``, ``job.image_credentials`` and ``job.container``."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gtrain.errors import ConfigError

# The Docker distribution reference grammar (github.com/distribution/reference, regexp.go), anchored:
# [registry[:port]/]path[:tag][@digest]. Path components are lower case; the registry may hold upper case.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_RE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RUNTIMES = ("auto", "docker", "podman", "enroot", "apptainer")
# flags gtrain sets itself (or that would undo what it guarantees): refused in job.container.options
OWNED = {
    "--network": "host networking is set by gtrain", "--net": "host networking is set by gtrain",
    "--ipc": "host IPC is set by gtrain", "--gpus": "GPUs are passed by gtrain when the node has them",
    "--name": "gtrain names the container", "--rm": "gtrain removes the container",
    "-v": "use job.container.mounts", "--volume": "use job.container.mounts", "--mount": "use job.container.mounts",
    "-l": "gtrain labels the container", "--label": "gtrain labels the container",
    "-w": "gtrain sets the workdir", "--workdir": "gtrain sets the workdir",
    "-e": "use job.env (or job.secrets: never in argv)", "--env": "use job.env (or job.secrets: never in argv)",
    "--env-file": "use job.env / job.secrets", "-d": "gtrain runs the container attached",
    "--detach": "gtrain runs the container attached", "-i": "gtrain sets stdin", "--interactive": "gtrain sets stdin",
    "-t": "no terminal on nodes", "--tty": "no terminal on nodes", "--entrypoint": "gtrain sets the command",
    "--init": "gtrain runs an init process",
    "--pid": "gtrain shares the host's PID namespace (c10d names a node by host name and pid)",
    "--volumes-from": "another container's volumes break the job's isolation; use job.container.mounts",
    "--privileged": "every device and capability of the host; add only what the job needs with "
                    "--cap-add=NAME / --device=PATH",
}
#: docker's one-letter flags that take a value (the rest of `-vX` is its value); the others combine (`-itd`)
SHORT_WITH_VALUE = set("acehlmpuvw")


def option_flags(o: str) -> list[str]:
    """The flags one option holds: `--name=x` -> --name; `-itd` -> -i, -t, -d; `-v/:/h` -> -v; `-eA=1` -> -e."""
    if o.startswith("--"):
        return [o.split("=", 1)[0]]
    flags: list[str] = []
    for c in o[1:]:
        flags.append("-" + c)
        if c in SHORT_WITH_VALUE or c == "=":
            break
    return flags


def refuse_option(o: str) -> None:
    """A ConfigError (never repeating an attached value: `-eTOKEN=...`) for a flag gtrain owns, or no flag."""
    if not o.startswith("-") or o in ("-", "--"):
        raise ConfigError(f"job.container.options: {o[:40]!r} is not a flag", field="job.container.options",
                          hint="write each flag with its value, e.g. --cap-add=SYS_PTRACE")
    for flag in option_flags(o):
        if flag in OWNED:
            shown = repr(o[:60]) if o.startswith("--") or o == flag else repr(flag) + (
                "" if flag == "-e" else f" (in {o[:40]!r})")  # `-eTOKEN=...`: the value is not repeated
            raise ConfigError(f"job.container.options: {shown} is set by gtrain or breaks isolation "
                              f"({OWNED[flag]})", hint="remove it from job.container.options",
                              field="job.container.options")



def check_image(v: str | None) -> str | None:
    """``job.image``: a registry reference as ``docker pull`` takes it; at most 255 characters of path."""
    if v is None:
        return v
    m = IMAGE_RE.match(v) if len(v) <= 512 else None
    domain = m.group("domain") if m else None
    if domain and not _is_host(domain) and domain != domain.lower():
        m = None  # not a registry host, so a path component: lower case only (as docker parses it)
    if m is None:
        raise ValueError("is not an image reference; write [registry[:port]/]repository[:tag][@sha256:digest], "
                         "e.g. nvcr.io/nvidia/pytorch:25.01-py3")
    return v


def _is_host(domain: str) -> bool:
    return "." in domain or ":" in domain or domain == "localhost"


def image_registry(image: str) -> str:
    """The registry host a reference pulls from (``docker.io`` when the first component is not a host)."""
    m = IMAGE_RE.match(image)
    domain = m.group("domain") if m else None
    if domain and _is_host(domain):
        return domain
    return "docker.io"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_assignment=True)


class ImageCredentials(_Model):
    """Registry login for a private image; the password is a secret NAME, read from the local environment."""

    username: str = Field(..., min_length=1, max_length=256, description="registry user (NGC: `$oauthtoken`)")
    password_secret: str = Field(..., description="name of the local environment variable that holds the "
                                 "password or token; never written to state, scripts or argv")

    @field_validator("username")
    @classmethod
    def _user(cls, v: str) -> str:
        if any(c in v for c in "\x00\r\n"):
            raise ValueError("holds a control character")
        return v

    @field_validator("password_secret")
    @classmethod
    def _secret(cls, v: str) -> str:
        if not ENV_NAME_RE.match(v):
            raise ValueError(f"{v!r} is not an environment variable name (letters, digits, _); it names the "
                             "variable that holds the password, not the password itself")
        return v


class ContainerMount(_Model):
    host: str = Field(..., description="absolute path on the node")
    path: str = Field(..., description="absolute path inside the container")
    read_only: bool = Field(False, description="mount read-only")

    @field_validator("host", "path")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/") or any(c in v for c in "\x00\r\n,:") or ".." in PurePosixPath(v).parts:
            raise ValueError("must be an absolute path without '..', ',' or ':' (e.g. /fsx)")
        return v


class ContainerOptions(_Model):
    runtime: Literal["auto", "docker", "podman", "enroot", "apptainer"] = Field(
        "auto", description="container runtime on the nodes; `auto` = what the node has (docker, podman; on "
        "Slurm pyxis, enroot, apptainer)")
    mounts: list[ContainerMount] = Field(default_factory=list, description="extra host paths, "
                                         "`[{host: /fsx, path: /fsx}]`")
    options: list[str] = Field(default_factory=list, description="extra runtime flags; flags gtrain sets itself "
                               "(network, ipc, gpus, name, volumes of the job) are refused")

    @field_validator("options")
    @classmethod
    def _opts(cls, v: list[str]) -> list[str]:
        for o in v:
            if any(c in o for c in "\x00\r\n\x1b"):
                raise ValueError(f"{o!r} holds a control character")
            refuse_option(o)
        return v
