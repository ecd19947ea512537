"""The vast provider: :class:`VastProvider` plans from Vast.ai's live marketplace (the cheapest offer the spec and
its caps allow), rents one instance per node from an offer (``PUT /api/v0/asks/{id}/``, ``runtype: ssh_direct``),
attaches the cluster's SSH key to it, describes, destroys by tag, gives SSH runners (the instance's public IP and
its published ``22/tcp``) and prices each node interval at the rate frozen at ``up``: the offer's own billed $/h
(``dph_total``, the disk's storage in it; a bid's price interruptible) as the rented instance reports it, marked
live -- never a catalog estimate (gtrain/providers/vast/offers.py).

Offers are tried cheapest first (at most ``vast.max_offers``): one taken meanwhile (the ask is gone), one that
does not come up with its SSH port in time, or one whose instance reports a price above the caps is destroyed
and the next is tried; when none is left one CapacityError lists the attempts. An offer priced above
``vast.max_usd_per_hour``, or of which one hour costs more than what is left of ``policies.max_cost_usd``, is
skipped before anything is rented.

``resources.use_spot``: an interruptible instance, a bid (``price``) at ``vast.bid_usd_per_hour`` or the offer's
``min_bid``. A higher bid stops it (``actual_status`` stopped while gtrain wants it running): ``describe`` says
``preempted`` and gtrain's recovery destroys it and rents the next offer.

Not built (docs/providers/vast.md): more than one node (Vast has no cluster product with a private network
between instances: ``num_nodes > 1`` is refused), volumes, ``gtrain stop``/``start``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.errors import CapacityError, ConfigError, GtrainError, QuotaError
from gtrain.events import SILENT, Reporter
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Plan, ProviderCheck
from gtrain.providers.cloud.billing import freeze_price, live_price, price_fields, price_label
from gtrain.providers.cloud.failover import Attempts
from gtrain.providers.cloud.idle import idle_watch
from gtrain.providers.cloud.keys import drop_key, ensure_key, key_path
from gtrain.providers.cloud.provider import CloudProvider
from gtrain.providers.cloud.ssh_access import finish_down, wait_ssh, write_ssh_config
from gtrain.providers.vast import offers as vo
from gtrain.providers.vast.api import ENV_KEY, KEY_HINT, NoAPIKey, Unreachable, VastAPI
from gtrain.providers.vast.options import VastOptions, vast_options
from gtrain.providers.vast.teardown import TAG_ENV, VastTeardown, country, label, owner

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval, StateStore
    from gtrain.state.nodes import NodeRecord

__all__ = ["VastProvider", "instance_body", "status_of"]

#: ``actual_status`` -> gtrain's node status (a stopped bid that gtrain wants running: ``preempted``, see status_of)
STATES = {"running": "running", "loading": "pending", "created": "pending", "rebooting": "pending",
          "stopped": "stopped", "frozen": "stopped", "exited": "unhealthy", "unknown": "unreachable",
          "offline": "unreachable"}
#: from these an instance does not run by itself: a launch waiting on one has lost that node
LOST = ("stopped", "exited", "offline", "preempted")
MULTI_NODE_WHY = ("Vast.ai rents single instances on independent hosts: it has no cluster product with a private "
                  "network between instances, so gtrain does not build multi-node runs on it")


def instance_body(cluster_id: str, rank: int, opts: VastOptions, disk_gb: int, bid: float | None) -> dict[str, Any]:
    """The ``PUT /api/v0/asks/{id}/`` body of one rank: Vast's sshd in front of the image (``ssh_direct``: the
    instance's own public port, no proxy), the cluster's tag in the label and the env, the bid when
    interruptible."""
    body: dict[str, Any] = {"image": opts.image, "label": label(cluster_id, rank), "disk": disk_gb,
                            "runtype": "ssh_direct", "target_state": "running", "env": {TAG_ENV: cluster_id}}
    if bid is not None:
        body["price"] = round(bid, 6)
    return body


def status_of(inst: dict[str, Any]) -> str:
    """gtrain's status of an instance: an interruptible one stopped while it is meant to run was outbid."""
    st = str(inst.get("actual_status") or "loading")
    if st in ("stopped", "exited") and inst.get("is_bid") and inst.get("intended_status") != "stopped":
        return "preempted"
    return STATES.get(st, st)


