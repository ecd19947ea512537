"""The spec's ``volumes:`` list (docs/volumes.md): storage that outlives the cluster, made once by ``up`` (or
``gtrain volume create``), attached and mounted on the nodes, left by ``down``, deleted only by ``gtrain volume
delete``. Models and the checks that need the whole spec only; what a provider does with a volume is its own
(``gtrain/providers/aws/volumes.py``: EBS; local, ssh, slurm: a host folder)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from gtrain.errors import ConfigError
from gtrain.registry import VOLUME_TYPES  # which providers keep volumes, of which types (data, no provider code)
from gtrain.spec.data import has_control, system_dir

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$|^[a-z]$")


#: folders a volume may not be mounted on or over: the system's, and the ones that hold gtrain's own node
#: folders (``~/gtrain/<cluster>`` on ssh and cloud nodes, so every home folder; ``$GTRAIN_HOME`` locally, which
#: the local provider checks itself)
HOME_DIRS = ("/home", "/Users", "/root")
RESERVED_DIRS = ("/tmp", "/var", "/opt", "/mnt", "/media", "/srv")  # the folder itself; inside it is fine


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("is a boolean, not a number")
    return v


def _mount_problem(v: str) -> str | None:
    if not v.startswith("/"):
        return "must be an absolute path on the node (e.g. /data)"
    if has_control(v):
        return "holds a control character"
    parts = v.split("/")
    if ".." in parts or "." in parts:
        return "may not hold '.' or '..' (write the folder as it is, e.g. /data/cache)"
    norm = posixpath.normpath(v)
    if norm in RESERVED_DIRS:
        return f"{norm} is a folder of the system; mount the volume in a folder of its own (e.g. {norm}/data)"
    if (d := system_dir(norm)) is not None:
        return f"is {'inside ' if d != norm else ''}the system's {d}; mount the volume on a folder of its own (/data)"
    for home in HOME_DIRS:
        if norm == home or posixpath.dirname(norm) == home:
            return (f"would cover {norm}, which holds gtrain's node folders (~/gtrain/CLUSTER); mount it on a "
                    "folder of its own (/data) or inside the home folder (~ is not expanded: /home/ubuntu/data)")
    if "gtrain" in parts:
        return "is a folder gtrain keeps its own files in (~/gtrain/...); pick a folder of its own (/data)"
    return None


class Volume(BaseModel):
    """One entry of ``volumes:``."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_assignment=True)

    name: str = Field(..., description="the volume's name, found by it next time (aws: tag `gtrain-volume=NAME`): "
                      "1-40 of `a-z`, `0-9`, `-`, starting with a letter")
    size_gb: Annotated[int | None, BeforeValidator(_not_bool)] = Field(
        None, ge=1, le=65536, description="size in GB (aws, gcp, azure: required; an existing volume is never "
        "shrunk: a smaller size is refused; gcp and azure grow it to a larger one); `type: path` ignores it")
    mount: str = Field(..., description="absolute folder on the node; not a system folder, a home folder or "
                       "gtrain's own (`~/gtrain/...`)")
    type: str | None = Field(None, description="the provider's kind: aws `gp3` (default), `gp2`, `io1`, `io2`, "
                             "`st1`, `sc1`; local, ssh, slurm: `path` (default: a folder that must exist on each "
                             "node); kubernetes: `pvc` (a PersistentVolumeClaim); lambda: `filesystem` (a persistent "
                             "file system); gcp: `pd-balanced` (default), `pd-ssd`, `pd-standard`; azure: "
                             "`Premium_LRS` (default), `StandardSSD_LRS`, `Standard_LRS`")
    path: str | None = Field(None, description="`type: path`: the host folder (default: `mount` itself); `mount` "
                             "becomes a link to it on each node")
    read_only: bool = Field(False, description="mount read-only (aws: `mount -o ro`)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be 1-40 characters of a-z, 0-9 and '-', start with a letter and not end with "
                             "'-' (e.g. datasets)")
        return v

    @field_validator("mount")
    @classmethod
    def _mount(cls, v: str) -> str:
        if why := _mount_problem(v):
            raise ValueError(why)
        return posixpath.normpath(v)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/") or has_control(v) or ".." in v.split("/"):
            raise ValueError("must be an absolute folder on the node, without '..' (e.g. /scratch/datasets)")
        return posixpath.normpath(v)

    @property
    def host_path(self) -> str:
        """``type: path``: the folder that holds the data (``path``, else ``mount``)."""
        return self.path or self.mount

    @property
    def env_name(self) -> str:
        return "GTRAIN_VOLUME_" + self.name.upper().replace("-", "_")


