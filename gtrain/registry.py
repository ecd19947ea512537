"""The provider names: what is built in, registered at run time, or installed through the ``gtrain.providers``
entry-point group. Data and names only -- no provider class is imported here (``gtrain.providers`` does that),
so the spec can check a name without reaching the providers' code."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

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
    "runpod": "gtrain.providers.runpod:RunPodProvider",
    "vast": "gtrain.providers.vast:VastProvider",
    "nebius": "gtrain.providers.nebius:NebiusProvider",
}

#: the providers that keep volumes (a spec's ``volumes:``; docs/volumes.md) and their types, the default first: the
#: spec checks a type without reaching the providers' code; a provider not named here refuses ``volumes:``
VOLUME_TYPES: dict[str, tuple[str, ...]] = {
    "aws": ("gp3", "gp2", "io1", "io2", "st1", "sc1"),
    "gcp": ("pd-balanced", "pd-ssd", "pd-standard"),
    "azure": ("Premium_LRS", "StandardSSD_LRS", "Standard_LRS"),
    "local": ("path",),
    "ssh": ("path",),
    "slurm": ("path",),
    "kubernetes": ("pvc",),
    "lambda": ("filesystem",),
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


# ---------------------------------------------------------------------------------------------- accelerators
# A family of accelerators a spec names in ``resources.accelerators`` other than ``GPU:COUNT`` (a Cloud TPU
# slice, ``tpu-v5p-32``), served by one provider: the shape of each of its types is read through here, so the
# spec's checks, ``any_of`` and ``gtrain catalog`` name no provider's module.

#: family -> (the name's prefix, "module:function" returning every shape of the family, by name)
ACCELERATORS: dict[str, tuple[str, str]] = {
    "tpu": ("tpu-", "gtrain.providers.gcp.tpu.types:shapes"),
}


@dataclass(frozen=True)
class AcceleratorShape:
    """One type of an accelerator family: what a cluster of it is (nodes = its worker hosts) and costs."""

    name: str  # as a spec writes it: tpu-v5p-32
    family: str  # tpu
    provider: str  # the provider that makes it: gcp
    generation: str
    chips: int  # in the whole slice
    nodes: int  # worker hosts: the cluster's num_nodes
    zones: tuple[str, ...]
    price_chip_h: float  # on-demand $ per chip-hour
    price_spot_chip_h: float
    snapshot: str  # the date of the prices

    @property
    def chips_per_node(self) -> int:
        return self.chips // self.nodes

    def price_per_hour(self, spot: bool) -> float:
        """The whole slice's $/h: $ per chip-hour x chips."""
        return round((self.price_spot_chip_h if spot else self.price_chip_h) * self.chips, 4)

    def region_zones(self, region: str | None) -> list[str]:
        return [z for z in self.zones if region is None or z.rsplit("-", 1)[0] == region]


def accelerator_family(accelerators: str | None) -> str | None:
    """The family a ``resources.accelerators`` value names (``tpu``), or None for ``GPU:COUNT``."""
    v = (accelerators or "").strip().lower()
    return next((fam for fam, (prefix, _) in ACCELERATORS.items() if v.startswith(prefix)), None)


def accelerator_shapes(family: str) -> dict[str, AcceleratorShape]:
    """Every type of ``family`` by name (the provider's own catalog; data only, offline)."""
    from importlib import import_module

    mod, _, fn = ACCELERATORS[family][1].partition(":")
    shapes: dict[str, AcceleratorShape] = getattr(import_module(mod), fn)()
    return shapes


def accelerator_shape(accelerators: str) -> AcceleratorShape:
    """The type ``accelerators`` names; ValueError naming the known ones (or when it names no family)."""
    fam = accelerator_family(accelerators)
    if fam is None:
        raise ValueError(f"{accelerators!r} names no accelerator family ({', '.join(ACCELERATORS)})")
    shapes = accelerator_shapes(fam)
    got = shapes.get(accelerators.strip().lower())
    if got is None:
        def key(n: str) -> tuple[str, int]:
            head, _, size = n.rpartition("-")
            return (head, int(size) if size.isdigit() else 0)

        known = ", ".join(sorted(shapes, key=key))
        raise ValueError(f"{accelerators!r} is not a {fam.upper()} type gtrain knows (known: {known}; "
                         f"`gtrain catalog --{fam}` lists them)")
    return got


# ---------------------------------------------------------------------------------------------- price lists
#: ``gtrain catalog --refresh``: a catalog provider whose price list its own module reads ("module:function",
#: called as ``fn(base_url, day, timeout) -> (RefreshResult, csv text)``)
CATALOG_REFRESH: dict[str, str] = {
    "azure": "gtrain.providers.azure.prices:refresh_catalog",
}
#: price lists re-priced along with a catalog provider's, from the same service: catalog provider -> hooks
#: ("module:function", called as ``fn(skus_of, day) -> (RefreshResult, csv text)``, ``skus_of(service_id)``
#: listing that Cloud Billing service's SKUs); the Cloud TPU types ride on gcp's refresh
CATALOG_RIDERS: dict[str, tuple[str, ...]] = {
    "gcp": ("gtrain.providers.gcp.tpu.prices:refresh_catalog",),
}


def price_list(target: str) -> Any:
    """The function a ``CATALOG_REFRESH`` / ``CATALOG_RIDERS`` entry names (``target``: a provider or a
    "module:function")."""
    from importlib import import_module

    mod, _, fn = CATALOG_REFRESH.get(target, target).partition(":")
    return getattr(import_module(mod), fn)


# ------------------------------------------------------------------------------------ fixed allocations
#: providers whose scheduler owns the job's allocation, and why a running job there cannot grow, shrink or
#: replace one node alone (elastic num_nodes and torchft mode are refused on them: gtrain.spec.elastic)
FIXED_ALLOCATION: dict[str, str] = {
    "slurm": "a Slurm allocation has a fixed node count (sbatch --nodes)",
    "kubernetes": "the job is one Indexed Job of a fixed completions count",
    "ray": "Ray schedules the job's workers itself",
}


# ---------------------------------------------------------------------------------------------- checks
#: ``gtrain check``: each provider's own check, "module:function" called as ``fn(timeout) -> ProviderCheck``
#: (read-only: credentials and where from, one harmless authorised call, the GPU quota where the API tells it,
#: the SSH key); a plug-in without an entry here may give its Provider class a ``check`` of the same shape
CHECKS: dict[str, str] = {
    "local": "gtrain.providers.local:check",
    "ssh": "gtrain.providers.ssh:check",
    "aws": "gtrain.providers.aws.check:check",
    "gcp": "gtrain.providers.gcp.check:check",
    "azure": "gtrain.providers.azure.check:check",
    "lambda": "gtrain.providers.lambda_cloud.check:check",
    "slurm": "gtrain.providers.slurm.check:check",
    "kubernetes": "gtrain.providers.kubernetes.check:check",
    "ray": "gtrain.providers.ray.check:check",
    "runpod": "gtrain.providers.runpod.check:check",
    "vast": "gtrain.providers.vast.check:check",
    "nebius": "gtrain.providers.nebius.check:check",
}


def check_function(name: str) -> Any:
    """The check ``CHECKS`` names for a provider (its module imported now), or None."""
    from importlib import import_module

    target = CHECKS.get(name)
    if target is None:
        return None
    mod, _, fn = target.partition(":")
    return getattr(import_module(mod), fn)
