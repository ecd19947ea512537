"""Stopping and starting a cluster's EC2 instances (``gtrain stop`` / ``gtrain start``): ``StopInstances`` keeps
the EBS root volume (still billed per GB-month) and ends the compute bill; ``StartInstances`` brings the same
instance back, usually with a new public IPv4 address (the private one is kept). Both are waited on with
``DescribeInstances`` until every instance is ``stopped`` / ``running``. A part of
:class:`gtrain.providers.aws.AWSProvider`. AWS references: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/
API_StopInstances.html and API_StartInstances.html; https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Stop_Start.html
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gtrain.errors import ProviderError
from gtrain.providers.aws import api

if TYPE_CHECKING:
    from gtrain.events import Reporter


class AWSPower:
    """Stop / start instances of one region and wait for the state asked."""

    def __init__(self, clients: api.EC2Clients, report: Reporter) -> None:
        self.clients = clients
        self.report = report

    def stop(self, region: str, profile: str | None, ranks: dict[int, str], poll_s: float = 2.0) -> None:
        ec2 = self.clients.ec2(region, profile)
        with api.call(f"{region}: stop_instances"):
            ec2.stop_instances(InstanceIds=sorted(ranks.values()))
        self._wait(region, profile, ranks, "stopped", poll_s)

    def start(self, region: str, profile: str | None, ranks: dict[int, str],
              poll_s: float = 2.0) -> dict[int, dict[str, Any]]:
        ec2 = self.clients.ec2(region, profile)
        with api.call(f"{region}: start_instances"):
            ec2.start_instances(InstanceIds=sorted(ranks.values()))
        return self._wait(region, profile, ranks, "running", poll_s)

    def _wait(self, region: str, profile: str | None, ranks: dict[int, str], want: str, poll_s: float,
              timeout: float = 900.0) -> dict[int, dict[str, Any]]:
        ec2 = self.clients.ec2(region, profile)
        rank_of = {iid: rank for rank, iid in ranks.items()}
        seen: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        delay = min(0.5, poll_s)
        while True:
            with api.call(f"{region}: describe_instances"):
                insts = [i for r in ec2.describe_instances(InstanceIds=list(ranks.values()))["Reservations"]
                         for i in r["Instances"]]
            for inst in insts:
                iid, st = inst["InstanceId"], inst["State"]["Name"]
                if seen.get(iid) != st:
                    seen[iid] = st
                    self.report.node(rank_of[iid], f"{iid} {st}")
                if st in ("shutting-down", "terminated"):
                    raise ProviderError(f"{iid} is {st}: it cannot be {want} again",
                                        hint="`gtrain down` ends the cluster; `gtrain up` makes a new one")
            if len(insts) == len(ranks) and all(seen.get(i) == want for i in ranks.values()):
                return {rank_of[i["InstanceId"]]: i for i in insts}
            if time.monotonic() > deadline:
                raise ProviderError(f"{region}: nodes not {want} after {timeout:.0f}s: "
                                    + ", ".join(f"{i} {s}" for i, s in seen.items()))
            time.sleep(delay)
            delay = min(delay * 2, poll_s)
