"""Kubernetes as a provider (a namespace checked at `up`) and a job backend (one Indexed Job per launch)."""

from gtrain.providers.kubernetes.provider import KubernetesProvider

__all__ = ["KubernetesProvider"]
