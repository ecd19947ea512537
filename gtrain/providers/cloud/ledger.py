"""The resource ledger and node records of a cloud provider behind one writer lock (the state store is one
sqlite connection: one writer at a time). Every part of a provider (network, instances, teardown) gets the
same :class:`Ledger` in its constructor."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gtrain.state import Cluster, StateStore
    from gtrain.state.nodes import NodeRecord


class Ledger:
    """``record`` a resource before making it, ``mark`` it after; ``put_node`` / ``nodes`` for the typed node
    records; ``lock`` for anything else written to the store from a worker thread."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.lock = threading.RLock()

    def record(self, cluster: Cluster, kind: str, ref: str, region: str, meta: dict[str, Any] | None = None) -> int:
        with self.lock:
            return self.store.record_resource(cluster.id, kind, ref, region=region, meta=meta)

    def mark(self, rid: int, status: str, **kw: Any) -> None:
        with self.lock:
            self.store.mark_resource(rid, status, **kw)

    def mark_live(self, cluster_id: str, status: str, *, kind: str | None = None, refs: set[str] | None = None,
                  region: str | None = None) -> None:
        """Mark the cluster's live resources (of ``kind``, with a ref in ``refs``, in ``region``) ``status``."""
        with self.lock:
            for res in self.store.resources(cluster_id, live_only=True):
                if (kind is None or res.kind == kind) and (refs is None or res.ref in refs) \
                        and (region is None or res.region == region):
                    self.store.mark_resource(res.id, status)

    def put_node(self, cluster_id: str, node: NodeRecord) -> None:
        with self.lock:
            self.store.put_node(cluster_id, node)

    def nodes(self, cluster_id: str) -> list[NodeRecord]:
        with self.lock:
            return self.store.node_records(cluster_id)

