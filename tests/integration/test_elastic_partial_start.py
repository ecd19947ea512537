"""An elastic cluster (``num_nodes: {min, max}``) starts on the capacity there is on gcp, azure and lambda, as on aws
(test_elastic_aws_grow.py): each cloud's fake refuses the second node with that cloud's own capacity answer
(GCE's ZONE_RESOURCE_POOL_EXHAUSTED, ARM's AllocationFailed, Lambda's insufficient-capacity), ``up`` keeps the
node that came and says which one is pending and why; the growth the watcher runs (gtrain.runs.elastic.grow, what
the Replacer calls, with the job's part on the new node -- ``join`` -- recorded instead of started over SSH) is
refused while there is no capacity and makes node 1 once there is. Below min, ``up`` fails with the capacity
error and leaves nothing in the fake. Nodes are not reached over SSH (``wait_ssh: false``); one worker per
provider, so the fake sees the nodes in rank order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gtrain.context import Context
from gtrain.errors import CapacityError
from gtrain.events import Reporter
from gtrain.providers.azure import AzureProvider
from gtrain.providers.base import Provider
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.providers.lambda_cloud import LambdaProvider
from gtrain.runs import cluster as core
from gtrain.runs import elastic
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_arm import Failure, FakeARM
from tests.fixtures.fake_gce import FakeGCE
from tests.fixtures.fake_lambda import FakeLambda

pytestmark = pytest.mark.usefixtures("gtrain_home")


class Said(Reporter):
    """What gtrain said (info and warnings)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)

    def warn(self, msg: str) -> None:
        self.lines.append(msg)


def _ctx(make: Callable[[StateStore, Reporter], Provider], name: str) -> tuple[Context, Said]:
    said = Said()
    ctx = Context(store=StateStore(), report=said)
    ctx._providers[name] = make(ctx.store, ctx.report)
    return ctx, said


def _spec(provider: str, name: str, lo: int, hi: int) -> ClusterSpec:
    res: dict[str, Any] = {
        "gcp": {"accelerators": "T4:1", "region": "us-central1", "zones": ["us-central1-a"], "disk_gb": 50},
        "azure": {"accelerators": "T4:1", "region": "eastus", "disk_gb": 64},
        "lambda": {"accelerators": "A10:1", "region": "us-east-1"},
    }[provider]
    opts: dict[str, Any] = {"wait_ssh": False, "poll_s": 0.05}
    if provider != "lambda":
        opts["ssh_cidr"] = "198.51.100.7/32"
    return parse_spec({"name": name, "provider": provider, "num_nodes": {"min": lo, "max": hi},
                       "resources": res, provider: opts})


def _starts_on_one_then_grows(ctx: Context, said: Said, spec: ClusterSpec, refusal: str, live: Callable[[], int],
                              capacity_back: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """``up`` of {min: 1, max: 2} with capacity for one node, then the growth: refused, then node 1 joins."""
    res = core.up(spec, ctx)
    c = res.cluster
    assert c is not None and c.status == "up" and c.num_nodes == 1, said.lines
    assert [n.rank for n in ctx.store.node_records(c.id)] == [0]
    assert live() == 1
    pending = [x for x in said.lines if "node(s) 1 pending, 1 of 2 made (num_nodes.min 1): " in x]
    assert pending and refusal in pending[0], said.lines
    assert any("1 of 2 node(s) now" in x for x in said.lines), said.lines
    assert {i.node_rank for i in ctx.store.intervals(c.id)} == {0}

    joined: list[list[int]] = []
    monkeypatch.setattr(elastic, "join", lambda _c, _job, _ctx, nodes: joined.append(list(nodes)))
    job = ctx.store.create_job(c.id, "job-grow", {"elastic": {"min": 1, "max": 2, "mode": "torchrun"},
                                                   "num_nodes": 1, "nproc_per_node": 1})
    assert elastic.grow(c, job, ctx) == []  # still no capacity: the job trains on one node, tried again later
    grow_info = ctx.store.get_job(job.id).info["elastic_grow"]
    assert grow_info["tries"] == 1 and refusal in grow_info["last_error"], grow_info
    assert ctx.store.get_cluster_by_id(c.id).num_nodes == 1 and live() == 1 and not joined

    capacity_back()
    assert elastic.grow(c, ctx.store.get_job(job.id), ctx) == [1]
    assert joined == [[1]]
    c = ctx.store.get_cluster_by_id(c.id)
    assert c.num_nodes == 2 and [n.rank for n in ctx.store.node_records(c.id)] == [0, 1]
    assert live() == 2
    info = ctx.store.get_job(job.id).info
    assert "elastic_grow" not in info and [int(x[1]) for x in info["world_sizes"]] == [1, 2]
    assert {i.node_rank for i in ctx.store.intervals(c.id) if i.stopped_at is None} == {0, 1}
    # no job ran there: `down` has none to stop and no logs to keep from the (unreachable) nodes
    ctx.store.update_job(job.id, status="succeeded", exit_code=0)
    monkeypatch.setattr("gtrain.runlog.archive.archive_cluster", lambda _ctx, _cluster: None)
    core.down(spec.name, ctx)
    assert live() == 0


def _below_min_fails(ctx: Context, spec: ClusterSpec, refusal: str, left: Callable[[], bool]) -> None:
    """``up`` of {min: 2, max: 3} with capacity for one node: the capacity error, and nothing left."""
    with pytest.raises(CapacityError) as e:
        core.up(spec, ctx)
    assert refusal in str(e.value), e.value
    c = ctx.store.find_cluster(spec.name)
    assert c is not None and c.status == "terminated"
    assert all(r.status in ("deleted", "not-created") for r in ctx.store.resources(c.id))
    assert left(), "the fake still holds something of the cluster"


# ---------------------------------------------------------------------------------------------------- gcp


def _gce_live(fake: FakeGCE, ctx: Context, name: str) -> Callable[[], int]:
    def live() -> int:
        c = ctx.store.find_cluster(name)
        return len(fake.of_cluster(c.id)["instance"]) if c is not None else 0
    return live


def test_gcp_starts_on_min_and_grows(fake_gce: FakeGCE, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, said = _ctx(lambda store, report: GCPProvider(store, report, max_workers=1), "gcp")
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", after=1)  # room for one node
    _starts_on_one_then_grows(ctx, said, _spec("gcp", "el-gcp", 1, 2), "ZONE_RESOURCE_POOL_EXHAUSTED",
                              _gce_live(fake_gce, ctx, "el-gcp"), fake_gce.reset_failures, monkeypatch)
    c = ctx.store.find_cluster("el-gcp")
    assert c is not None and fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}


def test_gcp_below_min_fails_and_leaves_nothing(fake_gce: FakeGCE) -> None:
    ctx, _ = _ctx(lambda store, report: GCPProvider(store, report, max_workers=1), "gcp")
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", after=1)

    def left() -> bool:
        c = ctx.store.find_cluster("el-gcp-min")
        return c is not None and fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}

    _below_min_fails(ctx, _spec("gcp", "el-gcp-min", 2, 3), "ZONE_RESOURCE_POOL_EXHAUSTED", left)


