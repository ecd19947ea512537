"""The provider names: what is built in, registered at run time, or installed through the ``gtrain.providers``
entry-point group. Data and names only -- no provider class is imported here (``gtrain.providers`` does that),
so the spec can check a name without reaching the providers' code."""

from __future__ import annotations

from functools import lru_cache

ENTRY_POINT_GROUP = "gtrain.providers"

#: the providers shipped with gtrain
REGISTRY: dict[str, str] = {
    "local": "gtrain.providers.local:LocalProvider",
    "aws": "gtrain.providers.aws:AWSProvider",
    "gcp": "gtrain.providers.gcp:GCPProvider",
    "ssh": "gtrain.providers.ssh:SSHProvider",
    "slurm": "gtrain.providers.slurm:SlurmProvider",
    "kubernetes": "gtrain.providers.kubernetes:KubernetesProvider",
    "lambda": "gtrain.providers.lambda_cloud:LambdaProvider",
    "azure": "gtrain.providers.azure:AzureProvider",
    "ray": "gtrain.providers.ray:RayProvider",
}

#: names a spec may give that no registered provider serves yet, with what to say
PLANNED: dict[str, str] = {}

_ADDED: dict[str, str] = {}


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _target(name: str) -> str | None:
    return _ADDED.get(name) or REGISTRY.get(name) or _entry_points().get(name)


def provider_names() -> list[str]:
    """Every provider a spec may name: built in, registered at run time, or from an entry point."""
    return sorted({*REGISTRY, *_ADDED, *_entry_points()})
