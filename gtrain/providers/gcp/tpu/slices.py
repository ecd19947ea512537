"""Cloud TPU slices for the gcp provider: one TPU VM node (or one queued resource holding it) per cluster, named
like the cluster id and labelled ``gtrain-cluster``; each of its worker hosts is a gtrain node (rank = worker
id), reached over SSH with the cluster's key (``ssh-keys`` metadata, as on GCE VMs).

:class:`TPUSlices` is the part :class:`~gtrain.providers.gcp.GCPProvider` hands a spec to when
``resources.accelerators`` names a TPU (``tpu-v5p-32``): plan, provision (zone after zone on no capacity),
describe (the node's ``state`` and ``health``; PREEMPTED is every rank preempted), terminate, recreate (a
preempted slice is made again as a whole), price and gc. The wire calls are in :mod:`.api`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import CapacityError, ConfigError, GtrainError, ProviderError, QuotaError
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Orphan, Plan
from gtrain.providers.cloud.billing import cloud_interval_cost
from gtrain.providers.cloud.failover import Attempts
from gtrain.providers.cloud.keys import drop_key, ensure_key, key_path, owner
from gtrain.providers.cloud.lifetime import lifetime_note, lifetime_s, node_lifetime_s
from gtrain.providers.cloud.ssh_access import wait_ssh, write_ssh_config
from gtrain.providers.gcp import api as gapi
from gtrain.providers.gcp.options import GCPOptions, gcp_options
from gtrain.providers.gcp.tpu.api import TPUApi
from gtrain.providers.gcp.tpu.types import RUNTIMES, TPUType, lookup, snapshot, topology_chips
from gtrain.state.nodes import NodeRecord

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval, StateStore

__all__ = ["TPUSlices", "check"]

#: Node.state values (REST reference, projects.locations.nodes#State) and what gtrain calls them
STATES = {"READY": "running", "CREATING": "pending", "STARTING": "pending", "RESTARTING": "pending",
          "REIMAGING": "pending", "REPAIRING": "pending", "STOPPING": "stopped", "STOPPED": "stopped",
          "DELETING": "terminated", "TERMINATED": "terminated", "PREEMPTED": "preempted"}
QR_DONE, QR_FAILED = "ACTIVE", ("FAILED", "SUSPENDED", "SUSPENDING")


def check(spec: ClusterSpec, opts: GCPOptions) -> tuple[TPUType, str, list[str]]:
    """The type, the runtime version and the zones to try, or a ConfigError naming the field."""
    t = lookup(spec.resources.accelerators or "")
    rt = t.runtime_version if opts.runtime_version == "auto" else opts.runtime_version
    if rt not in RUNTIMES[t.generation]:
        raise ConfigError(f"gcp.runtime_version: {rt!r} is not a TPU software version for {t.generation} "
                          f"({spec.resources.accelerators})", field="gcp.runtime_version",
                          hint=f"use auto ({t.runtime_version}) or one of {', '.join(RUNTIMES[t.generation])}")
    if opts.topology is not None:
        try:
            chips = topology_chips(opts.topology)
        except ValueError as e:
            raise ConfigError(f"gcp.topology: {e}", field="gcp.topology", hint="drop it for the type's") from None
        if chips != t.chips:
            raise ConfigError(f"gcp.topology: {opts.topology} is {chips} chips; {t.name} has {t.chips}",
                              field="gcp.topology", hint="drop gcp.topology, or pick the type of that size")
    regions = spec.resources.region_list()
    zones = [z for z in t.zones if not regions or z.rsplit("-", 1)[0] in regions]
    if spec.resources.zones:
        for i, z in enumerate(spec.resources.zones):
            if z not in t.zones:
                raise ConfigError(f"resources.zones[{i}]: {t.name} is not offered in {z!r}",
                                  field=f"resources.zones[{i}]", hint=f"its zones: {', '.join(t.zones)}")
        zones = list(spec.resources.zones)
    if not zones:
        raise ConfigError(f"resources.region: {t.name} is not offered in {', '.join(regions)}",
                          field="resources.region", hint=f"its zones: {', '.join(t.zones)}")
    return t, rt, zones


class TPUSlices:
    def __init__(self, store: StateStore, ledger: Ledger, report: Reporter, api: TPUApi | None = None) -> None:
        self.store, self.ledger, self.report = store, ledger, report
        self._api = api

    @property
    def api(self) -> TPUApi:
        if self._api is None:
            self._api = TPUApi()
        return self._api

    # ---- plan ----

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = gcp_options(spec.gcp)
        t, rt, zones = check(spec, opts)
        spot = spec.resources.use_spot
        per_host = t.price_per_host_hour(spot)
        notes = [f"{t.name}: {t.hosts} worker host(s) x {t.chips_per_host} chip(s) = {t.chips} TPU {t.generation} "
                 f"chips; runtime {rt}; " + ("a queued resource" if opts.queued else "a TPU VM node"),
                 f"${per_host:g}/h per host = {t.price_spot_chip_h if spot else t.price_ondemand_chip_h:g} $/chip-h "
                 f"x {t.chips_per_host} ({'spot: the catalog estimate' if spot else 'on-demand'}); "
                 f"${t.price_per_hour(spot):g}/h for the slice; TPU prices snapshot {snapshot()}",
                 f"zones, in order: {', '.join(zones)}"]
        if spot:
            notes.append("a spot slice can be preempted (state PREEMPTED) at any time; recovery remakes it whole")
        notes += lifetime_note(lifetime_s(spec.policies, t.hosts, per_host),
                               "worker 0 deletes the slice through the TPU API: no maxRunDuration there")
        if spec.policies.idle_minutes:
            notes.append(f"policies.idle_minutes: worker 0 deletes the slice after {spec.policies.idle_minutes:g} "
                         "min with no job and no SSH login on it")
        return Plan(provider="gcp", num_nodes=t.hosts, instance_type=t.name,
                    market="spot" if spot else "on-demand", region=zones[0].rsplit("-", 1)[0], zone=zones[0],
                    gpu_name=f"tpu-{t.generation} chips", gpus_per_node=t.chips_per_host, price_per_hour=per_host,
                    max_hours=spec.policies.max_hours,
                    notes=notes)

    # ---- provision ----

    def body(self, spec: ClusterSpec, cluster: Cluster, opts: GCPOptions, t: TPUType, rt: str) -> dict[str, Any]:
        """A Node (REST reference: projects.locations.nodes#Node)."""
        labels = {**opts.labels, gapi.LABEL_CLUSTER: cluster.id, gapi.LABEL_CLUSTER_NAME: cluster.name,
                  gapi.LABEL_OWNER: gapi.label_value(owner()), gapi.LABEL_CREATED: str(int(cluster.created_at))}
        pub = ensure_key(cluster.id)
        node: dict[str, Any] = {
            "runtimeVersion": rt, "labels": labels,
            "metadata": {"ssh-keys": f"{opts.ssh_user}:{pub.strip()} {opts.ssh_user}"},
            "networkConfig": {"network": opts.network if "/" in opts.network else f"global/networks/{opts.network}",
                              "enableExternalIps": opts.external_ip if opts.external_ip is not None
                              else not opts.ssh_proxy_command},
            "tags": [gapi.network_tag(cluster.id)],
        }
        if opts.subnetwork:
            node["networkConfig"]["subnetwork"] = opts.subnetwork
        if opts.topology:
            node["acceleratorConfig"] = {"type": t.api_generation, "topology": opts.topology}
        else:
            node["acceleratorType"] = t.accelerator_type
        if spec.resources.use_spot and not opts.queued:
            node["schedulingConfig"] = {"spot": True}
        if opts.service_account:
            node["serviceAccount"] = {"email": opts.service_account,
                                      "scope": ["https://www.googleapis.com/auth/cloud-platform"]}
        return node

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        opts = gcp_options(spec.gcp)
        project = gapi.project_of(opts.project)
        t, rt, zones = check(spec, opts)
        # what is left of the run's time/cost budget (BudgetSpent, before anything is made, when nothing is)
        life = node_lifetime_s(spec.policies, t.hosts, t.price_per_host_hour(spec.resources.use_spot), cluster)
        body = self.body(spec, cluster, opts, t, rt)
        found = self.find(project, cluster.id)
        live = [n for n in found if n.get("state") not in ("PREEMPTED", "TERMINATED", "DELETING")]
        if live:  # a resumed `up`: the slice there pins the zone
            zones = [_zone(live[0]["name"])]
        for n in found:
            if n not in live:
                self.delete_slice(project, _zone(n["name"]), cluster, poll_s=opts.poll_s)
        attempts = Attempts()
        for zone in zones:
            try:
                node = self._make(project, zone, cluster, opts, body, spec.resources.use_spot, t)
            except (CapacityError, QuotaError) as e:
                attempts.add(zone, e)
                self.report.warn(f"{zone}: {e.message}; trying the next zone")
                self.delete_slice(project, zone, cluster, poll_s=opts.poll_s)
                continue
            except BaseException:
                try:
                    self.delete_slice(project, zone, cluster, poll_s=opts.poll_s)
                except GtrainError as e:
                    self.report.warn(f"could not clean up after the failed attempt: {e.message}")
                raise
            self.record(spec, cluster, plan, opts, project, zone, node, t)
            if opts.wait_ssh:
                wait_ssh(cluster, self.ledger, self.report, host_keys=lambda _n: [], host_key_wait_s=0,
                         ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=32,
                         key_source="the TPU API", hint="check gcp.ssh_proxy_command / the network")
            self.arm_limits(spec, cluster, opts, project, zone, life)
            return
        drop_key(cluster.id)
        attempts.fail(f"{t.name} ({plan.market})", quota_hint="request a TPU quota increase, or add zones",
                      capacity_hint="add zones (resources.zones / regions), try gcp.queued: true or on-demand; "
                                    "nothing was left running")

    def arm_limits(self, spec: ClusterSpec, cluster: Cluster, opts: GCPOptions, project: str, zone: str,
                   life: int | None) -> None:
        """policies' limits, held by the slice's worker 0 (:mod:`.limits`)."""
        from gtrain.providers.gcp.tpu.limits import arm
        from gtrain.remote.ssh import runner_from_node

        node = next(n for n in self.store.node_records(cluster.id) if n.rank == 0)
        parent = f"projects/{project}/locations/{zone}"
        arm(spec, opts, runner_from_node(node, cluster.name), f"{parent}/nodes/{cluster.id}",
            f"{parent}/queuedResources/{cluster.id}" if opts.queued else None, life, self.report)

    def _make(self, project: str, zone: str, cluster: Cluster, opts: GCPOptions, body: dict[str, Any],
              spot: bool, t: TPUType) -> dict[str, Any]:
        parent = f"projects/{project}/locations/{zone}"
        name = f"{parent}/nodes/{cluster.id}"
        if self.api.node(project, zone, cluster.id) is None:
            if opts.queued:  # REST reference: projects.locations.queuedResources#QueuedResource
                qr_name = f"{parent}/queuedResources/{cluster.id}"
                rid = self.ledger.record(cluster, "tpu-queued-resource", qr_name, zone)
                qr = {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": cluster.id, "node": body}]},
                      **({"spot": {}} if spot else {"guaranteed": {}})}
                try:
                    self.api.call("POST", f"{parent}/queuedResources", f"queuedResources.create {cluster.id}", qr,
                                  {"queuedResourceId": cluster.id})
                except GtrainError:
                    self.ledger.mark(rid, "not-created")
                    raise
                self.ledger.mark(rid, "created")
                self._wait_queued(qr_name, opts)
            else:
                rid = self.ledger.record(cluster, "tpu-node", name, zone)
                try:
                    op = self.api.call("POST", f"{parent}/nodes", f"nodes.create {cluster.id}", body,
                                       {"nodeId": cluster.id})
                    self.api.wait_op(op, f"nodes.create {cluster.id} in {zone}", poll_s=opts.poll_s)
                except GtrainError:
                    self.ledger.mark(rid, "not-created")
                    raise
                self.ledger.mark(rid, "created")
        return self._wait_ready(project, zone, cluster.id, opts, t)

    def _wait_queued(self, qr_name: str, opts: GCPOptions, timeout: float = 3600) -> None:
        deadline, last, delay = time.monotonic() + timeout, "", 0.05
        while True:
            qr = self.api.call("GET", qr_name, "queuedResources.get")
            st = (qr.get("state") or {}).get("state", "")
            if st != last:
                self.report.info(f"queued resource {qr_name.rsplit('/', 1)[-1]}: {st}")
                last = st
            if st == QR_DONE:
                return
            if st in QR_FAILED:
                err = ((qr.get("state") or {}).get("failedData") or {}).get("error") or {}
                from gtrain.providers.gcp.tpu.api import RPC_CODES, translate_status

                raise translate_status(RPC_CODES.get(int(err.get("code") or 0), "FAILED"),
                                       str(err.get("message") or st), None, f"queued resource {qr_name}")
            if time.monotonic() > deadline:
                raise CapacityError(f"queued resource {qr_name}: still {st} after {timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, opts.poll_s)

    def _wait_ready(self, project: str, zone: str, name: str, opts: GCPOptions, t: TPUType,
                    timeout: float = 1800) -> dict[str, Any]:
        deadline, last, delay = time.monotonic() + timeout, "", 0.05
        while True:
            node = self.api.node(project, zone, name)
            if node is None:
                raise ProviderError(f"TPU {name} is gone from {zone} while gtrain waited for it")
            st = str(node.get("state") or "")
            if st != last:
                self.report.info(f"TPU {name} ({t.name}) in {zone}: {st}")
                last = st
            if st == "READY" and len(node.get("networkEndpoints") or []) == t.hosts:
                return node
            if st in ("PREEMPTED", "TERMINATED"):
                raise CapacityError(f"TPU {name} in {zone} became {st} before it was ready")
            if time.monotonic() > deadline:
                raise ProviderError(f"TPU {name} in {zone} not READY after {timeout:.0f}s ({st})")
            time.sleep(delay)
            delay = min(delay * 2, opts.poll_s)

    def record(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: GCPOptions, project: str, zone: str,
               node: dict[str, Any], t: TPUType) -> None:
        from gtrain.providers.gcp.instances import ssh_target

        spot = spec.resources.use_spot
        price = t.price_per_host_hour(spot)
        for rank, ep in enumerate(node.get("networkEndpoints") or []):
            host = f"{cluster.id}-w{rank}"  # a worker's name (%h of gcp.ssh_proxy_command)
            meta: dict[str, Any] = {
                "project": project, "region": zone.rsplit("-", 1)[0], "zone": zone, "tpu": node["name"],
                "queued": opts.queued, "market": "spot" if spot else "on-demand", "instance_type": t.name,
                "chips": t.chips_per_host, "price_ondemand": t.price_per_host_hour(False),
                "price_spot_catalog": t.price_per_host_hour(True) if spot else None, "disk_gb": 0,
                "private_ip": ep.get("ipAddress"), "public_ip": (ep.get("accessConfig") or {}).get("externalIp"),
                "spot": spot, "ssh_user": opts.ssh_user, "key_file": str(key_path(cluster.id)),
                "proxy_command": opts.ssh_proxy_command,
            }
            self.ledger.put_node(cluster.id, NodeRecord(
                rank=rank, status="up", address=ep.get("ipAddress"), instance_id=host, zone=zone,
                ssh=ssh_target(meta, host), launched_at=time.time(), extra=meta))
        plan.region, plan.zone, plan.price_per_hour = zone.rsplit("-", 1)[0], zone, price
        with self.ledger.lock:
            self.store.update_cluster(cluster.id, region=plan.region, price_per_hour=price)
        write_ssh_config(self.ledger, self.report)

    # ---- describe ----

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        nodes = self.store.node_records(cluster.id)
        if not nodes:
            return []
        project, zone = str(nodes[0].extra.get("project")), nodes[0].zone or ""
        node = self.api.node(project, zone, cluster.id)
        by_gtrain = cluster.status in ("terminating", "terminated")
        if node is None:
            lost = "preempted" if nodes[0].extra.get("spot") and not by_gtrain else "missing"
            return [NodeStatus(n.rank, lost, n.address, f"TPU {cluster.id}: no such node in {zone}") for n in nodes]
        st, health = str(node.get("state") or "UNKNOWN"), str(node.get("health") or "")
        mapped = STATES.get(st, st.lower())
        if mapped == "stopped" and node.get("schedulingConfig", {}).get("spot") and not by_gtrain:
            mapped = "preempted"
        detail = f"TPU {cluster.id}: {st}" + (f", health {health}" if health else "") \
            + (f" ({node['healthDescription']})" if node.get("healthDescription") else "")
        return [NodeStatus(n.rank, mapped, n.address, detail) for n in nodes]

    # ---- terminate / gc ----

    def find(self, project: str, cluster_id: str | None) -> list[dict[str, Any]]:
        """Nodes of every zone labelled with the cluster (any gtrain cluster when None)."""
        return [n for n in self.api.list(project, "-", "nodes")
                if gapi.LABEL_CLUSTER in (n.get("labels") or {})
                and (cluster_id is None or n["labels"][gapi.LABEL_CLUSTER] == cluster_id)]

    def queued(self, project: str, cluster_id: str | None) -> list[dict[str, Any]]:
        """Queued resources whose node spec carries the cluster label (queued resources have no labels)."""
        out = []
        for qr in self.api.list(project, "-", "queuedResources"):
            specs = (qr.get("tpu") or {}).get("nodeSpec") or []
            cids = {(s.get("node") or {}).get("labels", {}).get(gapi.LABEL_CLUSTER) for s in specs}
            if cids - {None} and (cluster_id is None or cluster_id in cids):
                out.append({**qr, "cluster": next(iter(cids - {None}))})
        return out

    def delete_slice(self, project: str, zone: str | None, cluster: Cluster | None, cluster_id: str | None = None,
                     poll_s: float = 1.0) -> None:
        """Delete the cluster's queued resource (force: its node goes with it) and node; wait until gone."""
        cid = cluster.id if cluster is not None else str(cluster_id)
        zones = [zone] if zone else sorted({_zone(n["name"]) for n in self.find(project, cid)}
                                           | {_zone(q["name"]) for q in self.queued(project, cid)})
        for z in zones:
            parent = f"projects/{project}/locations/{z}"
            for name, what, force in ((f"{parent}/queuedResources/{cid}", "queuedResources.delete", True),
                                      (f"{parent}/nodes/{cid}", "nodes.delete", False)):
                op = self.api.delete(name, f"{what} {cid}", force=force)
                if op is not None and op.get("name"):
                    self.api.wait_op(op, f"{what} {cid}", poll_s=poll_s)
            deadline, delay = time.monotonic() + 600, 0.05
            while self.api.node(project, z, cid) is not None:
                if time.monotonic() > deadline:
                    raise ProviderError(f"TPU {cid} in {z} still there 600 s after delete")
                time.sleep(delay)
                delay = min(delay * 2, poll_s)
        if cluster is not None:
            self.ledger.mark_live(cid, "deleted", kind="tpu-node")
            self.ledger.mark_live(cid, "deleted", kind="tpu-queued-resource")

    def terminate(self, cluster: Cluster) -> None:
        opts = gcp_options(cluster.spec.get("gcp"))
        self.delete_slice(gapi.project_of(opts.project), None, cluster, poll_s=opts.poll_s)
        drop_key(cluster.id)

    def recreate(self, spec: ClusterSpec, cluster: Cluster) -> None:
        """A preempted slice is remade whole (a slice runs only when every worker does)."""
        opts = gcp_options(spec.gcp)
        self.delete_slice(gapi.project_of(opts.project), None, cluster, poll_s=opts.poll_s)
        self.provision(spec, cluster, self.plan(spec))

    def gc(self, project: str, live_ids: set[str], delete: bool, regions: list[str] | None) -> GCResult:
        res = GCResult([project])
        for n in self.find(project, None):
            cid, z = n["labels"][gapi.LABEL_CLUSTER], _zone(n["name"])
            if cid not in live_ids and (not regions or z.rsplit("-", 1)[0] in regions):
                res.orphans.append(Orphan(z, cid, "tpu-node", n["name"].rsplit("/", 1)[-1]))
        for q in self.queued(project, None):
            z = _zone(q["name"])
            if q["cluster"] not in live_ids and (not regions or z.rsplit("-", 1)[0] in regions):
                res.orphans.append(Orphan(z, q["cluster"], "tpu-queued-resource", q["name"].rsplit("/", 1)[-1]))
        if delete:
            for cid in res.clusters:
                self.delete_slice(project, None, None, cluster_id=cid)
            res.deleted = bool(res.orphans)
        return res

    # ---- price ----

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        node = next((n for n in self.store.node_records(cluster.id) if n.rank == interval.node_rank), None)
        meta: dict[str, Any] = node.extra if node is not None else {}
        rate = float(meta.get("price_spot_catalog") or interval.price_per_hour)
        spot = (rate, True, f"TPU spot: the catalog's estimate ${rate:g}/h per host ({meta.get('chips', '?')} chips)")
        return cloud_interval_cost(interval, minimum_s=60.0, spot=spot, disk_gb=0, disk_usd_per_gb_month=0,
                                   disk_label="boot disk (in the TPU price)")


def _zone(name: str) -> str:
    """``projects/p/locations/us-east5-a/nodes/x`` -> ``us-east5-a``."""
    parts = name.split("/")
    return parts[parts.index("locations") + 1] if "locations" in parts else ""
