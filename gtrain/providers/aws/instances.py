"""Launching a cluster's nodes in one zone and waiting for them: one ``RunInstances`` per node, in parallel, each
with a ``ClientToken`` kept in the resource ledger before the call (a retried or resumed ``up`` gets the same
instance back instead of a second one); waiting for ``running``; recording the nodes; waiting for SSH with the
host keys read from the console output. Mixed into :class:`gtrain.providers.aws.AWSProvider`."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gtrain.errors import CapacityError, GtrainError, ProviderError, QuotaError
from gtrain.providers.aws import api
from gtrain.providers.aws.api import TAG_RANK, AWSBase
from gtrain.providers.common import key_path, wait_ssh

if TYPE_CHECKING:
    from gtrain.providers.aws.network import Region
    from gtrain.providers.aws.options import AWSOptions
    from gtrain.providers.base import Plan
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

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


class AWSInstances(AWSBase):
    """The nodes of a cluster in one zone: create (idempotently), wait for running, record, wait for SSH."""

    def _tokens(self, cluster: Cluster, ranks: list[int], region: str, zone: str) -> dict[int, tuple[str, int]]:
        """The ClientToken (and ledger row) of each node's RunInstances in this zone, recorded before the call.
        A row still 'creating' (a crash between the request and its answer) is reused, so AWS answers with the
        instance it made then instead of making a second one."""
        out: dict[int, tuple[str, int]] = {}
        with self._store_lock:
            for res in self.store.resources(cluster.id, live_only=True):
                m = res.meta
                if res.kind == "instance" and res.status == "creating" and m.get("rank") in ranks \
                        and m.get("zone") == zone and res.region == region:
                    out[int(m["rank"])] = (str(m["token"]), res.id)
            for rank in ranks:
                if rank not in out:
                    token = uuid.uuid4().hex
                    out[rank] = (token, self.store.record_resource(
                        cluster.id, "instance", f"token:{token}", region=region,
                        meta={"rank": rank, "zone": zone, "token": token}))
        return out

    def _launch_zone(self, spec: ClusterSpec, cluster: Cluster, opts: AWSOptions, reg: Region, zone: str,
                     itype: str, efa: bool, existing: dict[int, dict[str, Any]], made: list[str]
                     ) -> dict[int, dict[str, Any]]:
        ec2 = self.ec2(reg.name, opts.profile)
        missing = [r for r in range(spec.num_nodes) if r not in existing]
        if missing:
            self.report.info(f"{reg.name}/{zone}: creating {len(missing)} {itype} node(s)"
                             + (f" ({len(existing)} already there)" if existing else ""))
        made_lock = threading.Lock()
        tokens = self._tokens(cluster, missing, reg.name, zone)

        def one(rank: int) -> dict[str, Any]:
            token, rid = tokens[rank]
            tags = self._base_tags(cluster, opts, f"{cluster.name}-{rank}")
            tags[TAG_RANK] = str(rank)
            nic: dict[str, Any] = {"DeviceIndex": 0, "Groups": [reg.sg_id], "SubnetId": reg.subnets[zone],
                                   "AssociatePublicIpAddress": True, "DeleteOnTermination": True}
            if efa:
                nic["InterfaceType"] = "efa"
            params: dict[str, Any] = dict(
                ImageId=reg.image_id, InstanceType=itype, MinCount=1, MaxCount=1, KeyName=reg.key_name,
                ClientToken=token, NetworkInterfaces=[nic],
                Placement={"AvailabilityZone": zone, **({"GroupName": reg.pg_name} if reg.pg_name else {})},
                BlockDeviceMappings=[{"DeviceName": reg.root_device, "Ebs": {
                    "VolumeSize": spec.resources.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": True,
                    "Encrypted": True}}],
                TagSpecifications=[{"ResourceType": rt, "Tags": api.tags(tags)}
                                   for rt in ("instance", "volume", "network-interface")],
                MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
                InstanceInitiatedShutdownBehavior="terminate",
            )
            if spec.resources.use_spot:
                params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                    "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
            if opts.instance_profile:
                key = "Arn" if opts.instance_profile.startswith("arn:") else "Name"
                params["IamInstanceProfile"] = {key: opts.instance_profile}
            try:
                with api.call(f"run_instances ({itype}, {zone})"):
                    inst = ec2.run_instances(**params)["Instances"][0]
            except GtrainError:
                self._mark(rid, "not-created")
                raise
            with made_lock:
                made.append(inst["InstanceId"])
            self._mark(rid, "created", ref=inst["InstanceId"])
            self.report.node(rank, f"{inst['InstanceId']} requested in {zone}")
            return inst

        new: dict[int, dict[str, Any]] = {}
        if missing:
            errors: list[BaseException] = []
            with ThreadPoolExecutor(min(self._max_workers, len(missing))) as pool:
                futs = {rank: pool.submit(one, rank) for rank in missing}
                for rank, f in futs.items():
                    try:
                        new[rank] = f.result()
                    except BaseException as e:  # noqa: BLE001 - the first error is raised below
                        errors.append(e)
            if errors:
                caps = [e for e in errors if isinstance(e, CapacityError | QuotaError)]
                raise (caps[0] if caps else errors[0])
        ids = {rank: inst["InstanceId"] for rank, inst in {**existing, **new}.items()}
        return self._wait_running(reg.name, opts, ids)

    def _wait_running(self, region: str, opts: AWSOptions, ids: dict[int, str],
                      timeout: float = 900.0) -> dict[int, dict[str, Any]]:
        ec2 = self.ec2(region, opts.profile)
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
                        cap.code = code  # type: ignore[attr-defined]
                        raise cap
                    raise ProviderError(msg)
            if len(by_id) == len(ids) and all(i["State"]["Name"] == "running" for i in by_id.values()):
                return {rank_of[iid]: inst for iid, inst in by_id.items()}
            if time.monotonic() > deadline:
                raise ProviderError(f"{region}: nodes not running after {timeout:.0f}s: "
                                    + ", ".join(f"{i} {s}" for i, s in seen.items()))
            time.sleep(delay)
            delay = min(delay * 2, opts.poll_s)

    def _record_nodes(self, spec: ClusterSpec, cluster: Cluster, plan: Plan, opts: AWSOptions, reg: Region,
                      zone: str, nodes: dict[int, dict[str, Any]], od_price: float, spot_price: float) -> None:
        market = "spot" if spec.resources.use_spot else "on-demand"
        price = spot_price if spec.resources.use_spot else od_price
        for rank, inst in sorted(nodes.items()):
            meta = {
                "launched_at": api.epoch(inst.get("LaunchTime") or time.time()), "region": reg.name, "zone": zone,
                "market": market, "instance_type": inst["InstanceType"], "price_ondemand": od_price,
                "price_spot_catalog": spot_price, "disk_gb": spec.resources.disk_gb,
                "private_ip": inst.get("PrivateIpAddress"), "public_ip": inst.get("PublicIpAddress"),
                "lifecycle": inst.get("InstanceLifecycle") or "normal", "ssh_user": opts.ssh_user,
                "key_file": str(key_path(cluster.id)), "proxy_command": opts.ssh_proxy_command,
            }
            meta["ssh"] = dataclasses.asdict(self._target(meta, inst["InstanceId"]))
            with self._store_lock:
                self.store.upsert_node(cluster.id, rank, status="up", address=inst.get("PrivateIpAddress"),
                                       instance_id=inst["InstanceId"], zone=zone, meta=meta)
        # the region/zone that had capacity may not be the plan's first choice: the plan and the cluster say
        # where the nodes are and what they cost (core opens the cost intervals from this plan)
        plan.region, plan.zone, plan.price_per_hour = reg.name, zone, price
        with self._store_lock:
            self.store.update_cluster(cluster.id, region=reg.name, price_per_hour=price)
        self._write_ssh_config()

    # ---- ssh ----

    def _target(self, node_meta: dict[str, Any], instance_id: str) -> Any:
        from gtrain.remote.ssh import SSHTarget

        proxy = node_meta.get("proxy_command")
        host = instance_id if proxy else (node_meta.get("public_ip") or node_meta.get("private_ip") or "")
        return SSHTarget(host=host, port=22, user=node_meta.get("ssh_user") or "ubuntu",
                         identity_file=node_meta.get("key_file"), proxy_command=proxy)

    def _wait_ssh(self, cluster: Cluster, opts: AWSOptions) -> None:
        nodes = self.store.nodes(cluster.id)
        region = nodes[0].meta.get("region") if nodes else cluster.region
        ec2 = self.ec2(region or "", opts.profile)
        wait_ssh(cluster, self.store, self.report, self._store_lock,
                 host_keys=lambda node: self._console_keys(ec2, node.instance_id or ""),
                 host_key_wait_s=opts.host_key_wait_s, ssh_timeout_s=opts.ssh_timeout_s, poll_s=opts.poll_s,
                 max_workers=self._max_workers, key_source="the console output",
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
