"""Launching a cluster's nodes in one zone and waiting for them: ONE ``RunInstances`` for every missing node
(``MinCount = MaxCount = n``: all of them or none, as AWS advises for a cluster placement group, and no
instance made and billed in a zone that cannot hold the whole cluster), with a ``ClientToken`` kept in the
resource ledger before the call (a retried or resumed ``up`` gets the same instances back instead of a second
batch); ranks follow ``AmiLaunchIndex`` and are tagged (``Name=<cluster>-<rank>``, ``gtrain:rank``) on each
instance, its volumes and interfaces once they run; instances a crash left without a rank are adopted by the
next ``up``. Then recording the nodes and waiting for SSH with the host keys read from the console output.
A part of :class:`gtrain.providers.aws.AWSProvider`."""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gtrain.errors import CapacityError, GtrainError, ProviderError
from gtrain.providers.aws import api
from gtrain.providers.aws.api import TAG_RANK
from gtrain.providers.cloud.errors import with_code
from gtrain.providers.cloud.keys import key_path
from gtrain.providers.cloud.lifetime import node_lifetime_s
from gtrain.providers.cloud.ssh_access import wait_ssh, write_ssh_config

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.aws.network import Region
    from gtrain.providers.aws.options import AWSOptions
    from gtrain.providers.base import Plan
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster
    from gtrain.state.sshtarget import SSHTarget

