"""Parts of the spec kept beside gtrain/spec/__init__.py: ``job.data`` entries, and the rules hostile input needs
(no NUL, no credentials in a URL, duplicates counted in linear time, a spec file that is a regular file,
field names that are text). Every refusal names its field; :mod:`gtrain.spec` re-exports what it uses."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gtrain.errors import ConfigError

MAX_PROBLEMS = 5  # problems named in one error line; the rest are counted
_CREDENTIALS_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]*@")


def no_credentials(field: str) -> BeforeValidator:
    """A bucket URL holding ``user:password@`` is refused without repeating it (the error names the field)."""

    def check(v: Any) -> Any:
        if isinstance(v, str) and _CREDENTIALS_RE.match(v):
            raise ConfigError(f"invalid spec: {field}: credentials in a URL are refused (the value is not shown)",
                              hint="the nodes use their own credentials (an instance role, the environment)",
                              field=field)
        return v

    return BeforeValidator(check)


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_QUERY_SECRET_RE = re.compile(r"[?&#;](?:[A-Za-z0-9_.-]*(?:token|password|passwd|pwd|secret|api[_-]?key|apikey|"
                              r"access[_-]?key|auth|sig|signature|credential)[A-Za-z0-9_.-]*)=", re.IGNORECASE)
#: folders of the system: a path gtrain writes under may not be one of them or inside one
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run",
               "/sbin", "/sys", "/usr", "/var/lib", "/var/run")


def has_control(v: str) -> bool:
    """A newline, NUL, escape or other control character (C0, DEL, C1)."""
    return bool(_CONTROL_RE.search(v))


def no_control(v: str | None) -> str | None:
    if v is not None and has_control(v):
        raise ValueError("holds a control character (newline, NUL, escape); write it on one line of plain text")
    return v


def url_credentials(v: str) -> bool:
    """``user:pass@`` in a URL's authority, or a token / password / key parameter in its query."""
    return bool(_CREDENTIALS_RE.match(v) or _QUERY_SECRET_RE.search(v))


def system_dir(path: str) -> str | None:
    """The system folder an absolute ``path`` is (``/``, ``/etc``) or lies in, else None."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    norm = "/" + "/".join(parts)
    if not parts:
        return "/"
    return next((d for d in SYSTEM_DIRS if norm == d or norm.startswith(d + "/")), None)


def no_nul(v: str | None) -> str | None:
    if v is not None and "\x00" in v:
        raise ValueError("holds a NUL byte")
    return v


def duplicates(names: list[str]) -> str | None:
    """The names given more than once (the first few and a count), in linear time; None when there are none."""
    if len(set(names)) == len(names):
        return None
    twice = sorted(k for k, n in Counter(names).items() if n > 1)
    return f"{twice[:MAX_PROBLEMS]}" + (f" and {len(twice) - MAX_PROBLEMS} more" if len(twice) > MAX_PROBLEMS else "")


def check_keys(data: dict[Any, Any], source: str) -> None:
    """Top-level keys are field names: text, not ``~`` or ``1``."""
    for k in data:
        if not isinstance(k, str):
            raise ConfigError(f"{source}: key {k!r} is not a field name", hint="start with `name: demo`", field="spec")


def check_spec_file(p: Path) -> None:
    """A spec path that exists but is no regular file (a FIFO would block the read; a device is no spec)."""
    if p.exists() and not p.is_file():
        kind = "a FIFO" if p.is_fifo() else "a device" if p.is_char_device() or p.is_block_device() else "not a file"
        raise ConfigError(f"spec file {str(p)!r} is {kind}, not a regular file", field="SPEC",
                          hint="pass the path to a YAML spec file (a pipe would be read while the command waits)")


class DataEntry(BaseModel):
    """A dataset the nodes download at launch, with their own credentials (an instance role on a cloud)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_assignment=True)

    src: Annotated[str, no_credentials("job.data.src")] = Field(
        ..., description="`s3://bucket[/prefix]`, `gs://bucket[/prefix]` or `az://container[/prefix]`")
    dst: str = Field(..., description="folder inside the workdir: relative, no `..`")
    delete: bool = Field(False, description="mirror: remove files under `dst` that `src` lacks")

    @field_validator("src")
    @classmethod
    def _src(cls, v: str) -> str:
        if not re.match(r"^(s3|gs|az)://[a-z0-9][a-z0-9._-]{1,221}(/.*)?$", v):
            raise ValueError("must be s3://bucket[/prefix], gs://bucket[/prefix] or az://container[/prefix]")
        if ".." in v.split("/")[3:]:
            raise ValueError("the prefix may not hold '..'")
        return v

    @field_validator("dst")
    @classmethod
    def _dst(cls, v: str) -> str:
        p = Path(v)
        if not v or p.is_absolute() or ".." in p.parts:
            raise ValueError("must be a folder inside the workdir, relative, without '..' (e.g. data)")
        return p.as_posix()

    @model_validator(mode="after")
    def _not_whole_workdir(self) -> DataEntry:
        if self.delete and self.dst == ".":
            raise ValueError("dst: '.' with delete: true would delete the whole workdir; name a folder (e.g. data)")
        return self
