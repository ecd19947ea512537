"""Finding and deleting what a gcp cluster owns: instances by label (all zones, one aggregatedList), firewall
rules by name. A part of :class:`gtrain.providers.gcp.provider.GCPProvider`; used by ``down`` and ``gtrain gc``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gtrain.errors import ProviderError
from gtrain.providers.gcp import api
from gtrain.providers.gcp.api import LABEL_CLUSTER, gce

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.state import Cluster


class GCPTeardown:
    """Finding and deleting a cluster's instances and firewall rules."""

    def __init__(self, compute: api.Compute, ledger: Ledger, report: Reporter, max_workers: int) -> None:
        self.compute = compute
        self.ledger = ledger
        self.store = ledger.store
        self.report = report
        self.max_workers = max_workers

    def find_instances(self, project: str, cluster_id: str | None) -> list[Any]:
        """Every instance labelled with the cluster (any gtrain cluster when ``cluster_id`` is None), all zones."""
        from google.cloud import compute_v1

        flt = f'labels.{LABEL_CLUSTER} = "{cluster_id}"' if cluster_id else f"labels.{LABEL_CLUSTER}:*"
        out: list[Any] = []
        with gce("instances.aggregatedList"):
            for _, scoped in self.compute.clients.instances.aggregated_list(
                    request=compute_v1.AggregatedListInstancesRequest(project=project, filter=flt)):
                out.extend(i for i in scoped.instances if LABEL_CLUSTER in i.labels
                           and (cluster_id is None or i.labels[LABEL_CLUSTER] == cluster_id))
        return out

    def teardown(self, project: str, cluster_id: str, *, cluster: Cluster | None = None,
                 known: list[tuple[str, str]] | None = None) -> list[str]:
        """Delete every instance labelled with the cluster (plus ``known`` (zone, name)), wait, delete its firewall
        rules; returns what still exists afterwards (empty when clean). Used by ``down`` and ``gtrain gc``."""
        targets = {(api.zone_of(i.zone), i.name) for i in self.find_instances(project, cluster_id)}
        targets |= {t for t in known or [] if t[0] and t[1]}
        if targets:
            self.report.info(f"deleting {len(targets)} instance(s)")
            self.delete_instances(project, sorted(targets), cluster)
        self.delete_firewalls(project, cluster_id, cluster)
        if cluster is not None:
            with self.ledger.lock:
                for res in self.store.resources(cluster.id, live_only=True):
                    self.store.mark_resource(res.id, "deleted")
        return [f"{kind} {ref}" for kind, ref in self.list_owned(project, cluster_id)]

    def delete_instances(self, project: str, targets: list[tuple[str, str]], cluster: Cluster | None) -> None:
        if not targets:
            return

        def one(t: tuple[str, str]) -> None:
            zone, name = t
            try:
                with gce(f"instances.delete {name}"):
                    op = self.compute.clients.instances.delete(project=project, zone=zone, instance=name)
                api.wait_zone_op(self.compute.clients, project, zone, op.name, f"instances.delete {name}")
            except ProviderError as e:
                if not api.is_not_found(e):
                    raise

        with ThreadPoolExecutor(min(self.max_workers, len(targets))) as pool:
            for f in [pool.submit(one, t) for t in targets]:
                f.result()
        if cluster is not None:
            refs = {f"{z}/{n}" for z, n in targets}
            with self.ledger.lock:
                for res in self.store.resources(cluster.id, live_only=True):
                    if res.kind == "instance" and res.ref in refs:
                        self.store.mark_resource(res.id, "deleted")

    def delete_firewalls(self, project: str, cluster_id: str, cluster: Cluster | None,
                          only: list[str] | None = None) -> None:
        for name in (only if only is not None else api.firewall_names(cluster_id)):
            try:
                with gce(f"firewalls.delete {name}"):
                    op = self.compute.clients.firewalls.delete(project=project, firewall=name)
                api.wait_global_op(self.compute.clients, project, op.name, f"firewalls.delete {name}")
            except ProviderError as e:
                if not api.is_not_found(e):
                    raise
            if cluster is not None:
                with self.ledger.lock:
                    for res in self.store.resources(cluster.id, live_only=True):
                        if res.kind == "firewall" and res.ref == name:
                            self.store.mark_resource(res.id, "deleted")

    def list_owned(self, project: str, cluster_id: str | None) -> list[tuple[str, str]]:
        """(kind, "zone/name" or name) of every live instance and firewall rule of the cluster (or of any gtrain
        cluster when ``cluster_id`` is None; then kind is ``kind:<cluster id>``)."""
        out: list[tuple[str, str]] = []
        for i in self.find_instances(project, cluster_id):
            kind = "instance" if cluster_id else f"instance:{i.labels.get(LABEL_CLUSTER, '?')}"
            out.append((kind, f"{api.zone_of(i.zone)}/{i.name}"))
        with gce("firewalls.list"):
            fws = list(self.compute.clients.firewalls.list(project=project))
        for fw in fws:
            cid = api.cluster_of_firewall(fw.name)
            if cid is None or not fw.description.startswith("gtrain cluster"):
                continue
            if cluster_id is None:
                out.append((f"firewall:{cid}", fw.name))
            elif cid == cluster_id:
                out.append(("firewall", fw.name))
        return out