def shutdown_user_data(seconds: int) -> str:
    """cloud-init user data that powers the node off ``seconds`` after boot (rounded up to whole minutes, as
    ``shutdown`` takes them); with InstanceInitiatedShutdownBehavior=terminate AWS then terminates it."""
    minutes = max(1, -(-seconds // 60))
    return ("#!/bin/bash\n"
            f"# gtrain: policies.max_hours / max_cost_usd: this node terminates itself after {minutes} min\n"
            f"shutdown -h +{minutes} 'gtrain: the cluster reached its time or cost limit'\n")


HOST_KEYS_RE = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S)


def host_keys_from_console(text: str) -> list[str]:
    """``keytype base64`` lines cloud-init prints between the SSH HOST KEY KEYS markers."""
    out: list[str] = []
    for block in HOST_KEYS_RE.findall(text or ""):
        for line in block.splitlines():
            parts = line.split()
            if len(parts) >= 2 and (parts[0].startswith("ssh-") or parts[0].startswith("ecdsa-")):
                out.append(f"{parts[0]} {parts[1]}")
    return out


class AWSInstances:
    """The nodes of a cluster in one zone: create (idempotently), wait for running, record, wait for SSH."""

    def __init__(self, clients: api.EC2Clients, ledger: Ledger, report: Reporter, max_workers: int) -> None:
        self.clients = clients
        self.ledger = ledger
        self.store = ledger.store
        self.report = report
        self.max_workers = max_workers
        self._efa_cache: dict[tuple[str, str], int] = {}


    def _batch_token(self, cluster: Cluster, ranks: list[int], region: str, zone: str) -> tuple[str, list[int]]:
        """The ClientToken of this zone's RunInstances for ``ranks`` and the ledger rows (one per rank) recorded
        before the call. Rows still 'creating' for exactly these ranks (a crash between the request and its
        answer) give their token back, so AWS answers with the instances it made then; other leftovers of an
        earlier batch are closed."""
        with self.ledger.lock:
            creating = [res for res in self.store.resources(cluster.id, live_only=True)
                        if res.kind == "instance" and res.status == "creating" and res.region == region]
            same = [res for res in creating if res.meta.get("zone") == zone and res.meta.get("rank") in ranks]
            tokens = {str(res.meta.get("token")) for res in same}
            if len(tokens) == 1 and sorted(int(res.meta["rank"]) for res in same) == sorted(ranks) and \
                    all(res.meta.get("batch") == ranks for res in same):
                by_rank = {int(res.meta["rank"]): res.id for res in same}
                return tokens.pop(), [by_rank[r] for r in ranks]
            for res in creating:
                self.store.mark_resource(res.id, "not-created")
            token = uuid.uuid4().hex
            rids = [self.store.record_resource(cluster.id, "instance", f"token:{token}#{rank}", region=region,
                                               meta={"rank": rank, "zone": zone, "token": token, "batch": ranks})
                    for rank in ranks]
            return token, rids

    def launch_zone(self, spec: ClusterSpec, cluster: Cluster, opts: AWSOptions, reg: Region, zone: str,
                     itype: str, efa: bool, existing: dict[int, dict[str, Any]], made: list[str], *,
                     in_group: bool = True) -> dict[int, dict[str, Any]]:
        """Make the missing ranks in ``zone`` and wait until every node runs. ``in_group=False``: an elastic
        cluster's node in another zone than the others' (growth or replacement after the cluster's zone refused
        for capacity), launched without the cluster placement group, which cannot span zones."""
        ec2 = self.clients.ec2(reg.name, opts.profile)
        missing = [r for r in range(spec.num_nodes) if r not in existing]
        new: dict[int, dict[str, Any]] = {}
        if missing:
            self.report.info(f"{reg.name}/{zone}: creating {len(missing)} {itype} node(s)"
                             + (f" ({len(existing)} already there)" if existing else "")
                             + ("" if in_group or not reg.pg_name else
                                f", outside placement group {reg.pg_name} (it is in the other nodes' zone)"))
            token, rids = self._batch_token(cluster, missing, reg.name, zone)
            # the cluster's tags now; each node's rank and Name once it runs (they differ per instance)
            tags = api.base_tags(cluster, opts, f"{cluster.name}-pending")
            # all or nothing, except an elastic run (num_nodes: {min, max}): EC2 makes as many as it can, at least
            # what brings the cluster to min ("it launches as many as possible up to the maximum")
            least = max(1, (spec.min_nodes or spec.num_nodes) - len(existing)) if spec.elastic else len(missing)
            params: dict[str, Any] = dict(
                ImageId=reg.image_id, InstanceType=itype, MinCount=least, MaxCount=len(missing),
                KeyName=reg.key_name, ClientToken=token,
                NetworkInterfaces=self._nics(ec2, reg, zone, itype, efa, opts),
                Placement={"AvailabilityZone": zone,
                           **({"GroupName": reg.pg_name} if reg.pg_name and in_group else {})},
                BlockDeviceMappings=[{"DeviceName": reg.root_device, "Ebs": {
                    "VolumeSize": spec.resources.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": True,
                    "Encrypted": True}}],
                TagSpecifications=[{"ResourceType": rt, "Tags": api.tags(tags)}
                                   for rt in ("instance", "volume", "network-interface")],
                MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
                InstanceInitiatedShutdownBehavior="terminate",
            )
            life = node_lifetime_s(spec.policies, spec.num_nodes, cluster.price_per_hour or None, cluster)
            if life is not None:  # the node ends itself: shutdown from inside = terminate (set above)
                params["UserData"] = shutdown_user_data(life)
                if spec.resources.use_spot and spec.policies.max_cost_usd:
                    from gtrain.providers.aws.pricing import budget_watch_user_data, node_budget_usd

                    # the node re-prices its spot $/h and stops before its share of max_cost_usd is spent
                    budget = node_budget_usd(spec.policies, spec.num_nodes, cluster.price_per_hour, cluster)
                    if budget is not None:
                        params["UserData"] += budget_watch_user_data(
                            budget, cluster.price_per_hour, str(cluster.extra.get("price_source") or "frozen at up"),
                            reg.name, zone, itype)
            if spec.resources.use_spot:
                params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                    "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
            if opts.instance_profile:
                key = "Arn" if opts.instance_profile.startswith("arn:") else "Name"
                params["IamInstanceProfile"] = {key: opts.instance_profile}
            try:
                with api.call(f"run_instances ({len(missing)} x {itype}, {zone})"):
                    insts = ec2.run_instances(**params)["Instances"]
            except GtrainError:
                for rid in rids:
                    self.ledger.mark(rid, "not-created")
                raise
            insts.sort(key=lambda i: int(i.get("AmiLaunchIndex", 0)))
            made.extend(i["InstanceId"] for i in insts)
            if not least <= len(insts) <= len(missing):  # MinCount..MaxCount; never guess ranks
                raise ProviderError(f"{zone}: asked for {least} to {len(missing)} instances, AWS made {len(insts)}")
            if len(insts) < len(missing):  # elastic: the lowest missing ranks are made, the rest join later
                self.report.warn(f"{zone}: capacity for {len(insts)} of {len(missing)} {itype} node(s) now")
                for rid in rids[len(insts):]:
                    self.ledger.mark(rid, "not-created")
            for rank, rid, inst in zip(missing, rids, insts, strict=False):
                self.ledger.mark(rid, "created", ref=inst["InstanceId"])
                self.report.node(rank, f"{inst['InstanceId']} requested in {zone}")
                new[rank] = inst
        ids = {rank: inst["InstanceId"] for rank, inst in {**existing, **new}.items()}
        running = self._wait_running(reg.name, opts, ids)
        untagged = set(new) | {rank for rank, inst in existing.items() if TAG_RANK not in api.tagdict(inst)}
        self._tag_ranks(ec2, cluster, {rank: running[rank] for rank in sorted(untagged)})
        return running

    def _efa_cards(self, ec2: Any, region: str, itype: str) -> int:
        """How many EFA interfaces the type takes, one per network card (p4d: 4, p5: 32), as EC2 says."""
        key = (region, itype)
        if key not in self._efa_cache:
            try:
                with api.call(f"{region}: describe_instance_types {itype}"):
                    info = ec2.describe_instance_types(InstanceTypes=[itype])["InstanceTypes"][0]["NetworkInfo"]
                cards = min(int((info.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 1),
                            int(info.get("MaximumNetworkCards") or 1)) if info.get("EfaSupported") else 1
            except (ProviderError, IndexError, KeyError):
                cards = 1  # the catalog said EFA: at least the one on card 0
            self._efa_cache[key] = max(1, cards)
        return self._efa_cache[key]

    def _nics(self, ec2: Any, reg: Region, zone: str, itype: str, efa: bool, opts: AWSOptions) -> list[dict[str, Any]]:
        """The node's network interfaces. With EFA on a type with several network cards, one EFA per card (the
        type's whole inter-node bandwidth) when the nodes are reached through ``ssh_proxy_command``: AWS gives
        no public IPv4 address to an instance launched with more than one interface. Otherwise one interface,
        with a public address (and EFA on card 0 where asked)."""
        base: dict[str, Any] = {"Groups": [reg.sg_id], "SubnetId": reg.subnets[zone], "DeleteOnTermination": True}
        cards = self._efa_cards(ec2, reg.name, itype) if efa else 1
        if cards > 1 and opts.ssh_proxy_command:
            return [{**base, "NetworkCardIndex": i, "DeviceIndex": 0 if i == 0 else 1, "InterfaceType": "efa"}
                    for i in range(cards)]
        if cards > 1:
            self.report.warn(f"{itype} has {cards} EFA network cards; with a public address only the one on card 0 "
                             "is attached. Set aws.ssh_proxy_command (e.g. SSM) to reach private nodes and get all "
                             f"{cards}")
        nic: dict[str, Any] = {**base, "DeviceIndex": 0, "AssociatePublicIpAddress": True}
        if efa:
            nic["InterfaceType"] = "efa"
        return [nic]

    def _tag_ranks(self, ec2: Any, cluster: Cluster, nodes: dict[int, dict[str, Any]]) -> None:
        """``Name=<cluster>-<rank>`` and ``gtrain:rank`` on each node's instance, volumes and interfaces: one
        CreateTags per node (the values differ), in parallel."""
        def one(rank: int) -> None:
            inst = nodes[rank]
            ids = [inst["InstanceId"]]
            ids += [b["Ebs"]["VolumeId"] for b in inst.get("BlockDeviceMappings") or [] if b.get("Ebs")]
            ids += [n["NetworkInterfaceId"] for n in inst.get("NetworkInterfaces") or []]
            with api.call(f"create_tags {inst['InstanceId']}"):
                ec2.create_tags(Resources=ids, Tags=api.tags({"Name": f"{cluster.name}-{rank}", TAG_RANK: str(rank)}))
            inst.setdefault("Tags", [])
            inst["Tags"] = [t for t in inst["Tags"] if t.get("Key") not in ("Name", TAG_RANK)] + api.tags(
                {"Name": f"{cluster.name}-{rank}", TAG_RANK: str(rank)})

        if not nodes:
            return
        with ThreadPoolExecutor(min(self.max_workers, len(nodes))) as pool:
            for f in [pool.submit(one, rank) for rank in sorted(nodes)]:
                f.result()

    @staticmethod
    def adopt(spec: ClusterSpec, unranked: list[dict[str, Any]], existing: dict[int, dict[str, Any]]) -> list[str]:
        """Instances a crashed ``up`` made but did not get to tag with a rank take the missing ranks (tagged
        once they run). Returns the ids of any beyond what the cluster needs, for the caller to terminate."""
        missing = [r for r in range(spec.num_nodes) if r not in existing]
        unranked = sorted(unranked, key=lambda i: (str(i.get("LaunchTime") or ""), int(i.get("AmiLaunchIndex", 0))))
        existing.update(zip(missing, unranked, strict=False))
        return [i["InstanceId"] for i in unranked[len(missing):]]

    def _wait_running(self, region: str, opts: AWSOptions, ids: dict[int, str],
                      timeout: float = 900.0) -> dict[int, dict[str, Any]]:
        ec2 = self.clients.ec2(region, opts.profile)
        deadline = time.monotonic() + timeout
        delay = min(0.5, opts.poll_s)
        seen: dict[str, str] = {}
        rank_of = {iid: rank for rank, iid in ids.items()}
        while True:
            try:
                with api.call(f"{region}: describe_instances"):
                    insts = [i for r in ec2.describe_instances(InstanceIds=list(ids.values()))["Reservations"]
                             for i in r["Instances"]]
            except ProviderError as e:
                if not api.is_not_found(e):  # a just-made instance can be invisible for a moment
                    raise
                insts = []
            by_id = {i["InstanceId"]: i for i in insts}
            for iid, inst in by_id.items():
                st = inst["State"]["Name"]
                if seen.get(iid) != st:
                    seen[iid] = st
                    self.report.node(rank_of[iid], f"{iid} {st}")
                if st in ("shutting-down", "terminated", "stopping", "stopped"):
                    reason = inst.get("StateReason", {})
                    code = str(reason.get("Code", ""))
                    msg = f"{iid} went {st} while starting: {reason.get('Message') or code or 'no reason given'}"
                    if "Capacity" in code or "Spot" in code or "Insufficient" in code:
                        cap = CapacityError(msg)
                        with_code(cap, code)
                        raise cap
                    raise ProviderError(msg)
            if len(by_id) == len(ids) and all(i["State"]["Name"] == "running" for i in by_id.values()):
                return {rank_of[iid]: inst for iid, inst in by_id.items()}
            if time.monotonic() > deadline:
                raise ProviderError(f"{region}: nodes not running after {timeout:.0f}s: "
                                    + ", ".join(f"{i} {s}" for i, s in seen.items()))
            time.sleep(delay)
            delay = min(delay * 2, opts.poll_s)

    def record_nodes(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: AWSOptions, reg: Region,
                     zone: str, nodes: dict[int, dict[str, Any]], od_price: float, spot_price: float, *,
                     home: str | None = None) -> None:
        """Record ``nodes``, each in its own zone. ``home``: the zone of the nodes that were already there (an
        elastic cluster's node 0); a node elsewhere is noted as outside the placement group."""
        from gtrain.state.nodes import NodeRecord

        market = "spot" if spec.resources.use_spot else "on-demand"
        price = spot_price if spec.resources.use_spot else od_price
        home = home or zone
        moved: list[int] = []
        for rank, inst in sorted(nodes.items()):
            at = str((inst.get("Placement") or {}).get("AvailabilityZone") or zone)
            extra = {
                "region": reg.name, "zone": at,
                "market": market, "instance_type": inst["InstanceType"], "price_ondemand": od_price,
                "price_spot_catalog": spot_price, "disk_gb": spec.resources.disk_gb,
                "private_ip": inst.get("PrivateIpAddress"), "public_ip": inst.get("PublicIpAddress"),
                "lifecycle": inst.get("InstanceLifecycle") or "normal", "ssh_user": opts.ssh_user,
                "key_file": str(key_path(cluster.id)), "proxy_command": opts.ssh_proxy_command,
                "placement_group": reg.pg_name if at == home else None,
            }
            if at != home:
                if at == zone:
                    moved.append(rank)
                extra["note"] = (f"in {at}, not {home} with the cluster's other nodes ({home} had no capacity): "
                                 "no cluster placement group (it cannot span zones); its traffic to them crosses "
                                 "zones (same VPC and security group)")
            self.ledger.put_node(cluster.id, NodeRecord(
                rank=rank, status="up", address=inst.get("PrivateIpAddress"), instance_id=inst["InstanceId"],
                zone=at, ssh=ssh_target(extra, inst["InstanceId"]),
                launched_at=api.epoch(inst.get("LaunchTime") or time.time()), extra=extra))
        if moved:  # this call's zone is not the others'
            self.report.warn(f"node(s) {', '.join(map(str, moved))} in {zone}, not {home} (no capacity there): "
                             "same VPC and security group, outside the cluster placement group; their traffic to "
                             "the other nodes crosses zones (slower, billed per GB)")
        # the region/zone that had capacity may not be the plan's first choice: the plan and the cluster say
        # where the nodes are and what they cost (core opens the cost intervals from this plan)
        plan.region, plan.zone, plan.price_per_hour = reg.name, home, price
        with self.ledger.lock:
            self.store.update_cluster(cluster.id, region=reg.name, price_per_hour=price)
        write_ssh_config(self.ledger, self.report)

    # ---- ssh ----

    def wait_ssh(self, cluster: Cluster, opts: AWSOptions) -> None:
        nodes = self.ledger.nodes(cluster.id)
        region = nodes[0].extra.get("region") if nodes else cluster.region
        ec2 = self.clients.ec2(region or "", opts.profile)
        wait_ssh(cluster, self.ledger, self.report,
                 host_keys=lambda node: self._console_keys(ec2, node.instance_id or ""),
                 host_key_wait_s=opts.host_key_wait_s, ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s,
                 max_workers=self.max_workers, key_source="the console output",
                 hint="check aws.ssh_cidr / aws.ssh_proxy_command; `gtrain down` removes them")

    def _console_keys(self, ec2: Any, iid: str) -> list[str]:
        for latest in (True, False):
            try:
                with api.call("get_console_output"):
                    out = ec2.get_console_output(InstanceId=iid, **({"Latest": True} if latest else {}))
            except ProviderError:
                continue
            keys = host_keys_from_console(str(out.get("Output") or ""))
            if keys:
                return keys
            return []
        return []


def ssh_target(extra: dict[str, Any], instance_id: str) -> SSHTarget:
    """How gtrain reaches an instance: its public address (private without one), or the instance id through
    ``aws.ssh_proxy_command`` (SSM)."""
    from gtrain.state.sshtarget import SSHTarget

    proxy = extra.get("proxy_command")
    host = instance_id if proxy else (extra.get("public_ip") or extra.get("private_ip") or "")
    return SSHTarget(host=host, port=22, user=extra.get("ssh_user") or "ubuntu",
                     identity_file=extra.get("key_file"), proxy_command=proxy)