def _refuse(field: str, message: str, hint: str) -> ConfigError:
    return ConfigError(f"invalid spec: {field}: {message}", hint=hint, field=field)


def check_list(v: list[Volume] | None) -> list[Volume] | None:
    """Names and mounts are unique, and no mount lies inside another."""
    seen_name: dict[str, int] = {}
    seen_mount: dict[str, int] = {}
    for i, vol in enumerate(v or []):
        if vol.name in seen_name:
            raise _refuse(f"volumes[{i}].name", f"{vol.name!r} is also volumes[{seen_name[vol.name]}]'s name",
                          "give each volume a name of its own")
        if vol.mount in seen_mount:
            raise _refuse(f"volumes[{i}].mount", f"{vol.mount} is also volumes[{seen_mount[vol.mount]}]'s mount",
                          "give each volume a folder of its own")
        for m, j in seen_mount.items():
            inner, outer = (vol.mount, m) if vol.mount.startswith(m + "/") else (m, vol.mount)
            if inner.startswith(outer + "/"):
                raise _refuse(f"volumes[{i}].mount", f"{inner} lies inside {outer} (volumes[{j}] and [{i}])",
                              "give each volume a folder of its own, neither inside the other")
        seen_name[vol.name], seen_mount[vol.mount] = i, i
    return v


def check(spec: ClusterSpec) -> None:
    """The checks that need the provider: it keeps volumes, and has the type (one line naming the field)."""
    if not spec.volumes:
        return
    if spec.resources.any_of:
        raise _refuse("volumes", "volumes with resources.any_of: a volume lives with one provider and region",
                      "pick the placement (drop resources.any_of), or drop volumes")
    types = VOLUME_TYPES.get(spec.provider)
    if types is None:
        have = ", ".join(sorted(VOLUME_TYPES))
        raise _refuse("volumes", f"provider {spec.provider!r} keeps no volumes in gtrain yet (built: {have})",
                      "drop volumes, or use the provider's own storage; see docs/volumes.md")
    for i, vol in enumerate(spec.volumes):
        if vol.type is not None and vol.type not in types:
            raise _refuse(f"volumes[{i}].type", f"{vol.type!r} is not a volume type of {spec.provider}",
                          f"one of {', '.join(types)} (default {types[0]})")
        if vol.path is not None and (vol.type or types[0]) != "path":
            raise _refuse(f"volumes[{i}].path", "only a `type: path` volume has a host path", "drop path")
        if vol.read_only and (vol.type or types[0]) == "path":
            raise _refuse(f"volumes[{i}].read_only", "a `type: path` volume is a host folder gtrain links, not "
                          "mounts: it cannot make it read-only", "drop read_only (set the folder's permissions)")


def type_of(spec: ClusterSpec, vol: Volume) -> str:
    """The volume's type, the provider's default when the spec gives none."""
    return vol.type or VOLUME_TYPES.get(spec.provider, ("",))[0]


@dataclass
class VolumeInfo:
    """A volume as the provider found it (``gtrain volume ls``, the cost report's standing charges)."""

    name: str
    provider: str
    type: str
    size_gb: int | None
    region: str | None = None
    zone: str | None = None
    id: str | None = None
    state: str | None = None  # available | in-use | creating | ...
    #: the cluster (name) whose node holds it, when attached
    attached_to: str | None = None
    usd_per_gb_month: float = 0.0
    created: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def usd_per_month(self) -> float:
        return round((self.size_gb or 0) * self.usd_per_gb_month, 4)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usd_per_month": self.usd_per_month}


