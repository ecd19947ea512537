"""What the kubernetes helpers (:mod:`~gtrain.providers.kubernetes.adopt`, ``backend``, ``gc``, ``podexec``) are
handed by :class:`~gtrain.providers.kubernetes.provider.KubernetesProvider`: the state store, the reporter, each
cluster's lightkube client and the label sweep. Declared here so that they never import the provider module,
the top of this folder (it imports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.remote.base import Runner
    from gtrain.state import Cluster, StateStore


class KubeHost(Protocol):
    """The provider as its helpers see it (a :class:`gtrain.jobs.backend.NodeProvider` too)."""

    store: StateStore
    report: Reporter

    def runners(self, cluster: Cluster) -> list[Runner]: ...

    def client(self, cluster: Cluster) -> Any:
        """The cluster's lightkube client (one per cluster, made on first use)."""
        ...

    def remember_client(self, cluster: Cluster, c: Any) -> None:
        """Keep ``c`` as the cluster's client."""
        ...

    def delete_labelled(self, cluster: Cluster, selector: dict[str, str], grace_s: float = 10) -> None:
        """Delete the objects with these labels; wait until no pod is left."""
        ...
