"""Where a gcp cluster can go: the catalog offer of the spec's GPU, the regions that have it, and the zones of a
region tried in order (``resources.zones`` as given; else those the API says offer the machine type and, for N1,
the attached GPU; else the built-in :data:`REGION_ZONES`). A part of
:class:`gtrain.providers.gcp.provider.GCPProvider`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.errors import CredentialsError, ProviderError
from gtrain.providers.gcp import api
from gtrain.providers.gcp.api import gce

if TYPE_CHECKING:
    from gtrain.catalog import Offer
    from gtrain.events import Reporter
    from gtrain.spec import ClusterSpec

__all__ = ["REGION_ZONES", "GCPZones"]

#: the zones of each catalog region, in the order tried when resources.zones is not given
REGION_ZONES = {
    "us-central1": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"],
    "us-east1": ["us-east1-b", "us-east1-c", "us-east1-d"],
    "us-east4": ["us-east4-a", "us-east4-b", "us-east4-c"],
    "europe-west4": ["europe-west4-a", "europe-west4-b", "europe-west4-c"],
    "asia-east1": ["asia-east1-a", "asia-east1-b", "asia-east1-c"],
}


class GCPZones:
    """The offer, regions and zones of a spec."""

    def __init__(self, compute: api.Compute, report: Reporter) -> None:
        self.compute = compute
        self.report = report

    def offer(self, spec: ClusterSpec, region: str | None) -> Offer:
        from gtrain.catalog import resolve

        res = spec.resources
        return resolve("gcp", res.accelerators, res.instance_type, region, res.use_spot)

    def regions(self, spec: ClusterSpec, offer: Offer) -> list[str]:
        from gtrain.catalog import offers

        regions = spec.resources.region_list()
        if regions:
            return regions
        same = [o for o in offers("gcp", gpu=offer.gpu_name, gpu_count=offer.gpu_count, spot=spec.resources.use_spot)
                if o.instance_type == offer.instance_type and o.accelerator_type == offer.accelerator_type]
        out: list[str] = []
        for o in same:
            if o.region not in out:
                out.append(o.region)
        if spec.resources.zones:  # zones pinned without a region: their regions, not the cheapest elsewhere
            pinned = {api.region_of_zone(z) for z in spec.resources.zones}
            return [r for r in out if r in pinned] or out
        return out

    def regional_offer(self, offer: Offer, region: str) -> Offer | None:
        from gtrain.catalog import lookup

        return next((o for o in lookup("gcp", offer.instance_type, region)
                     if o.accelerator_type == offer.accelerator_type and o.gpu_count == offer.gpu_count), None)

    def zones(self, spec: ClusterSpec, region: str) -> list[str]:
        zones = spec.resources.zones
        if zones:
            return [z for z in zones if api.region_of_zone(z) == region]
        return REGION_ZONES.get(region, [f"{region}-{x}" for x in "abc"])

    def offered_zones(self, spec: ClusterSpec, project: str, region: str, offer: Offer) -> list[str]:
        """The zones of ``region`` that offer the machine type (and, for N1, the attached GPU), asked of the
        API (machineTypes / acceleratorTypes aggregatedList), like AWS's instance type offerings; the spec's
        own ``resources.zones`` as given; the built-in table where the lists cannot be read."""
        table = self.zones(spec, region)
        if spec.resources.zones or self.compute.clients.machine_types is None:
            return table

        def where(client: Any, kind: str, name: str) -> set[str]:
            found: set[str] = set()
            with gce(f"{kind}.aggregatedList {name}"):
                for scope, listed in client.aggregated_list(request={"project": project,
                                                                     "filter": f'name = "{name}"'}):
                    items = getattr(listed, "machine_types" if kind == "machineTypes" else "accelerator_types")
                    if any(i.name == name for i in items):
                        found.add(scope.rsplit("/", 1)[-1])
            return found

        try:
            zones = where(self.compute.clients.machine_types, "machineTypes", offer.instance_type)
            if _attached(offer) and offer.accelerator_type and self.compute.clients.accelerator_types is not None:
                zones &= where(self.compute.clients.accelerator_types, "acceleratorTypes", offer.accelerator_type)
        except (CredentialsError, ProviderError) as e:
            self.report.warn(f"{region}: cannot list the zones offering {offer.instance_type} ({e.message}); "
                             f"trying {', '.join(table)}")
            return table
        mine = [z for z in zones if api.region_of_zone(z) == region]
        order = {z: i for i, z in enumerate(table)}
        return sorted(mine, key=lambda z: (order.get(z, len(order)), z))


def _attached(offer: Offer) -> bool:
    """N1 machine types take their GPUs as guestAccelerators; accelerator-optimized ones (A2, A3, G2) have them."""
    return offer.instance_type.startswith("n1-") and bool(offer.accelerator_type)

