"""``resources.any_of`` across clouds: AWS on the session's moto server (capacity errors injected at the HTTP
edge, as in test_aws.py), GCP on the fake Compute Engine (tests/fixtures/fake_gce.py), Lambda on the fake Lambda
Cloud API (tests/fixtures/fake_lambda.py) and Azure on the fake ARM (tests/fixtures/fake_arm.py). Each cloud is
one row of CLOUDS, with the hook that makes it run out: four candidates, the last one lands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from gtrain.context import Context
from gtrain.errors import CapacityError
from gtrain.providers.aws import TAG_CLUSTER, AWSProvider
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.runs import cluster as core
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_arm import Failure, FakeARM
from tests.fixtures.fake_gce import FakeGCE
from tests.fixtures.fake_lambda import FakeLambda
from tests.integration.test_aws import fail_run_instances

pytestmark = pytest.mark.usefixtures("moto_server", "fake_gce", "fake_lambda", "fake_arm")

SECTIONS = {"aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.2},
            "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05},
            "lambda": {"wait_ssh": False, "poll_s": 0.05},
            "azure": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}}


class Clouds:
    """The providers of one test, and a switch per candidate that takes its capacity away."""

    def __init__(self, fake_gce: FakeGCE, fake_lambda: FakeLambda, fake_arm: FakeARM) -> None:
        self.session = boto3.Session()
        self.gce = fake_gce
        self.lam = fake_lambda
        self.arm = fake_arm
        self.full_aws_zones: set[str] = set()
        fail_run_instances(self.session, "InsufficientInstanceCapacity", lambda z, n: z in self.full_aws_zones)
        self.ctx = Context(store=StateStore())
        self.ctx._providers["aws"] = AWSProvider(self.ctx.store, self.ctx.report, session=self.session)
        self.ctx._providers["gcp"] = GCPProvider(self.ctx.store, self.ctx.report)


#: (candidate, what takes its capacity away); one row per cloud candidate, in the order listed
CLOUDS: list[tuple[dict[str, Any], Callable[[Clouds], None]]] = [
    ({"provider": "aws", "region": "us-east-1", "zones": ["us-east-1a"], "accelerators": "A10G:1"},
     lambda c: c.full_aws_zones.add("us-east-1a")),
    ({"provider": "aws", "region": "us-west-2", "zones": ["us-west-2a"], "accelerators": "A10G:1"},
     lambda c: c.full_aws_zones.add("us-west-2a")),
    ({"provider": "gcp", "region": "us-central1", "zones": ["us-central1-a"], "accelerators": "T4:1"},
     lambda c: c.gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a")),
    ({"provider": "lambda", "region": "us-east-1", "accelerators": "A10:1"},
     lambda c: c.lam.fail.update({"us-east-1": "capacity"})),
    ({"provider": "azure", "region": "eastus", "accelerators": "T4:1"},
     lambda c: c.arm.fail_vms.append(Failure("eastus", "AllocationFailed", "Allocation failed. We do not have "
                                             "sufficient capacity for the requested VM size in this region."))),
]


def spec(name: str, candidates: list[dict[str, Any]], order: str = "listed") -> ClusterSpec:
    providers = {c["provider"] for c in candidates}
    return parse_spec({"name": name, "num_nodes": 2, "policies": {"max_hours": 2},
                       "resources": {"disk_gb": 100, "any_of": candidates, "order": order},
                       **{p: s for p, s in SECTIONS.items() if p in providers}})


def aws_instances(cid: str) -> list[str]:
    out = []
    for region in ("us-east-1", "us-west-2"):
        r = boto3.client("ec2", region_name=region).describe_instances(
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cid]},
                     {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        out += [i["InstanceId"] for x in r["Reservations"] for i in x["Instances"]]
    return out


def test_capacity_errors_move_up_to_the_last_candidate(fake_gce: FakeGCE, fake_lambda: FakeLambda,
        fake_arm: FakeARM) -> None:
    clouds = Clouds(fake_gce, fake_lambda, fake_arm)
    for _cand, run_out in CLOUDS[:-1]:
        run_out(clouds)
    s = spec("anyof-last", [c for c, _ in CLOUDS])
    res = core.up(s, clouds.ctx)
    c = res.cluster
    assert c is not None and c.provider == CLOUDS[-1][0]["provider"] and c.status == "up"
    outcomes = [(x["provider"], x["region"], x["outcome"]) for x in c.extra["any_of"]["candidates"]]
    assert outcomes == [(cand["provider"], cand["region"], "no capacity") for cand, _ in CLOUDS[:-1]] + \
        [(CLOUDS[-1][0]["provider"], CLOUDS[-1][0]["region"], "landed")]
    assert all(x["why"] for x in c.extra["any_of"]["candidates"][:-1])
    # one cluster record whichever candidate it lands on; nothing left where it failed
    assert [x.id for x in clouds.ctx.store.list_clusters(include_terminated=True) if x.name == s.name] == [c.id]
    assert aws_instances(c.id) == []
    assert len(clouds.ctx.store.nodes(c.id)) == 2
    # status and the cost report say where it landed and why the others were passed over
    st = core.status(clouds.ctx, s.name, refresh=False)[0]
    last = CLOUDS[-1][0]["provider"]
    assert st["provider"] == last and [x["outcome"] for x in st["placement"]["candidates"]][-1] == "landed"
    down = core.down(s.name, clouds.ctx)
    assert down.cost.provider == last and down.cost.to_dict()["placement"]["candidates"][0]["outcome"] == \
        "no capacity"
    assert fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}
    assert clouds.lam.of_cluster(c.id) == {"instance": [], "ssh-key": []} and clouds.arm.of_cluster(c.id) == []


def test_no_candidate_has_capacity_lists_every_one_and_leaves_nothing(fake_gce: FakeGCE, fake_lambda: FakeLambda,
        fake_arm: FakeARM) -> None:
    clouds = Clouds(fake_gce, fake_lambda, fake_arm)
    for _cand, run_out in CLOUDS:
        run_out(clouds)
    s = spec("anyof-none", [c for c, _ in CLOUDS])
    with pytest.raises(CapacityError) as ei:
        core.up(s, clouds.ctx)
    assert len(ei.value.attempts) == len(CLOUDS)
    assert all("no capacity" in a for a in ei.value.attempts)
    c = clouds.ctx.store.find_cluster(s.name)
    assert c is not None and c.status == "terminated"
    assert aws_instances(c.id) == [] and fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}
    assert clouds.lam.of_cluster(c.id) == {"instance": [], "ssh-key": []} and clouds.arm.of_cluster(c.id) == []


def test_dry_run_prices_every_candidate_and_picks_the_cheapest(fake_gce: FakeGCE, fake_lambda: FakeLambda,
        fake_arm: FakeARM, tmp_path: Path) -> None:
    clouds = Clouds(fake_gce, fake_lambda, fake_arm)
    s = spec("anyof-price", [c for c, _ in CLOUDS], order="price")
    res = core.up(s, clouds.ctx, dry_run=True)
    assert res.cluster is None and res.placement is not None
    cands = res.placement["candidates"]
    prices = [x["cluster_price_per_hour"] for x in cands]
    assert prices == sorted(prices) and all(p > 0 for p in prices)
    assert cands[0]["outcome"] == "chosen" and "cheapest" in cands[0]["why"]
    assert res.plan.provider == cands[0]["provider"]
    assert res.plan.cluster_price_per_hour == pytest.approx(prices[0])
    assert clouds.ctx.store.find_cluster(s.name) is None  # nothing made, nothing recorded
    # the CLI shows them side by side (offline: plan touches no cloud)
    f = tmp_path / "spec.yaml"
    f.write_text(json.dumps(s.to_yaml_dict()))
    env = {**os.environ, "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-m", "gtrain", "up", str(f), "--dry-run"], capture_output=True, text=True,
                       env=env, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert "candidates (resources.any_of, order: price)" in p.stdout and "chosen" in p.stdout
    for cand, _ in CLOUDS:
        assert cand["region"] in p.stdout
    c = subprocess.run([sys.executable, "-m", "gtrain", "catalog", "--spec", str(f), "--json"], capture_output=True,
                       text=True, env=env, timeout=120, check=False)
    assert c.returncode == 0, c.stderr
    got = json.loads(c.stdout)["placement"]["candidates"]
    assert [(x["label"], x["cluster_price_per_hour"], x["outcome"]) for x in got] == \
        [(x["label"], x["cluster_price_per_hour"], x["outcome"]) for x in cands]


def answer_quota(session: boto3.Session, values: dict[str, float]) -> list[str]:
    """Answer Service Quotas GetServiceQuota with ``values[code]`` (moto serves only VPC quotas), shaped as the
    API reference's Quota object; the codes asked are returned."""
    from botocore.awsrequest import AWSResponse

    asked: list[str] = []

    def hook(params: dict[str, Any], model: Any, **_: Any) -> Any:
        body = json.loads(params.get("body") or b"{}")
        code = body.get("QuotaCode", "")
        asked.append(code)
        http = AWSResponse(params.get("url", ""), 200, {}, None)
        return http, {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": f"quota {code}",
                                "Value": values.get(code, 0.0), "Unit": "None"},
                      "ResponseMetadata": {"HTTPStatusCode": 200}}

    session.events.register("before-call.service-quotas.GetServiceQuota", hook)
    return asked


