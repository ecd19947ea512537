"""``gtrain volume ls / create / delete`` (docs/volumes.md), written against what a provider that keeps volumes of
its own offers (:class:`VolumeKeeper`: aws's EBS volumes, found by tag); ``up`` and ``down`` attach and leave them
inside the provider. A ``type: path`` volume (local, ssh, slurm) is a host folder: nothing here to list or make."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gtrain.errors import ConfigError

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import VolumeInfo


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