def test_gcp_node_made_past_a_refused_one_is_deleted(fake_gce: FakeGCE, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks stay 0..n-1: node 2, made after node 1 was refused, is deleted and pending with it."""
    ctx, said = _ctx(lambda store, report: GCPProvider(store, report, max_workers=1), "gcp")
    real = fake_gce._insert

    def only_node_1_refused(zone: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        if not body["name"].endswith("-1"):
            return real(zone, body, request_id)
        fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", zone)
        try:
            return real(zone, body, request_id)
        finally:
            fake_gce.failures.clear()

    monkeypatch.setattr(fake_gce, "_insert", only_node_1_refused)
    c = core.up(_spec("gcp", "el-gcp-gap", 1, 3), ctx).cluster
    assert c is not None and c.num_nodes == 1, said.lines
    assert fake_gce.of_cluster(c.id)["instance"] == [f"{c.id}-0"]
    assert any("node(s) 1, 2 pending, 1 of 3 made" in x for x in said.lines), said.lines
    assert {r.meta.get("rank") for r in ctx.store.resources(c.id, live_only=True) if r.kind == "instance"} == {0}
    core.down("el-gcp-gap", ctx)
    assert fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}


# -------------------------------------------------------------------------------------------------- azure

ALLOCATION = "Allocation failed. We do not have sufficient capacity for the requested VM size in this region."


def _arm_vms(fake: FakeARM) -> int:
    with fake.lock:
        return sum(1 for (_, t, _n) in fake.resources if t == "virtualmachines")


def test_azure_starts_on_min_and_grows(fake_arm: FakeARM, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, said = _ctx(lambda store, report: AzureProvider(store, report, max_workers=1), "azure")
    fake_arm.fail_vms.append(Failure("eastus", "AllocationFailed", ALLOCATION, as_op=True, after=1))
    _starts_on_one_then_grows(ctx, said, _spec("azure", "el-az", 1, 2), "AllocationFailed",
                              lambda: _arm_vms(fake_arm), fake_arm.fail_vms.clear, monkeypatch)
    with fake_arm.lock:
        assert fake_arm.groups == {} and fake_arm.resources == {}


def test_azure_refused_node_leaves_no_address_behind(fake_arm: FakeARM) -> None:
    """The refused node's NIC and public IP (made before its VM) go with it: only node 0's remain."""
    ctx, said = _ctx(lambda store, report: AzureProvider(store, report, max_workers=1), "azure")
    fake_arm.fail_vms.append(Failure("eastus", "AllocationFailed", ALLOCATION, after=1))  # the PUT's own answer
    c = core.up(_spec("azure", "el-az-ip", 1, 2), ctx).cluster
    assert c is not None and c.num_nodes == 1, said.lines
    with fake_arm.lock:
        names = sorted(n for (_, t, n) in fake_arm.resources
                       if t in ("networkinterfaces", "publicipaddresses", "virtualmachines"))
    assert names == [f"{c.id}-0", f"{c.id}-0-ip", f"{c.id}-0-nic"]
    core.down("el-az-ip", ctx)
    with fake_arm.lock:
        assert fake_arm.groups == {}


def test_azure_below_min_fails_and_leaves_nothing(fake_arm: FakeARM) -> None:
    ctx, _ = _ctx(lambda store, report: AzureProvider(store, report, max_workers=1), "azure")
    fake_arm.fail_vms.append(Failure("eastus", "AllocationFailed", ALLOCATION, as_op=True, after=1))

    def left() -> bool:
        with fake_arm.lock:
            return fake_arm.groups == {} and fake_arm.resources == {}

    _below_min_fails(ctx, _spec("azure", "el-az-min", 2, 3), "AllocationFailed", left)


# ------------------------------------------------------------------------------------------------- lambda


def _lambda_live(fake: FakeLambda, ctx: Context, name: str) -> Callable[[], int]:
    def live() -> int:
        c = ctx.store.find_cluster(name)
        if c is None:
            return 0
        return len(fake.of_cluster(c.id)["instance"])
    return live


def test_lambda_starts_on_min_and_grows(fake_lambda: FakeLambda, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, said = _ctx(lambda store, report: LambdaProvider(store, report), "lambda")
    fake_lambda.fail["us-east-1"] = "capacity"
    fake_lambda.fail_after["us-east-1"] = 1  # room for one launch

    def capacity_back() -> None:
        fake_lambda.fail.clear()

    _starts_on_one_then_grows(ctx, said, _spec("lambda", "el-lam", 1, 2), "insufficient-capacity",
                              _lambda_live(fake_lambda, ctx, "el-lam"), capacity_back, monkeypatch)


def test_lambda_below_min_fails_and_leaves_nothing(fake_lambda: FakeLambda) -> None:
    ctx, _ = _ctx(lambda store, report: LambdaProvider(store, report), "lambda")
    fake_lambda.fail["us-east-1"] = "capacity"
    fake_lambda.fail_after["us-east-1"] = 1

    def left() -> bool:
        c = ctx.store.find_cluster("el-lam-min")
        return c is not None and fake_lambda.of_cluster(c.id) == {"instance": [], "ssh-key": []}

    _below_min_fails(ctx, _spec("lambda", "el-lam-min", 2, 3), "insufficient-capacity", left)


def test_a_fixed_cluster_is_still_all_or_nothing(fake_gce: FakeGCE) -> None:
    """A plain num_nodes: the same refusal fails ``up`` as before (no pending node)."""
    ctx, said = _ctx(lambda store, report: GCPProvider(store, report, max_workers=1), "gcp")
    fake_gce.fail_inserts("ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", after=1)
    s = parse_spec({"name": "el-fixed", "provider": "gcp", "num_nodes": 2,
                    "resources": {"accelerators": "T4:1", "region": "us-central1", "zones": ["us-central1-a"],
                                  "disk_gb": 50},
                    "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})
    with pytest.raises(CapacityError):
        core.up(s, ctx)
    assert not any("pending" in x for x in said.lines), said.lines
    c = ctx.store.find_cluster("el-fixed")
    assert c is not None and fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}


def test_which_nodes_a_partial_start_keeps() -> None:
    """The rule all three share (gtrain.providers.base.partial_start): aws's MinCount, ranks 0..n-1, and only for
    capacity or quota answers, never for a replacement's rank."""
    from gtrain.errors import ProviderError, QuotaError
    from gtrain.providers.base import partial_start

    cap = CapacityError("ZONE_RESOURCE_POOL_EXHAUSTED: no room")
    el = _spec("gcp", "rule", 2, 4)
    assert partial_start(el, [], [0, 1], {2: cap, 3: cap}) is not None
    got = partial_start(el, [], [0, 1, 3], {2: cap})  # rank 3 came past the refused rank 2: deleted, pending
    assert got is not None and (got.keep, got.drop, got.pending) == ([0, 1], [3], [2, 3])
    assert got.why == "ZONE_RESOURCE_POOL_EXHAUSTED: no room"
    assert partial_start(el, [], [0], {1: cap, 2: cap, 3: cap}) is None  # below min
    assert partial_start(el, [], [1, 2], {0: cap, 3: cap}) is None  # rank 0 refused: nothing before the gap
    grown = partial_start(el, [0, 1], [2], {3: QuotaError("quota")})  # growth: one more is enough
    assert grown is not None and (grown.keep, grown.pending) == ([2], [3])
    assert partial_start(el, [0, 1], [], {2: cap, 3: cap}) is None  # growth that made nothing: still no capacity
    assert partial_start(el, [0], [1], {2: cap, 3: cap}, required={3}) is None  # a recorded node is replaced whole
    assert partial_start(el, [], [0, 1], {2: ProviderError("bad request"), 3: cap}) is None  # other errors fail
    fixed = parse_spec({"name": "rule", "provider": "gcp", "num_nodes": 4,
                        "resources": {"accelerators": "T4:1", "region": "us-central1"}})
    assert partial_start(fixed, [], [0, 1, 2], {3: cap}) is None
