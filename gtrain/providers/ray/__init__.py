"""Ray as a provider (a team's running Ray cluster, checked at `up`) and a job backend (one Ray job per launch,
submitted over the Ray Jobs REST API)."""

from gtrain.providers.ray.provider import RayProvider

__all__ = ["RayProvider"]
