"""The one object carried through a command: the state store, the reporter, and the providers (and their job
backends) made on first use. Core modules take a :class:`Context`; none of them makes its own store."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.errors import ClusterNotFound
from gtrain.events import SILENT, Reporter
from gtrain.sharedstate import open_store
from gtrain.state import Cluster, StateStore

if TYPE_CHECKING:
    from gtrain.jobs.backend import JobBackend
    from gtrain.providers.base import Provider
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state.nodes import NodeRecord


class GuardedReporter(Reporter):
    """What core code reports through: every secret value masked (:mod:`gtrain.redact`), and a closed output
    (``gtrain down | head -1``, a dead terminal) never stops a teardown halfway: errors writing it are dropped."""

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner

    def info(self, msg: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.inner.info(msg)

    def warn(self, msg: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.inner.warn(msg)

    def node(self, rank: int, msg: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.inner.node(rank, msg)

    def line(self, node: int, rank: int | None, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.inner.line(node, rank, text)


@dataclass
class Context:
    store: StateStore = field(default_factory=open_store)
    report: Reporter = SILENT
    _providers: dict[str, Provider] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.report, GuardedReporter):
            from gtrain.redact import RedactingReporter

            self.report = GuardedReporter(RedactingReporter(self.report))

    def provider(self, name: str) -> Provider:
        if name not in self._providers:
            from gtrain.providers import get_provider

            self._providers[name] = get_provider(name, self.store, self.report)
        return self._providers[name]

    def cluster(self, name: str) -> Cluster:
        c = self.store.find_cluster(name)
        if c is None or c.status == "terminated":
            raise ClusterNotFound(name, gone=c is not None)
        return c

    def backend(self, cluster: Cluster) -> JobBackend:
        """The job backend of ``cluster`` (node scripts over runners, or a scheduler's)."""
        return self.provider(cluster.provider).job_backend(cluster)

    def runners(self, cluster: Cluster) -> list[Runner]:
        return self.provider(cluster.provider).runners(cluster)

    def nodes(self, cluster: Cluster) -> list[NodeRecord]:
        return self.provider(cluster.provider).node_records(cluster)

    def spec_of(self, cluster: Cluster) -> ClusterSpec:
        from gtrain.spec import parse_spec

        return parse_spec(cluster.spec, base_dir=cluster.extra.get("base_dir"))

    def event(self, cluster: Cluster, kind: str, **fields: Any) -> None:
        """One record of the run's timeline (up, launch, recovery, preflight, down) in the run archive, for
        `gtrain report`; best effort: a full disk never stops a command."""
        from gtrain.state.runs import record_event

        with contextlib.suppress(OSError, ValueError):
            record_event(self.store.home, cluster.id, kind, **fields)