# ---------------------------------------------------------------------------------------------- type: path
# A host folder on every node (local, ssh, slurm). The providers run these scripts on each node (local: here, ssh:
# over its runner, slurm: on the login side, whose filesystem the nodes share): first the check on every node
# (nothing is made when one fails), then the links.


def path_volumes(spec: ClusterSpec) -> list[tuple[int, Volume]]:
    return [(i, v) for i, v in enumerate(spec.volumes or []) if type_of(spec, v) == "path"]


def path_notes(spec: ClusterSpec) -> list[str]:
    """The plan's word on the host-folder volumes."""
    vols = path_volumes(spec)
    if not vols:
        return []
    return ["volumes (host folders, checked on every node at up): " + ", ".join(
        f"{v.name} at {v.mount}" + (f" (a link to {v.path})" if v.path and v.path != v.mount else "")
        for _, v in vols)]


def path_script(spec: ClusterSpec, *, link: bool) -> str:
    """bash: ``check`` prints ``MISSING i`` for a host folder that is not there and ``TAKEN i`` for a ``mount``
    that is something else than a link to it; ``link`` makes each missing ``mount`` a link to its folder."""
    import shlex

    out = ["rc=0"]
    for i, v in path_volumes(spec):
        src, mnt = shlex.quote(v.host_path), shlex.quote(v.mount)
        out.append(f'[ -d {src} ] || {{ echo "MISSING {i}"; rc=3; }}')
        if v.mount != v.host_path:
            ok = f'[ -L {mnt} ] && [ "$(readlink {mnt})" = {src} ]'
            if link:
                out.append(f"{ok} || {{ mkdir -p \"$(dirname {mnt})\" && ln -s {src} {mnt}; }} || rc=3")
            else:
                out.append(f'{ok} || {{ [ ! -e {mnt} ] && [ ! -L {mnt} ]; }} || {{ echo "TAKEN {i}"; rc=3; }}')
    return "\n".join([*out, "exit $rc"]) + "\n"


def path_refusal(spec: ClusterSpec, node: str, stdout: str) -> ConfigError | None:
    """The check's first complaint on ``node`` as one line naming the field, the value and the fix."""
    vols = spec.volumes or []
    for line in stdout.splitlines():
        what, _, idx = line.partition(" ")
        if what not in ("MISSING", "TAKEN") or not idx.isdigit() or int(idx) >= len(vols):
            continue
        i, v = int(idx), vols[int(idx)]
        if what == "MISSING":
            fld = f"volumes[{i}].path" if v.path else f"volumes[{i}].mount"
            return ConfigError(f"invalid spec: {fld}: {v.host_path} does not exist on {node} (a `type: path` "
                               "volume is a folder that must be there)",
                               hint=f"make it there (mkdir -p {v.host_path}) or fix the path; nothing was created",
                               field=fld)
        return ConfigError(f"invalid spec: volumes[{i}].mount: {v.mount} exists on {node} and is not a link to "
                           f"{v.host_path}", hint="pick another mount, or remove what is there",
                           field=f"volumes[{i}].mount")
    return None


def root_refusal(spec: ClusterSpec, root: str, node: str) -> ConfigError | None:
    """A volume whose ``mount`` is gtrain's folder ``root`` on ``node``, lies inside it or holds it."""
    root = posixpath.normpath(root)
    for i, v in enumerate(spec.volumes or []):
        for p in {v.mount, v.host_path}:
            if p == root or root.startswith(p.rstrip("/") + "/") or p.startswith(root + "/"):
                fld = f"volumes[{i}].mount" if p == v.mount else f"volumes[{i}].path"
                return ConfigError(f"invalid spec: {fld}: {p} overlaps gtrain's own folder {root} on {node}",
                                   hint="use a folder apart from gtrain's (e.g. /data)", field=fld)
    return None