def ssh_direct(inst: dict[str, Any]) -> tuple[str, int] | None:
    """(public IP, port) of the instance's published ``22/tcp``, None until it has one."""
    ports = inst.get("ports") if isinstance(inst.get("ports"), dict) else {}
    bound = (ports or {}).get("22/tcp")
    host = inst.get("public_ipaddr")
    if not host or not isinstance(bound, list) or not bound or not isinstance(bound[0], dict):
        return None
    try:
        return str(host).strip(), int(str(bound[0].get("HostPort")))
    except ValueError:
        return None


def instance_price(inst: dict[str, Any]) -> float | None:
    v = inst.get("dph_total")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


class VastProvider(CloudProvider):
    name = "vast"
    gc_scope: ClassVar[str | None] = "region"
    #: Vast bills on-demand and interruptible rentals per second, no minimum (https://vast.ai/pricing)
    billing_minimum_s: ClassVar[float] = 0.0
    nodes_enforce_limits: ClassVar[bool] = False
    can_stop: ClassVar[bool] = False
    cannot_stop_why: ClassVar[str | None] = ("gtrain does not stop Vast.ai instances: a stopped instance keeps "
                                             "billing its disk and may find its host's GPUs rented when started")

    def __init__(self, store: StateStore, report: Reporter = SILENT, *, api: VastAPI | None = None,
                 max_workers: int = 32) -> None:
        super().__init__(store, report, max_workers=max_workers)
        self.api = api or VastAPI()
        self.teardown = VastTeardown(self.api, self.ledger, report)

    @staticmethod
    def check(timeout: float) -> ProviderCheck:
        from gtrain.providers.vast.check import check

        return check(timeout)

    def cloud_options(self, spec: ClusterSpec) -> VastOptions:
        return vast_options(spec.section("vast"))

    # ---- plan ----

    @staticmethod
    def _refuse(spec: ClusterSpec, opts: VastOptions) -> None:
        res = spec.resources
        if spec.num_nodes > 1:
            raise ConfigError(f"num_nodes: {spec.num_nodes} nodes on Vast.ai: {MULTI_NODE_WHY}", field="num_nodes",
                              hint="num_nodes: 1 on vast, or a provider with multi-node clusters (runpod, aws, gcp)")
        if res.image_id:
            raise ConfigError("resources.image_id: a Vast.ai instance runs a container image",
                              field="resources.image_id", hint="leave resources.image_id out; set vast.image")
        if res.instance_type:
            raise ConfigError("resources.instance_type: Vast.ai has no instance types, only offers by GPU",
                              field="resources.instance_type", hint="give resources.accelerators, e.g. RTX4090:1")
        if not res.accelerators:
            raise ConfigError("resources: Vast.ai needs resources.accelerators (e.g. H100:1)", field="resources",
                              hint="gtrain rents Vast.ai GPU instances only")
        if opts.bid_usd_per_hour is not None and not res.use_spot:
            raise ConfigError("vast.bid_usd_per_hour: a bid is for an interruptible instance",
                              field="vast.bid_usd_per_hour", hint="set resources.use_spot: true, or leave the bid out")

    def _spent(self, cluster: Cluster | None) -> float:
        """What the cluster has cost so far (its closed and open intervals at their frozen $/h)."""
        if cluster is None:
            return 0.0
        now = time.time()
        return sum(self.billed_cost(i, now) for i in self.store.intervals(cluster.id))

    def _offers(self, spec: ClusterSpec, opts: VastOptions,
                cluster: Cluster | None) -> tuple[list[vo.Pick], list[str], list[str]]:
        """(the offers to try, cheapest first; why others were skipped; the countries asked for)."""
        res = spec.resources
        where = vo.countries(res)
        names = vo.gpu_names(res.gpu_name or "")
        count = res.gpus_per_node
        rows = self.api.search_offers(vo.query(names, count, opts, res.disk_gb, res.use_spot, where))
        cap = spec.policies.max_cost_usd
        left = None if cap is None else max(0.0, float(cap) - self._spent(cluster))
        picks, skipped = vo.choose(vo.parse(rows), opts, res.use_spot, count, where, spec.num_nodes, left)
        if not picks:
            what = f"{count}x {' or '.join(names)}" + (f" in {', '.join(where)}" if where else "")
            if skipped:
                raise ConfigError(f"policies: every Vast.ai offer of {what} is above the caps ({skipped[0]}"
                                  + (f"; {len(skipped) - 1} more" if len(skipped) > 1 else "") + ")",
                                  field="vast.max_usd_per_hour" if opts.max_usd_per_hour else "policies.max_cost_usd",
                                  hint="raise vast.max_usd_per_hour / policies.max_cost_usd, or ask for another GPU")
            raise ConfigError(f"resources.accelerators: no Vast.ai offer of {what} with reliability >= "
                              f"{opts.min_reliability:g} is rentable now", field="resources.accelerators",
                              hint="another GPU or count, more countries (resources.regions), a lower "
                                   "vast.min_reliability, or try again later")
        return picks, skipped, where

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = vast_options(spec.section("vast"))
        self._refuse(spec, opts)
        res = spec.resources
        try:
            picks, skipped, where = self._offers(spec, opts, None)
        except (NoAPIKey, Unreachable):
            return self._offline_plan(spec)
        best = picks[0]
        o = best.offer
        spot = res.use_spot
        notes = [f"{o.num_gpus}x {o.gpu_name} ({o.gpu_ram_gb:g} GB) on Vast.ai offer {o.id} (host reliability "
                 f"{o.reliability:.3f}, {o.geolocation or 'unknown place'}), image {opts.image}",
                 f"${best.price:g}/h: the offer's live price (" + (
                     f"a bid of ${o.bid(opts):g}/h + ${o.storage_per_hour():.4f}/h storage" if spot else
                     f"dph_total: ${o.dph_base:g}/h compute + ${o.storage_per_hour():.4f}/h for "
                     f"{res.disk_gb} GB") + "); `up` freezes the rate the rented instance reports; bandwidth "
                 f"billed by use (${o.inet_down_cost or 0:g}/GB down, ${o.inet_up_cost or 0:g}/GB up)",
                 f"countries: {', '.join(where) if where else 'any'}; on a taken offer: the next of "
                 f"{min(len(picks), opts.max_offers)} cheapest"]
        if spot:
            notes.append("interruptible: a higher bid stops the instance (preempted); recovery rents another offer")
        if skipped:
            notes.append(f"{len(skipped)} offer(s) skipped by the caps: {skipped[0]}")
        if spec.policies.max_hours or spec.policies.max_cost_usd:
            notes.append("Vast.ai instances do not end themselves: policies.max_hours / max_cost_usd bound the "
                         "offers taken and the estimate; `gtrain down` ends the bill")
        return Plan(provider="vast", num_nodes=1, instance_type=f"{o.num_gpus}x {o.gpu_name}",
                    market="spot" if spot else "on-demand", region=o.country, gpu_name=o.gpu_name,
                    gpus_per_node=o.num_gpus, price_per_hour=best.price, max_hours=spec.policies.max_hours,
                    notes=notes)

    def _offline_plan(self, spec: ClusterSpec) -> Plan:
        """No key or no network (a dry run, an ``any_of`` planned offline): priced from the bundled market
        snapshot, marked an estimate; ``up`` itself needs the live offers."""
        res = spec.resources
        names, count = vo.gpu_names(res.gpu_name or ""), res.gpus_per_node
        got = vo.snapshot_price(names, count, res.use_spot)
        if got is None:
            raise NoAPIKey(f"no Vast.ai API key or network, and no bundled price for {' or '.join(names)}",
                           hint=KEY_HINT)
        name, price, date = got
        return Plan(provider="vast", num_nodes=1, instance_type=f"{count}x {name}",
                    market="spot" if res.use_spot else "on-demand", region=None, gpu_name=name,
                    gpus_per_node=count, price_per_hour=price, max_hours=spec.policies.max_hours,
                    notes=[f"OFFLINE: no Vast.ai API key or network; ${price:g}/h is a typical "
                           f"{'interruptible bid' if res.use_spot else 'on-demand'} price of {count}x {name} on the "
                           f"marketplace from gtrain's bundled snapshot of {date} (an estimate: each host sets its "
                           f"own; set {ENV_KEY} for the live offers)"])

    # ---- provision ----

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        opts = vast_options(spec.section("vast"))
        self._refuse(spec, opts)
        mine = [i for i in self.teardown.instances(cluster.id) if (own := owner(i)) and own[1] == 0]
        existing = [i for i in mine if status_of(i) not in LOST]
        lost = [str(i["id"]) for i in mine if status_of(i) in LOST]
        if lost:  # outbid or dead: it runs nothing but still bills its disk; a new offer replaces it
            self.report.node(0, f"destroying lost instance(s) {', '.join(lost)} before renting another")
            self.teardown.destroy(lost, cluster)
        pub = ensure_key(cluster.id)
        if existing:
            self.report.info(f"found instance {existing[0]['id']} of {cluster.name}")
            inst = self._wait(cluster, opts, str(existing[0]["id"]))
            self._record(spec, cluster, plan, opts, inst, None)
            self._reach(spec, cluster, opts)
            return
        picks, _skipped, _where = self._offers(spec, opts, cluster)
        attempts = Attempts()
        for pick in picks[:opts.max_offers]:
            made: list[str] = []
            where = f"offer {pick.offer.id}"
            try:
                inst = self._rent(spec, cluster, opts, pick, pub, made)
            except (CapacityError, QuotaError) as e:
                attempts.add(where, e)
                self._undo(cluster, made)
                if isinstance(e, QuotaError):
                    break  # no credit: no offer will succeed
                self.report.warn(f"{where}: {e.message}; trying the next")
                continue
            except BaseException:
                self._undo(cluster, made)
                raise
            self._record(spec, cluster, plan, opts, inst, pick)
            self._reach(spec, cluster, opts)
            return
        drop_key(cluster.id)
        attempts.fail(f"1x {spec.resources.gpus_per_node}x {spec.resources.gpu_name}",
                      quota_hint="add credit at https://cloud.vast.ai/billing/",
                      capacity_hint="more countries (resources.regions), a lower vast.min_reliability, another GPU, "
                                    "or try again later; nothing was left running")

    def _rent(self, spec: ClusterSpec, cluster: Cluster, opts: VastOptions, pick: vo.Pick, pub: str,
              made: list[str]) -> dict[str, Any]:
        """Rent one offer for rank 0, give it the cluster's key, wait until it runs with its SSH port; an
        instance reporting a price above the caps is refused (CapacityError: the next offer is tried)."""
        o = pick.offer
        bid = o.bid(opts) if spec.resources.use_spot else None
        body = instance_body(cluster.id, 0, opts, spec.resources.disk_gb, bid)
        rid = self.ledger.record(cluster, "instance", body["label"], o.country or "?", meta={"label": body["label"],
                                                                                            "offer": o.id})
        try:
            iid = str(self.api.create_instance(o.id, body))
        except GtrainError:
            self.ledger.mark(rid, "not-created")
            raise
        made.append(iid)
        self.ledger.mark(rid, "created", ref=iid, meta={"label": body["label"], "offer": o.id})
        self.report.node(0, f"rented offer {o.id} as instance {iid} ({o.num_gpus}x {o.gpu_name}, "
                            f"{o.geolocation or '?'}, ${pick.price:g}/h" + (" interruptible" if bid else "") + ")")
        self.api.attach_ssh_key(int(iid), pub)
        inst = self._wait(cluster, opts, iid)
        billed = instance_price(inst)
        cap = opts.max_usd_per_hour
        if billed is not None and cap is not None and billed > cap + 1e-9:
            raise CapacityError(f"instance {iid} bills ${billed:g}/h, above vast.max_usd_per_hour ${cap:g} (the "
                                f"offer said ${pick.price:g}/h)")
        return inst

    def _wait(self, cluster: Cluster, opts: VastOptions, iid: str) -> dict[str, Any]:
        deadline = time.monotonic() + opts.boot_timeout_s
        while True:
            inst = next((i for i in self.api.instances() if str(i.get("id")) == iid), None)
            st = status_of(inst) if inst is not None else "gone"
            if inst is None or st in LOST:
                raise CapacityError(f"instance {iid} is {st} before it ran")
            if st == "running" and ssh_direct(inst):
                return inst
            if time.monotonic() > deadline:
                raise CapacityError(f"instance {iid} not running with a public SSH port after "
                                    f"{opts.boot_timeout_s:g} s", hint="raise vast.boot_timeout_s")
            time.sleep(opts.poll_s)

    def _record(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: VastOptions, inst: dict[str, Any],
                pick: vo.Pick | None) -> None:
        from gtrain.state.nodes import NodeRecord
        from gtrain.state.sshtarget import SSHTarget

        old = next((n for n in self.ledger.nodes(cluster.id) if n.rank == 0), None)
        iid = str(inst["id"])
        where = country(inst)
        if old is not None and old.instance_id == iid:
            rate = float(old.extra.get("price_per_hour") or plan.price_per_hour)
            plan.price_per_hour = rate  # a resumed up: the node keeps its own price and start
            return
        rate = instance_price(inst) or (pick.price if pick else plan.price_per_hour)
        offer = pick.offer.id if pick else inst.get("ask_id") or "?"
        price = live_price(rate, f"vast offer {offer}", where if where != "?" else None)
        host, port = ssh_direct(inst) or ("", 22)
        meta = {"region": where, "instance_type": plan.instance_type, **price_fields(price), "label": inst.get("label"),
                "offer": offer, "machine_id": inst.get("machine_id"), "interruptible": bool(inst.get("is_bid")),
                "public_ip": host, "ssh_port": port, "ssh_user": opts.ssh_user, "key_file": str(key_path(cluster.id)),
                "proxy_command": opts.ssh_proxy_command}
        self.ledger.put_node(cluster.id, NodeRecord(
            rank=0, status="up", address=host, instance_id=iid,
            ssh=SSHTarget(host=host, port=port, user=opts.ssh_user, identity_file=str(key_path(cluster.id)),
                          proxy_command=opts.ssh_proxy_command),
            launched_at=time.time(), extra=meta))
        plan.region = where if where != "?" else plan.region
        with self.ledger.lock:
            self.store.update_cluster(cluster.id, region=plan.region)
            freeze_price(self.store, cluster, plan, price, self.report)
        write_ssh_config(self.ledger, self.report)

    def _reach(self, spec: ClusterSpec, cluster: Cluster, opts: VastOptions) -> None:
        if opts.wait_ssh:
            wait_ssh(cluster, self.ledger, self.report, host_keys=lambda node: [], host_key_wait_s=0,
                     ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s, max_workers=self.max_workers,
                     key_source="Vast.ai (it publishes none)",
                     hint="check vast.image and vast.ssh_user; `gtrain down` destroys the instance")
        idle_watch(spec, opts, self.runners(cluster), self.report, self.max_workers, cluster=cluster,
                   limits=self.nodes_enforce_limits)

    def _undo(self, cluster: Cluster, made: list[str]) -> None:
        """Destroy what a failed attempt rented (best effort: the first error is the one to report)."""
        try:
            self.teardown.destroy(made, cluster)
        except GtrainError as e:
            self.report.warn(f"could not clean up after the failed attempt: {e.message}")

    # ---- describe / terminate / price / gc ----

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        out: list[NodeStatus] = []
        live = {str(i.get("id")): i for i in self.api.instances()}
        for node in self.store.node_records(cluster.id):
            found = live.get(node.instance_id or "")
            if found is None:
                out.append(NodeStatus(node.rank, "missing", node.address, f"{node.instance_id}: no such instance"))
                continue
            st = status_of(found)
            why = " (outbid: a higher bid took its GPUs)" if st == "preempted" else ""
            out.append(NodeStatus(node.rank, st, node.address,
                                  f"{found.get('label')}: {found.get('actual_status')}{why}"))
        return out

    def find_by_name(self, spec: ClusterSpec, regions: list[str]) -> tuple[str, str | None] | None:
        from gtrain.providers.vast.adopt import find_by_name

        return find_by_name(self, spec, regions)

    def adopt(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, region: str | None) -> None:
        from gtrain.providers.vast.adopt import adopt

        adopt(self, spec, cluster, plan, region)

    def ended_at(self, cluster: Cluster) -> dict[int, float]:
        return {}  # Vast instances enforce no limit: they bill until destroyed

    def terminate(self, cluster: Cluster) -> None:
        known = [n.instance_id for n in self.store.node_records(cluster.id) if n.instance_id]
        left = self.teardown.teardown(cluster.id, cluster, known)
        finish_down(self.ledger, self.report, cluster, left, f"labelled for cluster {cluster.id}",
                    "gtrain gc --provider vast --yes")

    def terminate_node(self, cluster: Cluster, node: NodeRecord) -> None:
        if node.instance_id:
            self.teardown.destroy([node.instance_id], cluster)

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        cost = self.billed_cost(interval, time.time())
        node = next((n for n in self.store.node_records(cluster.id) if n.rank == interval.node_rank), None)
        meta = node.extra if node is not None else cluster.extra
        source = price_label(meta) or price_label(cluster.extra) or "the rate frozen at launch"
        live = bool((meta or {}).get("price_live", cluster.extra.get("price_live")))
        return IntervalCost(round(cost, 6), estimate=not live,
                            note=f"${interval.price_per_hour:g}/h, {source}; bandwidth billed by use not included")

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        """Instances labelled ``gtrain-<cluster id>-<rank>`` that no live cluster owns (in the countries
        ``regions`` only, when given)."""
        return self.teardown.sweep(live_cluster_ids, delete, list(regions) if regions else None)
