"""Finding and deleting what a cluster owns in a region, by tag: instances (terminated and waited for), placement
groups, security groups, key pairs, and volumes and interfaces that outlived their instance. A part of
:class:`gtrain.providers.aws.AWSProvider`; used by ``down``, by a failed attempt's clean-up and by ``gtrain gc``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gtrain.errors import ProviderError
from gtrain.providers.aws import api
from gtrain.providers.aws.api import CREDENTIAL_CODES, LIVE_STATES, TAG_CLUSTER

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.state import Cluster


class AWSTeardown:
    """Teardown of one region by tag (:meth:`teardown`) and listing what is tagged (:meth:`list_tagged`)."""

    def __init__(self, clients: api.EC2Clients, ledger: Ledger, report: Reporter) -> None:
        self.clients = clients
        self.ledger = ledger
        self.store = ledger.store
        self.report = report


    def terminate_ids(self, cluster: Cluster | None, region: str, ids: list[str], profile: str | None) -> None:
        if not ids:
            return
        ec2 = self.clients.ec2(region, profile)
        for i in range(0, len(ids), 500):
            try:
                with api.call(f"{region}: terminate_instances"):
                    ec2.terminate_instances(InstanceIds=ids[i:i + 500])
            except ProviderError as e:
                if not api.is_not_found(e):
                    raise
                for iid in ids[i:i + 500]:  # one unknown id fails the whole call: go one by one
                    with contextlib.suppress(ProviderError), api.call(f"{region}: terminate_instances"):
                        ec2.terminate_instances(InstanceIds=[iid])
        self._wait_gone(region, ids, profile)
        if cluster is not None:
            with self.ledger.lock:
                for res in self.store.resources(cluster.id, live_only=True):
                    if res.kind == "instance" and res.ref in ids:
                        self.store.mark_resource(res.id, "deleted")

    def _wait_gone(self, region: str, ids: list[str], profile: str | None, timeout: float = 900.0) -> None:
        ec2 = self.clients.ec2(region, profile)
        deadline = time.monotonic() + timeout
        delay = 0.25
        pending = list(ids)
        while pending:
            alive: list[str] = []
            for i in range(0, len(pending), 200):
                chunk = pending[i:i + 200]
                try:
                    with api.call(f"{region}: describe_instances"):
                        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
                            {"Name": "instance-id", "Values": chunk}])
                        for page in pages:
                            for r in page["Reservations"]:
                                alive += [x["InstanceId"] for x in r["Instances"]
                                          if x["State"]["Name"] != "terminated"]
                except ProviderError as e:
                    if not api.is_not_found(e):
                        raise
            pending = alive
            if not pending:
                return
            if time.monotonic() > deadline:
                raise ProviderError(f"{region}: instances not terminated after {timeout:.0f}s: {', '.join(pending)}")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def teardown(self, region: str, cluster_id: str, profile: str | None, *, known_ids: set[str] | None = None,
                 cluster: Cluster | None = None) -> list[str]:
        """Delete everything tagged ``gtrain:cluster=cluster_id`` in ``region`` (plus ``known_ids``); returns
        what still exists afterwards (empty when clean). Used by ``down`` and ``gtrain gc``."""
        ec2 = self.clients.ec2(region, profile)
        ids = {i["InstanceId"] for i in self.clients.find_instances(region, cluster_id, profile)} | set(known_ids or ())
        if ids:
            self.report.info(f"{region}: terminating {len(ids)} instance(s)")
            self.terminate_ids(cluster, region, sorted(ids), profile)
        name = api.resource_name(cluster_id)
        # placement group (by its deterministic name; the API lists them by tag too)
        pgs = {name}
        with contextlib.suppress(ProviderError):
            pgs |= {p["GroupName"] for p in self._list(ec2, region, "placement-group", cluster_id)}
        for pg in sorted(pgs):
            try:
                with api.call(f"{region}: delete_placement_group {pg}"):
                    ec2.delete_placement_group(GroupName=pg)
            except ProviderError as e:
                if not (api.is_not_found(e)
                        or api.error_code(e) in ("InvalidPlacementGroup.Unknown", "UnreadableResponse")):
                    raise
        # security groups (they can stay "in use" for a while after the instances are gone)
        sgs = {g["GroupId"] for g in self._list(ec2, region, "security-group", cluster_id)}
        with api.call(f"{region}: describe_security_groups"):
            sgs |= {g["GroupId"] for g in ec2.describe_security_groups(
                Filters=[{"Name": "group-name", "Values": [name]}])["SecurityGroups"]}
        for sg in sorted(sgs):
            self._retry_dependency(lambda sg=sg: ec2.delete_security_group(GroupId=sg),  # type: ignore[misc]
                                   f"{region}: delete_security_group {sg}")
        # key pairs
        kps = {k["KeyName"] for k in self._list(ec2, region, "key-pair", cluster_id)}
        with api.call(f"{region}: describe_key_pairs"):
            kps |= {k["KeyName"] for k in ec2.describe_key_pairs(
                Filters=[{"Name": "key-name", "Values": [name]}])["KeyPairs"]}
        for kp in sorted(kps):
            with api.call(f"{region}: delete_key_pair {kp}"):
                ec2.delete_key_pair(KeyName=kp)
        # volumes and interfaces that outlived their instance (DeleteOnTermination off, or detached)
        for v in self._list(ec2, region, "volume", cluster_id):
            if v.get("State") in ("available", "error"):
                self._retry_dependency(lambda v=v: ec2.delete_volume(VolumeId=v["VolumeId"]),  # type: ignore[misc]
                                       f"{region}: delete_volume {v['VolumeId']}")
        for ni in self._list(ec2, region, "network-interface", cluster_id):
            if ni.get("Status") == "available":
                self._retry_dependency(
                    lambda ni=ni: ec2.delete_network_interface(NetworkInterfaceId=ni["NetworkInterfaceId"]),  # type: ignore[misc]
                    f"{region}: delete_network_interface {ni['NetworkInterfaceId']}")
        if cluster is not None:
            with self.ledger.lock:
                for res in self.store.resources(cluster.id, live_only=True):
                    if res.region == region:
                        self.store.mark_resource(res.id, "deleted")
        return [f"{region}: {kind} {ref}" for kind, ref in self.list_tagged(region, cluster_id, profile)]

    def _retry_dependency(self, fn: Callable[[], Any], what: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        delay = 1.0
        while True:
            try:
                with api.call(what):
                    fn()
                return
            except ProviderError as e:
                if api.is_not_found(e):
                    return
                if api.error_code(e) not in ("DependencyViolation", "InvalidVolume.Busy", "IncorrectState") \
                        or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 15.0)

    def _list(self, ec2: Any, region: str, kind: str, cluster_id: str | None) -> list[dict[str, Any]]:
        """Every ``kind`` in ``region`` tagged with the cluster (any gtrain cluster when ``cluster_id`` is None)."""
        flt = ([{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}] if cluster_id
               else [{"Name": "tag-key", "Values": [TAG_CLUSTER]}])
        with api.call(f"{region}: listing {kind}s"):
            if kind == "instance":
                return [i for p in ec2.get_paginator("describe_instances").paginate(
                    Filters=[*flt, {"Name": "instance-state-name", "Values": LIVE_STATES}])
                    for r in p["Reservations"] for i in r["Instances"]]
            if kind == "security-group":
                return [g for p in ec2.get_paginator("describe_security_groups").paginate(Filters=flt)
                        for g in p["SecurityGroups"]]
            if kind == "key-pair":
                return list(ec2.describe_key_pairs(Filters=flt)["KeyPairs"])
            if kind == "placement-group":
                return list(ec2.describe_placement_groups(Filters=flt)["PlacementGroups"])
            if kind == "volume":
                return [v for p in ec2.get_paginator("describe_volumes").paginate(Filters=flt) for v in p["Volumes"]]
            if kind == "network-interface":
                return [n for p in ec2.get_paginator("describe_network_interfaces").paginate(Filters=flt)
                        for n in p["NetworkInterfaces"]]
        raise ValueError(kind)

    RESOURCE_KINDS = ("instance", "volume", "network-interface", "security-group", "key-pair", "placement-group")
    _ID_KEYS = {"instance": "InstanceId", "volume": "VolumeId", "network-interface": "NetworkInterfaceId",
                "security-group": "GroupId", "key-pair": "KeyName", "placement-group": "GroupName"}

    def list_tagged(self, region: str, cluster_id: str | None, profile: str | None = None,
                    on_unlistable: Callable[[str, str], None] | None = None) -> list[tuple[str, str]]:
        """(kind, id) of every live resource in ``region`` tagged with the cluster (or with any cluster)."""
        ec2 = self.clients.ec2(region, profile)
        out: list[tuple[str, str]] = []
        for kind in self.RESOURCE_KINDS:
            try:
                items = self._list(ec2, region, kind, cluster_id)
            except ProviderError as e:
                if kind == "placement-group" and api.error_code(e) not in CREDENTIAL_CODES:
                    if on_unlistable:  # an endpoint without placement groups (moto): say so, go on
                        on_unlistable(kind, e.message)
                    continue
                raise
            for it in items:
                if kind == "volume" and it.get("State") == "deleted":
                    continue
                if kind == "network-interface" and it.get("Status") == "in-use" and it.get("Attachment"):
                    continue  # goes with its instance
                out.append((kind if cluster_id else f"{kind}:{api.tagdict(it).get(TAG_CLUSTER, '?')}",
                            str(it[self._ID_KEYS[kind]])))
        return out