def test_quota_precheck_skips_aws_and_gcp_before_anything_is_made(fake_gce: FakeGCE, fake_lambda: FakeLambda,
        fake_arm: FakeARM) -> None:
    clouds = Clouds(fake_gce, fake_lambda, fake_arm)
    asked = answer_quota(clouds.session, {})  # every EC2 vCPU quota 0: a new account
    fake_gce.quotas["us-central1"] = {"NVIDIA_T4_GPUS": (4.0, 3.0)}  # 1 of 4 T4s free; 2 asked
    inserts = len(fake_gce.inserts)
    s = spec("anyof-quota", [c for c, _ in CLOUDS[1:]])  # aws us-west-2, gcp, lambda, azure
    res = core.up(s, clouds.ctx)
    c = res.cluster
    assert c is not None and c.provider == "lambda" and c.status == "up"
    cands = c.extra["any_of"]["candidates"]
    assert [(x["provider"], x["outcome"]) for x in cands] == \
        [("aws", "skipped"), ("gcp", "skipped"), ("lambda", "landed"), ("azure", "untried")]
    assert "L-DB2E81BA" in cands[0]["why"] and "0 vCPUs; 8 asked" in cands[0]["why"], cands[0]
    assert "NVIDIA_T4_GPUS in us-central1: 4, 3 in use, 2 GPUs asked" in cands[1]["why"], cands[1]
    assert asked == ["L-DB2E81BA"]  # g5.xlarge: G and VT, on demand
    assert aws_instances(c.id) == [] and len(fake_gce.inserts) == inserts  # nothing made where it was skipped
    core.down(s.name, clouds.ctx)
    assert clouds.lam.of_cluster(c.id) == {"instance": [], "ssh-key": []}
