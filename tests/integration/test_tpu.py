"""Cloud TPU slices through the gcp provider against the session's fake TPU API v2 (tests/fixtures/fake_tpu.py,
at the wire, written from the TPU v2 REST reference): a node or a queued resource, one gtrain node per worker
host, zone failover, PREEMPTED, recreate, down, gc by label. No SSH here (gcp.wait_ssh: false): the end-to-end
test with sshd hosts and JAX is test_tpu_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from gtrain.context import Context
from gtrain.errors import CapacityError, ConfigError
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.runs import cluster as core
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_gce import FakeGCE
from tests.fixtures.fake_tpu import PROJECT, FakeTPU

pytestmark = pytest.mark.usefixtures("fake_tpu")


def spec(name: str, accel: str = "tpu-v4-16", *, resources: dict[str, Any] | None = None, **gcp: Any) -> ClusterSpec:
    return parse_spec({"name": name, "provider": "gcp", "resources": {"accelerators": accel, **(resources or {})},
                       "gcp": {"wait_ssh": False, "poll_s": 0.05, "ssh_cidr": "198.51.100.7/32", **gcp}})


def context() -> Context:
    ctx = Context(store=StateStore())
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report)
    return ctx


def test_node_up_records_each_worker_host_then_down_leaves_nothing(fake_tpu: FakeTPU, fake_gce: FakeGCE) -> None:
    ctx = context()
    res = core.up(spec("tpu-node"), ctx)
    c = res.cluster
    assert c is not None and c.status == "up" and c.num_nodes == 2
    try:
        nodes = ctx.store.node_records(c.id)
        assert [n.rank for n in nodes] == [0, 1]
        assert [n.instance_id for n in nodes] == [f"{c.id}-w0", f"{c.id}-w1"]
        assert all(n.zone == "us-central2-b" and n.address and n.address.startswith("10.130.") for n in nodes)
        assert all(n.ssh is not None and n.ssh.host.startswith("34.1.") for n in nodes)  # external IPs
        node = fake_tpu.nodes[f"projects/{PROJECT}/locations/us-central2-b/nodes/{c.id}"]
        assert node["acceleratorType"] == "v4-16" and node["runtimeVersion"] == "tpu-ubuntu2204-base"
        assert node["labels"]["gtrain-cluster"] == c.id and node["labels"]["gtrain-cluster-name"] == "tpu-node"
        assert node["metadata"]["ssh-keys"].startswith("gtrain:ssh-ed25519 ")
        assert [s.status for s in ctx.provider("gcp").describe(c)] == ["running", "running"]
        assert "health HEALTHY" in ctx.provider("gcp").describe(c)[0].detail
        assert res.plan.price_per_hour == pytest.approx(3.22 * 4)  # per host: $/chip-h x 4 chips
        # the cluster's firewall rules aim at the slice's network tag: 22 from ssh_cidr, all between its workers
        assert node["tags"] == [f"gtrain-{c.id}"]
        assert fake_gce.of_cluster(c.id)["firewall"] == [f"gtrain-{c.id}-int", f"gtrain-{c.id}-ssh"]
    finally:
        down = core.down("tpu-node", ctx)
    # cost: one interval per worker host at $/chip-h x its chips, stored at start; billed with a 1-minute minimum
    assert [(ln.node_rank, ln.instance_type, ln.price_per_hour) for ln in down.cost.lines] == [
        (0, "tpu-v4-16", pytest.approx(12.88)), (1, "tpu-v4-16", pytest.approx(12.88))]
    assert all(ln.cost_usd == pytest.approx(12.88 / 60, abs=1e-5) for ln in down.cost.lines), down.cost.lines
    assert fake_tpu.of_cluster(c.id) == {"node": [], "queuedResource": []}
    assert fake_gce.of_cluster(c.id) == {"instance": [], "firewall": []}  # its firewall rules went too


def test_queued_spot_with_zone_failover_preempted_recreated_and_gc(fake_tpu: FakeTPU) -> None:
    ctx = context()
    fake_tpu.fail_creates("us-east5-a")
    s = spec("tpu-queued", "tpu-v5p-16", resources={"use_spot": True}, queued=True, topology="2x2x2")
    c = core.up(s, ctx).cluster
    assert c is not None
    try:
        assert {n.zone for n in ctx.store.node_records(c.id)} == {"europe-west4-b"}  # us-east5-a: no capacity
        assert fake_tpu.of_cluster(c.id)["queuedResource"] == [
            f"projects/{PROJECT}/locations/europe-west4-b/queuedResources/{c.id}"]  # the failed one was deleted
        qr = fake_tpu.queued[f"projects/{PROJECT}/locations/europe-west4-b/queuedResources/{c.id}"]
        assert "spot" in qr and qr["tpu"]["nodeSpec"][0]["node"]["acceleratorConfig"] == {"type": "V5P",
                                                                                          "topology": "2x2x2"}
        fake_tpu.preempt(c.id)
        got = ctx.provider("gcp").describe(c)
        assert [g.status for g in got] == ["preempted", "preempted"] and "PREEMPTED" in got[0].detail
        ctx.provider("gcp").replace_nodes(c, [0, 1])  # what recovery does: the slice is made again, whole
        assert [g.status for g in ctx.provider("gcp").describe(c)] == ["running", "running"]
        # the state database forgets the cluster: gc finds the slice by its label and deletes it
        # (the TPU part of `gtrain gc --provider gcp`; the whole command runs in test_tpu_e2e.py)
        tpus = ctx.provider("gcp").tpu  # type: ignore[attr-defined]
        found = tpus.gc(PROJECT, set(), delete=False, regions=None)
        assert {(o.kind, o.cluster_id) for o in found.orphans} >= {("tpu-node", c.id), ("tpu-queued-resource", c.id)}
        assert not tpus.gc(PROJECT, {c.id}, delete=False, regions=None).orphans  # a live cluster's are not orphans
        assert tpus.gc(PROJECT, set(), delete=True, regions=["europe-west4"]).deleted
        assert fake_tpu.of_cluster(c.id) == {"node": [], "queuedResource": []}
    finally:
        core.down("tpu-queued", ctx)


def test_no_capacity_anywhere_leaves_nothing(fake_tpu: FakeTPU) -> None:
    ctx = context()
    fake_tpu.fail_creates("us-central2-b")
    with pytest.raises(CapacityError):
        core.up(spec("tpu-nocap", "tpu-v4-8"), ctx)
    assert not [k for k in fake_tpu.nodes if "tpu-nocap" in k]


@pytest.mark.parametrize(("gcp", "field"), [({"runtime_version": "v2-alpha-tpuv6e"}, "gcp.runtime_version"),
                                            ({"topology": "2x2x4"}, "gcp.topology"),
                                            ({"topology": "big"}, "gcp.topology")])
def test_bad_runtime_or_topology_is_refused_before_anything_is_made(fake_tpu: FakeTPU, gcp: dict[str, Any],
                                                                     field: str) -> None:
    before = len(fake_tpu.creates)
    with pytest.raises(ConfigError) as e:
        core.up(spec("tpu-bad", "tpu-v4-16", **gcp), context())
    assert e.value.field == field
    assert len(fake_tpu.creates) == before
