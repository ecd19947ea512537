"""Launching a gcp cluster's nodes in one zone and waiting for them: one ``instances.insert`` per missing node, in
parallel, each with a ``requestId`` kept in the resource ledger before the call and a deterministic name
(``<cluster id>-<rank>``), so a retried or resumed ``up`` gets the same instance back; the insert's zone
operation is waited on (zoneOperations.wait), then every node until it is RUNNING (a Spot VM deleted while it
starts is a capacity error). An elastic cluster (``num_nodes: {min, max}``) keeps the nodes that came when the
others were refused for capacity or quota, at least ``min`` of them (:func:`gtrain.providers.base.partial_start`);
the rest stay pending for ``gtrain.runs.elastic.grow``. Then recording the nodes and waiting for SSH with the host
keys the guest agent publishes in guest attributes. A part of :class:`gtrain.providers.gcp.provider.GCPProvider`."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gtrain.errors import CapacityError, GtrainError, ProviderError, QuotaError
from gtrain.providers.base import partial_start
from gtrain.providers.cloud.keys import key_path
from gtrain.providers.cloud.ssh_access import wait_ssh, write_ssh_config
from gtrain.providers.gcp import api
from gtrain.providers.gcp.api import LABEL_RANK, gce
from gtrain.providers.gcp.options import GCPOptions, gcp_options

if TYPE_CHECKING:
    from gtrain.catalog import Offer
    from gtrain.events import Reporter
    from gtrain.providers.base import Plan
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster
    from gtrain.state.nodes import NodeRecord
    from gtrain.state.sshtarget import SSHTarget


class GCPInstances:
    """The nodes of a cluster in one zone: create (idempotently), wait for running, record, wait for SSH."""

    def __init__(self, compute: api.Compute, ledger: Ledger, report: Reporter, max_workers: int) -> None:
        self.compute = compute
        self.ledger = ledger
        self.store = ledger.store
        self.report = report
        self.max_workers = max_workers

    def _tokens(self, cluster: Cluster, ranks: list[int], zone: str) -> dict[int, tuple[str, int]]:
        """The requestId (and ledger row) of each node's insert in this zone, recorded before the call; a row still
        'creating' (a crash between request and answer) is reused so GCE answers with the same operation."""
        out: dict[int, tuple[str, int]] = {}
        with self.ledger.lock:
            for res in self.store.resources(cluster.id, live_only=True):
                m = res.meta
                if res.kind == "instance" and res.status == "creating" and m.get("rank") in ranks \
                        and m.get("zone") == zone:
                    out[int(m["rank"])] = (str(m["request_id"]), res.id)
            for rank in ranks:
                if rank not in out:
                    rq = str(uuid.uuid4())
                    out[rank] = (rq, self.store.record_resource(
                        cluster.id, "instance", f"{zone}/{api.instance_name(cluster.id, rank)}",
                        region=api.region_of_zone(zone), meta={"rank": rank, "zone": zone, "request_id": rq}))
        return out

    def launch_zone(self, spec: ClusterSpec, cluster: Cluster, project: str, zone: str, body: api.NodeBody,
                     existing: dict[int, Any], made: list[str], dropped: list[str] | None = None) -> dict[int, Any]:
        """Make the missing ranks in ``zone`` (names appended to ``made`` as the inserts are accepted) and wait
        until they run. An elastic start may keep fewer (:func:`gtrain.providers.base.partial_start`): instances
        made past a refused rank are appended to ``dropped`` for the caller to delete."""
        dropped = [] if dropped is None else dropped
        missing = [r for r in range(spec.num_nodes) if r not in existing]
        if missing:
            self.report.info(f"{zone}: creating {len(missing)} {body.machine_type} node(s)"
                             + (f" ({len(existing)} already there)" if existing else ""))
        tokens = self._tokens(cluster, missing, zone)
        made_lock = threading.Lock()

        from google.cloud import compute_v1

        def one(rank: int) -> str:
            rq, rid = tokens[rank]
            name = api.instance_name(cluster.id, rank)
            labels = {**body.labels, LABEL_RANK: str(rank)}
            what = f"instances.insert {name} ({body.machine_type}, {zone})"
            try:
                try:
                    with gce(what):
                        op = self.compute.clients.instances.insert(request=compute_v1.InsertInstanceRequest(
                            project=project, zone=zone, request_id=rq,
                            instance_resource=api.instance_body(body, name, zone, labels)))
                    with made_lock:
                        made.append(name)
                    api.wait_zone_op(self.compute.clients, project, zone, op.name, what)
                except ProviderError as e:
                    if api.code(e) != "alreadyExists":
                        raise
                    with made_lock:
                        if name not in made:
                            made.append(name)
            except GtrainError:
                self.ledger.mark(rid, "not-created")
                raise
            self.ledger.mark(rid, "created")
            self.report.node(rank, f"{name} created in {zone}")
            return name

        ranks = list(range(spec.num_nodes))
        if missing:
            errors: dict[int, BaseException] = {}
            with ThreadPoolExecutor(min(self.max_workers, len(missing))) as pool:
                futs = {rank: pool.submit(one, rank) for rank in missing}
                for rank, f in futs.items():
                    try:
                        f.result()
                    except BaseException as e:  # noqa: BLE001 - the first error is raised below
                        errors[rank] = e
            if errors:
                # an elastic start keeps what came up when the rest found no capacity (at least num_nodes.min)
                start = partial_start(spec, sorted(existing), [r for r in missing if r not in errors], errors,
                                      self._recorded(cluster, missing))
                if start is None:
                    caps = [e for e in errors.values() if isinstance(e, CapacityError | QuotaError)]
                    raise (caps[0] if caps else next(iter(errors.values())))
                dropped.extend(api.instance_name(cluster.id, r) for r in start.drop)
                ranks = sorted([*existing, *start.keep])
                self.report.warn(start.note(zone, len(ranks), spec))
        # an elastic cluster's nodes may be in several zones of the region (a growth where the others' zone had
        # no capacity): those of other zones are running already, as found
        elsewhere = {r: existing[r] for r in ranks if r in existing and api.zone_of(existing[r].zone or zone) != zone}
        names = {rank: api.instance_name(cluster.id, rank) for rank in ranks if rank not in elsewhere}
        return {**elsewhere, **self._wait_running(project, zone, names, spec)}

    def _recorded(self, cluster: Cluster, ranks: list[int]) -> set[int]:
        """Those of ``ranks`` the cluster has a node record for: a replacement, never left pending."""
        return {n.rank for n in self.store.node_records(cluster.id)} & set(ranks)

    def _wait_running(self, project: str, zone: str, names: dict[int, str], spec: ClusterSpec,
                      timeout: float = 900.0) -> dict[int, Any]:
        opts = gcp_options(spec.gcp)
        deadline = time.monotonic() + timeout
        delay = min(0.25, opts.poll_s)
        seen: dict[str, str] = {}
        while True:
            got: dict[int, Any] = {}
            for rank, name in names.items():
                inst = self.compute.instance(project, zone, name)
                if inst is None:
                    if spec.resources.use_spot and name in seen:  # GCE took a Spot VM back while it started
                        raise CapacityError(f"{name} was deleted while starting (Spot capacity)")
                    continue
                if seen.get(name) != inst.status:
                    seen[name] = inst.status
                    self.report.node(rank, f"{name} {inst.status}")
                if inst.status in ("STOPPING", "TERMINATED", "SUSPENDED"):
                    err: GtrainError = (CapacityError if spec.resources.use_spot else ProviderError)(
                        f"{name} went {inst.status} while starting")
                    raise err
                got[rank] = inst
            if len(got) == len(names) and all(i.status == "RUNNING" for i in got.values()):
                return got
            if time.monotonic() > deadline:
                raise ProviderError(f"{zone}: nodes not running after {timeout:.0f}s: "
                                    + ", ".join(f"{n} {s}" for n, s in seen.items()))
            time.sleep(delay)
            delay = min(delay * 2, opts.poll_s)

    def record_nodes(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: GCPOptions, project: str,
                      zone: str, nodes: dict[int, Any], offer: Offer, *, home: str | None = None) -> None:
        """Record ``nodes``, each in its own zone. ``home``: the zone of the nodes that were already there (an
        elastic cluster's node 0); a node elsewhere is noted so."""
        from gtrain.state.nodes import NodeRecord

        spot = spec.resources.use_spot
        price = offer.price(spot)
        region = api.region_of_zone(zone)
        home = home or zone
        moved: list[int] = []
        for rank, inst in sorted(nodes.items()):
            at = api.zone_of(inst.zone) if inst.zone else zone
            nic = inst.network_interfaces[0] if inst.network_interfaces else None
            private_ip = nic.network_i_p if nic else None
            public_ip = nic.access_configs[0].nat_i_p if nic and nic.access_configs else None
            launched = time.time()
            meta: dict[str, Any] = {
                "project": project, "region": region, "zone": at,
                "market": "spot" if spot else "on-demand", "instance_type": offer.instance_type,
                "accelerator_type": offer.accelerator_type, "price_ondemand": offer.price_ondemand,
                "price_spot_catalog": offer.price_spot, "disk_gb": spec.resources.disk_gb, "disk_type": opts.disk_type,
                "private_ip": private_ip, "public_ip": public_ip, "spot": spot, "ssh_user": opts.ssh_user,
                "key_file": str(key_path(cluster.id)), "proxy_command": opts.ssh_proxy_command,
            }
            if at != home:
                if at == zone:
                    moved.append(rank)
                meta["note"] = (f"in {at}, not {home} with the cluster's other nodes ({home} had no capacity): "
                                "same VPC network; its traffic to them crosses zones")
            self.ledger.put_node(cluster.id, NodeRecord(
                rank=rank, status="up", address=private_ip, instance_id=inst.name, zone=at,
                ssh=ssh_target(meta, inst.name), launched_at=launched, extra=meta))
        if moved:  # this call's zone is not the others'
            self.report.warn(f"node(s) {', '.join(map(str, moved))} in {zone}, not {home} (no capacity there): same "
                             "VPC network; their traffic to the other nodes crosses zones (slower, billed per GB)")
        plan.region, plan.zone, plan.price_per_hour = region, home, price
        with self.ledger.lock:
            self.store.update_cluster(cluster.id, region=region, price_per_hour=price)
        write_ssh_config(self.ledger, self.report)

    # ---- stop / start ----

    def power(self, project: str, nodes: list[NodeRecord], verb: str) -> dict[int, dict[str, str | None]]:
        """``instances.stop`` / ``instances.start`` on every node in parallel, each zone operation waited on, then
        each instance until GCE says TERMINATED (stopped) / RUNNING; rank -> its fresh addresses (start gives a
        new ephemeral external IP). REST reference: https://cloud.google.com/compute/docs/reference/rest/v1/
        instances/stop and .../instances/start."""
        want = "TERMINATED" if verb == "stop" else "RUNNING"
        poll = gcp_options({}).poll_s

        def one(node: NodeRecord) -> tuple[int, dict[str, str | None]]:
            zone, name = node.zone or node.extra.get("zone") or "", node.instance_id or ""
            what = f"instances.{verb} {name}"
            with gce(what):
                call = self.compute.clients.instances.stop if verb == "stop" else self.compute.clients.instances.start
                op = call(project=project, zone=zone, instance=name)
            api.wait_zone_op(self.compute.clients, project, zone, op.name, what)
            deadline = time.monotonic() + 900
            delay = 0.1
            last = ""
            while True:
                inst = self.compute.instance(project, zone, name)
                if inst is None:
                    raise ProviderError(f"{name} no longer exists in {zone}: it cannot be {verb}ed",
                                        hint="`gtrain down` ends the cluster; `gtrain up` makes a new one")
                if inst.status != last:
                    last = inst.status
                    self.report.node(node.rank, f"{name} {last}")
                if inst.status == want:
                    nic = inst.network_interfaces[0] if inst.network_interfaces else None
                    return node.rank, {
                        "private_ip": nic.network_i_p if nic else None,
                        "public_ip": nic.access_configs[0].nat_i_p or None if nic and nic.access_configs else None}
                if time.monotonic() > deadline:
                    raise ProviderError(f"{name} not {want} 900 s after instances.{verb} ({last})")
                time.sleep(delay)
                delay = min(delay * 2, poll)

        with ThreadPoolExecutor(min(self.max_workers, max(1, len(nodes)))) as pool:
            return dict(f.result() for f in [pool.submit(one, n) for n in nodes])

    # ---- ssh ----

    def wait_ssh(self, cluster: Cluster, opts: GCPOptions, project: str) -> None:
        wait_ssh(cluster, self.ledger, self.report,
                 host_keys=lambda node: self._guest_host_keys(project, node.zone or node.extra.get("zone") or "",
                                                              node.instance_id or ""),
                 host_key_wait_s=opts.host_key_wait_s, ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s,
                 max_workers=self.max_workers, key_source="the instance's guest attributes",
                 hint="check gcp.ssh_cidr / gcp.ssh_proxy_command; `gtrain down` removes them")

    def _guest_host_keys(self, project: str, zone: str, name: str) -> list[str]:
        """``keytype base64`` lines the guest environment publishes under guest attributes ``hostkeys/``
        (enabled by the ``enable-guest-attributes`` metadata gtrain sets); [] until it has."""
        try:
            with gce(f"instances.getGuestAttributes {name}"):
                # query_path is not a flattened argument of the client: it goes in the request
                ga = self.compute.clients.instances.get_guest_attributes(request={
                    "project": project, "zone": zone, "instance": name, "query_path": "hostkeys/"})
        except ProviderError as e:
            if api.is_not_found(e):  # not published yet (the guest agent is still starting)
                return []
            raise
        items = ga.query_value.items if ga.query_value else []
        return [f"{i.key} {i.value}" for i in items
                if i.namespace == "hostkeys" and (i.key.startswith("ssh-") or i.key.startswith("ecdsa-")) and i.value]


def ssh_target(meta: dict[str, Any], name: str) -> SSHTarget:
    """How gtrain reaches an instance: its external address (internal without one), or its name through
    ``gcp.ssh_proxy_command`` (IAP)."""
    from gtrain.state.sshtarget import SSHTarget

    proxy = meta.get("proxy_command")
    if proxy:  # {zone} and {project} are filled in here (IAP tunnels need the zone); %h is OpenSSH's
        proxy = proxy.replace("{zone}", str(meta.get("zone") or "")).replace("{project}",
                                                                              str(meta.get("project") or ""))
    host = name if proxy else (meta.get("public_ip") or meta.get("private_ip") or "")
    return SSHTarget(host=host, port=22, user=meta.get("ssh_user") or "gtrain",
                     identity_file=meta.get("key_file"), proxy_command=proxy)

