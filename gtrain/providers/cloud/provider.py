"""The capabilities every VM cloud shares: it rents by the hour (``up`` confirms the price), bills per second
with a one-minute minimum, its nodes end themselves at the spec's time/cost limit, and they are reached over
SSH with :func:`gtrain.remote.ssh.runner_from_node`. A cloud provider subclasses :class:`CloudProvider` once
and composes its own parts (network, instances, teardown), each given the client, :class:`Ledger` and reporter
it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from gtrain.events import SILENT, Reporter
from gtrain.providers.base import Provider
from gtrain.providers.cloud.ledger import Ledger
from gtrain.providers.cloud.lifetime import ended_by_limit

if TYPE_CHECKING:
    from gtrain.remote.base import Runner
    from gtrain.state import Cluster, StateStore


class CloudProvider(Provider):
    billing_minimum_s: ClassVar[float] = 60.0
    nodes_enforce_limits: ClassVar[bool] = True
    confirms_cost: ClassVar[bool] = True

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, max_workers: int = 32) -> None:
        super().__init__(store, report)
        self.ledger = Ledger(store)
        self.max_workers = max_workers

    def runners(self, cluster: Cluster) -> list[Runner]:
        from gtrain.remote.ssh import runner_from_node

        return [runner_from_node(n, cluster.name) for n in self.store.node_records(cluster.id)]

    def ended_at(self, cluster: Cluster) -> dict[int, float]:
        return ended_by_limit(self, cluster)
