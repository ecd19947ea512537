"""The capabilities every VM cloud shares: it rents by the hour (``up`` confirms the price), bills per second
with a one-minute minimum, its nodes end themselves at the spec's time/cost limit, and they are reached over
SSH with :func:`gtrain.remote.ssh.runner_from_node`, and a failed node can be replaced by a new machine
(:meth:`CloudProvider.replace_nodes`: delete that one instance, then the idempotent ``provision`` makes only the
missing rank). A cloud provider subclasses :class:`CloudProvider` once and composes its own parts (network,
instances, teardown), each given the client, :class:`Ledger` and reporter it uses."""

from __future__ import annotations

import dataclasses
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar

from gtrain.errors import ConfigError
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import Provider
from gtrain.providers.cloud.ledger import Ledger
from gtrain.providers.cloud.lifetime import ended_by_limit, node_lifetime_s

if TYPE_CHECKING:
    from gtrain.providers.base import StoppedNode
    from gtrain.providers.cloud.options import CloudOptions
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, StateStore
    from gtrain.state.nodes import NodeRecord


class CloudProvider(Provider):
    billing_minimum_s: ClassVar[float] = 60.0
    nodes_enforce_limits: ClassVar[bool] = True
    confirms_cost: ClassVar[bool] = True
    can_replace_nodes: ClassVar[bool] = True
    can_stop: ClassVar[bool] = True
    #: the nodes schedule their time limit at first boot only (EC2 user data): `gtrain start` re-arms it
    rearms_lifetime: ClassVar[bool] = False
    #: rank 0 runs a watcher that sends notify: events itself (gtrain.notify.nodewatch)
    node_watchers: ClassVar[bool] = True

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, max_workers: int = 32) -> None:
        super().__init__(store, report)
        self.ledger = Ledger(store)
        self.max_workers = max_workers

    def runners(self, cluster: Cluster) -> list[Runner]:
        from gtrain.remote.ssh import runner_from_node

        return [runner_from_node(n, cluster.name) for n in self.store.node_records(cluster.id)]

    def ended_at(self, cluster: Cluster) -> dict[int, float]:
        return ended_by_limit(self, cluster)

    @abstractmethod
    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        """Delete the one instance of ``node`` (by its recorded id) and wait until it is gone; mark it deleted
        in the ledger. Idempotent: an instance already gone is no error."""

    def replace_nodes(self, cluster: Cluster, ranks: list[int]) -> None:
        from gtrain.spec import parse_spec

        nodes = {n.rank: n for n in self.store.node_records(cluster.id)}
        unknown = sorted(set(ranks) - set(nodes))
        if unknown:
            raise ConfigError(f"replace: cluster {cluster.name} has no node {unknown[0]}",
                              hint=f"its nodes are 0..{cluster.num_nodes - 1}", field="ranks")
        spec = parse_spec(cluster.spec, base_dir=cluster.extra.get("base_dir"))
        plan = self.plan(spec)
        # the run's budget first: a spent one keeps the old node (a replacement could not run)
        node_lifetime_s(spec.policies, spec.num_nodes, cluster.price_per_hour or None, cluster)
        for rank in sorted(set(ranks)):
            node = nodes[rank]
            self.report.node(rank, f"replacing {node.instance_id} (terminating it)")
            self.terminate_node(cluster, node)
            with self.ledger.lock:  # billed up to now; the new machine gets its own interval below
                self.store.close_node_interval(cluster.id, rank, at=time.time())
            self.ledger.put_node(cluster.id, dataclasses.replace(node, status="terminated"))
        started = time.time()
        self.provision(spec, cluster, plan)  # idempotent: makes only the rank(s) now missing
        fresh = {n.rank: n for n in self.store.node_records(cluster.id)}
        with self.ledger.lock:
            for rank in sorted(set(ranks)):
                new = fresh[rank]
                self.store.open_interval(cluster.id, rank, instance_type=plan.instance_type, market=plan.market,
                                         price_per_hour=plan.price_per_hour,
                                         started_at=new.launched_at if new.launched_at is not None else started)
                self.report.node(rank, f"replaced: {nodes[rank].instance_id} -> {new.instance_id}")

    # ---- stop / start (``gtrain stop`` / ``gtrain start``): the cloud's part is in power_* below ----------

    def power_off(self, cluster: Cluster, nodes: list[NodeRecord]) -> None:
        """Stop these nodes' instances (disks kept) and wait until the cloud says they are stopped."""
        raise NotImplementedError

    def power_on(self, cluster: Cluster, nodes: list[NodeRecord]) -> dict[int, dict[str, str | None]]:
        """Start these stopped instances, wait until they run; rank -> the fresh ``private_ip``/``public_ip``."""
        raise NotImplementedError

    def disk_price(self, cluster: Cluster, node: NodeRecord) -> tuple[float, str]:
        """The node's boot disk: (USD per GB-month, its label)."""
        raise NotImplementedError

    def remount_volumes(self, cluster: Cluster, reachable: bool) -> None:
        """Mount the volumes (``cluster.extra["volumes"]``) on node 0 again after it started: a provider whose
        volumes attach to node 0 overrides it. Default: nothing to mount."""

    def stopped_since(self, cluster: Cluster, node: NodeRecord) -> float | None:
        """When the cloud says the (stopped) node stopped, as Unix time; None when it does not say."""
        return None

    def reach(self, cluster: Cluster, node: NodeRecord) -> NodeRecord:
        """The node record with its SSH target rebuilt from its (fresh) addresses."""
        raise NotImplementedError

    def cloud_options(self, spec: ClusterSpec) -> CloudOptions:
        """The spec's section of this cloud, validated."""
        raise NotImplementedError

    def wait_reachable(self, cluster: Cluster) -> None:
        """Wait until every node answers over SSH (the cloud's host keys pinned first)."""
        raise NotImplementedError

    def _picked(self, cluster: Cluster, ranks: list[int] | None) -> list[NodeRecord]:
        nodes = [n for n in self.store.node_records(cluster.id) if n.status not in ("terminated", "deleted")]
        return [n for n in nodes if ranks is None or n.rank in ranks]

    def stop_nodes(self, cluster: Cluster, ranks: list[int] | None = None) -> list[StoppedNode]:
        from gtrain.providers.base import StoppedNode

        if cluster.market == "spot":
            raise ConfigError(f"gtrain stop: cluster {cluster.name} runs on {self.name} spot capacity, which is not "
                              "stopped and kept for you (the cloud may take it back at any time)",
                              field="resources.use_spot",
                              hint=f"`gtrain down {cluster.name}` ends it; on-demand clusters can be stopped")
        nodes = self._picked(cluster, ranks)
        running = {s.rank: s.status for s in self.describe(cluster)}
        todo = [n for n in nodes if running.get(n.rank) != "stopped"]
        if todo:
            self.report.info(f"stopping {len(todo)} node(s) of {cluster.name}: "
                             + ", ".join(n.instance_id or "?" for n in todo))
            self.power_off(cluster, todo)
        out = []
        for n in nodes:
            self.ledger.put_node(cluster.id, dataclasses.replace(n, status="stopped"))
            rate, label = self.disk_price(cluster, n)
            out.append(StoppedNode(n.rank, float(n.extra.get("disk_gb") or 0), rate, label))
        return out

    def start_nodes(self, cluster: Cluster, ranks: list[int] | None = None) -> list[int]:
        from gtrain.providers.cloud.idle import idle_watch
        from gtrain.providers.cloud.lifetime import rearm, time_left_s
        from gtrain.providers.cloud.ssh_access import write_ssh_config
        from gtrain.spec import parse_spec

        nodes = self._picked(cluster, ranks)
        state = {s.rank: s.status for s in self.describe(cluster)}
        todo = [n for n in nodes if state.get(n.rank) == "stopped"]
        if not todo:
            return []
        # a node that schedules its end at first boot only (rearms_lifetime) gets what is left of its lifetime
        left = time_left_s(self, cluster, [n.rank for n in todo]) if self.rearms_lifetime else {}
        self.report.info(f"starting {len(todo)} node(s) of {cluster.name}: "
                         + ", ".join(n.instance_id or "?" for n in todo))
        for n in todo:  # a node that stopped on its own (the idle watch): since when, for the cost report
            n.extra["stopped_since"] = None if cluster.status == "stopped" else self.stopped_since(cluster, n)
        fresh = self.power_on(cluster, todo)
        for n in todo:
            n.extra.update(fresh.get(n.rank) or {})
            n.extra.pop("node_address", None)
            n.address = n.extra.get("private_ip") or n.address
            self.ledger.put_node(cluster.id, dataclasses.replace(self.reach(cluster, n), status="up"))
        write_ssh_config(self.ledger, self.report)
        spec = parse_spec(cluster.spec, base_dir=cluster.extra.get("base_dir"))
        opts = self.cloud_options(spec)
        if opts.wait_ssh:
            self.wait_reachable(cluster)
        # the idle watch ended with the machine: each started node gets its own again
        started = {n.rank for n in todo}
        if 0 in started and cluster.extra.get("volumes"):  # a volume stays attached; its mount went with the boot
            self.remount_volumes(self.store.get_cluster_by_id(cluster.id), reachable=opts.wait_ssh)
        pairs = [(n.rank, r) for n, r in zip(self.store.node_records(cluster.id), self.runners(cluster), strict=True)
                 if n.rank in started]
        idle_watch(spec, opts, [r for _, r in pairs], self.report, self.max_workers, cluster=cluster,
                   ranks=[k for k, _ in pairs], ends_in=left, limits=self.nodes_enforce_limits)
        if left and opts.wait_ssh:
            by_rank = {n.rank: r for n, r in zip(self.store.node_records(cluster.id), self.runners(cluster),
                                                 strict=True) if n.rank in started}
            rearm(by_rank, left, opts.idle_command, self.report)
        elif left:
            self.report.warn(f"{spec.provider}.wait_ssh is false: the started nodes' time limit "
                             "(policies.max_hours / max_cost_usd) is not re-armed")
        return sorted(started)

