"""``gtrain volume ls / create / delete`` (docs/volumes.md), written against what a provider that keeps volumes of
its own offers (:class:`VolumeKeeper`: aws's EBS volumes, found by tag); ``up`` and ``down`` attach and leave them
inside the provider. A ``type: path`` volume (local, ssh, slurm) is a host folder: nothing here to list or make.
``gtrain gc`` lists (and with ``--delete`` deletes) the volumes no live cluster holds: :func:`sweep`, for every
provider that is a :class:`VolumeKeeper`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gtrain.errors import ConfigError, GtrainError

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import VolumeInfo
    from gtrain.state import Cluster


@runtime_checkable
class VolumeKeeper(Protocol):
    """What a provider whose volumes exist apart from its nodes gives ``gtrain volume``."""

    def volume_list(self, regions: list[str] | None, **options: str | None) -> list[VolumeInfo]: ...

    def volume_create(self, spec: ClusterSpec, name: str) -> VolumeInfo: ...

    def volume_delete(self, name: str, regions: list[str] | None, **options: str | None) -> VolumeInfo | None: ...


def keepers() -> list[str]:
    """The providers whose volumes ``gtrain volume`` lists (those that keep volumes of their own)."""
    from gtrain.providers import provider_class
    from gtrain.registry import VOLUME_TYPES

    out = []
    for name in sorted(VOLUME_TYPES):
        try:
            if hasattr(provider_class(name), "volume_list"):
                out.append(name)
        except ConfigError:
            continue
    return out


def keeper(ctx: Context, provider: str) -> VolumeKeeper:
    p = ctx.provider(provider)
    if not isinstance(p, VolumeKeeper):
        raise ConfigError(f"--provider {provider}: keeps no volumes of its own (a `type: path` volume is a folder on "
                          "the hosts: make it there)", hint=f"providers with volumes: {', '.join(keepers())}",
                          field="--provider")
    return p


def ls(ctx: Context, provider: str, regions: list[str] | None = None, **options: str | None) -> list[VolumeInfo]:
    return keeper(ctx, provider).volume_list(regions, **options)


def create(ctx: Context, spec: ClusterSpec, name: str) -> VolumeInfo:
    """The spec's volume ``name`` made now (found, when it is there already), where the spec's nodes would go."""
    names = [v.name for v in spec.volumes or []]
    if name not in names:
        raise ConfigError(f"NAME: the spec has no volume {name} (it has: {', '.join(names) or 'no volumes:'})",
                          hint="add it to the spec's volumes: list (docs/volumes.md)", field="NAME")
    return keeper(ctx, spec.provider).volume_create(spec, name)


def delete(ctx: Context, provider: str, name: str, regions: list[str] | None = None,
           **options: str | None) -> VolumeInfo | None:
    """Delete volume ``name`` (found by tag); refused while a node holds it. None: there was none."""
    return keeper(ctx, provider).volume_delete(name, regions, **options)


@dataclass
class VolumeSweep:
    """``gtrain gc``'s volumes: those gtrain tagged that no live cluster holds, with their standing charge."""

    orphans: list[VolumeInfo] = field(default_factory=list)
    deleted: list[VolumeInfo] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # "NAME: why" of each one a delete did not take

    @property
    def usd_per_month(self) -> float:
        return round(sum(v.usd_per_month for v in self.orphans), 4)

    def to_dict(self) -> dict[str, Any]:
        return {"orphans": [v.to_dict() for v in self.orphans], "usd_per_month": self.usd_per_month,
                "deleted": [v.name for v in self.deleted], "left": self.left}


def sweep(k: VolumeKeeper, live: list[Cluster], regions: list[str] | None, delete: bool,
          **options: str | None) -> VolumeSweep:
    """The volumes ``k`` finds by tag (so with no local state too) that no cluster of ``live`` holds: none
    attached to it or recorded by it (``extra["volumes"]``); deleted with ``delete`` (each refused one, still
    held by a node gtrain's state does not know, is left and said)."""
    names = {c.name for c in live}
    ids = {str(r.get("id")) for c in live for r in c.extra.get("volumes") or [] if isinstance(r, dict)}
    out = VolumeSweep()
    for v in k.volume_list(regions, **options):
        holders = {h.strip() for h in (v.attached_to or "").split(",") if h.strip()}
        if holders & names or str(v.id) in ids:
            continue
        out.orphans.append(v)
    if not delete:
        return out
    for v in out.orphans:
        try:
            gone = k.volume_delete(v.name, [v.region] if v.region else regions, **options)
        except GtrainError as e:
            out.left.append(f"{v.name}: {e.message}")
            continue
        if gone is not None:
            out.deleted.append(gone)
    return out
