"""The provider contract: ONE set of tests, run against every provider on its own backend.

local (directories under GTRAIN_HOME), ssh (the session's real sshd hosts), aws (the session's moto server),
gcp (the session's fake Compute Engine) and lambda (the session's fake Lambda Cloud API). Each provider gets a
small :class:`Harness`: ``spec(name, num_nodes)`` builds a spec that backend accepts, ``leftovers(name)`` lists
what the backend still holds for the cluster of that name, ``inventory()`` everything it holds at all. Nothing
of gtrain's is mocked; every step goes through the public API (``gtrain.up/status/down/cost``) and
``gtrain.providers.get_provider``.
"""

from __future__ import annotations

import inspect
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.errors import ClusterNotFound
from gtrain.providers import get_provider, provider_class
from gtrain.providers.base import Plan, Provider
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import Cluster, StateStore

# fake: tests/fake_provider.py, plugged in from outside; kubernetes: tests/fixtures/fake_kube.py
# gcp-tpu: the gcp provider with a Cloud TPU slice (tests/fixtures/fake_tpu.py): its worker hosts are the nodes
PROVIDERS = ["local", "ssh", "aws", "gcp", "gcp-tpu", "lambda", "azure", "fake", "kubernetes"]
AWS_REGION = "us-east-1"
GCP_REGION = "us-central1"
SSH_CIDR = "198.51.100.7/32"  # a documentation address: the clouds' fakes never see a rule open to the world


@dataclass
class Harness:
    provider: str
    spec_fn: Callable[[str, int], ClusterSpec]
    leftovers_fn: Callable[[str], list[str]]
    inventory_fn: Callable[[], set[str]]

    def spec(self, name: str, num_nodes: int) -> ClusterSpec:
        return self.spec_fn(name, num_nodes)

    def leftovers(self, name: str) -> list[str]:
        """What the backend still holds for the cluster called ``name`` (any cluster id ever under that name)."""
        return self.leftovers_fn(name)

    def inventory(self) -> set[str]:
        """Everything the backend holds, of every cluster: a plan must not change it."""
        return self.inventory_fn()


def cluster_ids(name: str) -> set[str]:
    store = StateStore()
    try:
        return {c.id for c in store.list_clusters(include_terminated=True) if c.name == name}
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------- harnesses


def local_harness(home: Path) -> Harness:
    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "local", "num_nodes": n})

    def leftovers(name: str) -> list[str]:
        base = home / "clusters" / name
        return sorted(str(p) for p in base.rglob("*")) + ([str(base)] if base.exists() else [])

    def inventory() -> set[str]:
        base = home / "clusters"
        return {str(p) for p in base.rglob("*")} if base.exists() else set()

    return Harness("local", spec, leftovers, inventory)


def ssh_harness(hosts: Any) -> Harness:
    picked = [hosts[0], hosts[1]]

    def spec(name: str, n: int) -> ClusterSpec:
        section = {
            "user": picked[0].user, "identity_file": picked[0].identity_file, "python": sys.executable,
            "hosts": [f"{h.address}:{h.port}" for h in picked],
            "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in picked},
        }
        return parse_spec({"name": name, "provider": "ssh", "num_nodes": n, "ssh": section})

    def leftovers(name: str) -> list[str]:
        return [f"{h.name}:{d}" for h in picked for d in [h.home / "gtrain" / name] if d.exists()]

    def inventory() -> set[str]:
        return {f"{h.name}:{p}" for h in picked for p in (h.home / "gtrain").glob("*")}

    return Harness("ssh", spec, leftovers, inventory)


def aws_harness() -> Harness:
    import boto3

    from gtrain.providers.aws import TAG_CLUSTER
    from gtrain.providers.aws.api import TAG_CLUSTER_NAME

    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "aws", "num_nodes": n,
                           "resources": {"accelerators": "A10G:1", "region": AWS_REGION, "disk_gb": 100},
                           "policies": {"max_hours": 2},
                           # moto (5.2.x) answers CreatePlacementGroup with an HTTP 500: the provider goes on without
                           # one (it is optional unless asked for) and its ledger row says "not-created"
                           "aws": {"ssh_cidr": SSH_CIDR, "wait_ssh": False, "poll_s": 0.2}})

    def tagged() -> dict[str, dict[str, str]]:
        """kind/id -> tags of every instance (not terminated), security group, key pair and volume."""
        c = boto3.client("ec2", region_name=AWS_REGION)

        def tags(o: dict[str, Any]) -> dict[str, str]:
            return {t["Key"]: t["Value"] for t in o.get("Tags") or []}

        out = {f"instance/{i['InstanceId']}": tags(i) for r in c.describe_instances()["Reservations"]
               for i in r["Instances"] if i["State"]["Name"] != "terminated"}
        out |= {f"security-group/{g['GroupId']}": tags(g) for g in c.describe_security_groups()["SecurityGroups"]
                if g["GroupName"] != "default"}
        out |= {f"key-pair/{k['KeyName']}": tags(k) for k in c.describe_key_pairs()["KeyPairs"]}
        out |= {f"volume/{v['VolumeId']}": tags(v) for v in c.describe_volumes()["Volumes"]}
        return out

    def leftovers(name: str) -> list[str]:
        ids = cluster_ids(name)
        return sorted(k for k, t in tagged().items() if t.get(TAG_CLUSTER_NAME) == name or t.get(TAG_CLUSTER) in ids)

    return Harness("aws", spec, leftovers, lambda: set(tagged()))


def gcp_harness(fake: Any) -> Harness:
    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "gcp", "num_nodes": n,
                           "resources": {"accelerators": "T4:1", "region": GCP_REGION, "disk_gb": 100},
                           "policies": {"max_hours": 2},
                           "gcp": {"ssh_cidr": SSH_CIDR, "wait_ssh": False, "poll_s": 0.05}})

    def leftovers(name: str) -> list[str]:
        ids = cluster_ids(name)
        with fake.lock:
            out = [f"instance/{z}/{n}" for (z, n), i in fake.instances.items()
                   if (i.get("labels") or {}).get("gtrain-cluster-name") == name
                   or (i.get("labels") or {}).get("gtrain-cluster") in ids]
            out += [f"firewall/{n}" for n in fake.firewalls if any(n.startswith(f"gtrain-{cid}-") for cid in ids)]
        return sorted(out)

    def inventory() -> set[str]:
        with fake.lock:
            return {f"instance/{z}/{n}" for z, n in fake.instances} | {f"firewall/{n}" for n in fake.firewalls}

    return Harness("gcp", spec, leftovers, inventory)


def tpu_harness(tpu: Any, gce: Any) -> Harness:
    """A Cloud TPU slice of as many worker hosts as the test asks for nodes (v4-8: 1, v4-16: 2, v4-32: 4), on the
    fake TPU API, with its firewall rules on the fake Compute Engine; policies' limits armed as for a VM."""
    types = {1: "tpu-v4-8", 2: "tpu-v4-16", 4: "tpu-v4-32"}

    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "gcp", "num_nodes": n,
                           "resources": {"accelerators": types[n]}, "policies": {"max_hours": 2},
                           "gcp": {"ssh_cidr": SSH_CIDR, "wait_ssh": False, "poll_s": 0.05}})

    def leftovers(name: str) -> list[str]:
        ids = cluster_ids(name)
        out = [f"{kind}/{r}" for cid in ids for kind, refs in tpu.of_cluster(cid).items() for r in refs]
        with tpu.lock:
            out += [f"node/{k}" for k, n in tpu.nodes.items()
                    if (n.get("labels") or {}).get("gtrain-cluster-name") == name and f"node/{k}" not in out]
        with gce.lock:
            out += [f"firewall/{n}" for n in gce.firewalls if any(n.startswith(f"gtrain-{cid}-") for cid in ids)]
        return sorted(out)

    def inventory() -> set[str]:
        with tpu.lock:
            got = {f"node/{k}" for k in tpu.nodes} | {f"queuedResource/{k}" for k in tpu.queued}
        with gce.lock:
            return got | {f"firewall/{n}" for n in gce.firewalls}

    return Harness("gcp", spec, leftovers, inventory)


def lambda_harness(fake: Any) -> Harness:
    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "lambda", "num_nodes": n,
                           "resources": {"accelerators": "A10:1", "region": "us-east-1"},
                           "lambda": {"wait_ssh": False, "poll_s": 0.05}})

    def leftovers(name: str) -> list[str]:
        ids = cluster_ids(name)
        out: list[str] = []
        for cid in ids:
            owned = fake.of_cluster(cid)
            out += [f"instance/{n}" for n in owned["instance"]] + [f"ssh-key/{n}" for n in owned["ssh-key"]]
        return sorted(out)

    def inventory() -> set[str]:
        with fake.lock:
            return {f"instance/{i}" for i in fake.instances} | {f"ssh-key/{k}" for k in fake.keys}

    return Harness("lambda", spec, leftovers, inventory)


def azure_harness(fake: Any) -> Harness:
    """The fake Azure Resource Manager (tests/fixtures/fake_arm.py): every resource group and what is in it."""

    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "azure", "num_nodes": n,
                           "resources": {"accelerators": "T4:1", "region": "eastus", "disk_gb": 64},
                           "azure": {"ssh_cidr": SSH_CIDR, "wait_ssh": False, "poll_s": 0.05}})

    def leftovers(name: str) -> list[str]:
        ids = cluster_ids(name)
        with fake.lock:
            mine = {k for k, g in fake.groups.items() if g["tags"].get("gtrain-cluster-name") == name
                    or g["tags"].get("gtrain-cluster") in ids}
            out = [f"group/{k}" for k in mine]
            out += [f"{t}/{g}/{n}" for (g, t, n), r in fake.resources.items()
                    if g in mine or r["tags"].get("gtrain-cluster") in ids]
        return sorted(out)

    def inventory() -> set[str]:
        with fake.lock:
            return {f"group/{k}" for k in fake.groups} | {"/".join(k) for k in fake.resources}

    return Harness("azure", spec, leftovers, inventory)


def fake_harness(cloud: Path) -> Harness:
    from tests import fake_provider

    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "fake", "num_nodes": n})

    def leftovers(name: str) -> list[str]:
        return sorted(str(d) for d, t in fake_provider.tagged() if t["name"] == name)

    def inventory() -> set[str]:
        return {str(p) for p in cloud.rglob("*")}

    return Harness("fake", spec, leftovers, inventory)


def kubernetes_harness(kube: Any) -> Harness:
    def spec(name: str, n: int) -> ClusterSpec:
        return parse_spec({"name": name, "provider": "kubernetes", "num_nodes": n, "kubernetes": {"shm_gb": 0}})

    def leftovers(name: str) -> list[str]:
        ids = {cid[:63] for cid in cluster_ids(name)}
        with kube.lock:
            return sorted(f"{p}/{n}" for (p, _, n), o in kube.objects.items()
                          if (o["metadata"].get("labels") or {}).get("gtrain.dev/cluster") in ids)

    def inventory() -> set[str]:
        with kube.lock:
            return {f"{p}/{ns}/{n}" for p, ns, n in kube.objects}

    return Harness("kubernetes", spec, leftovers, inventory)


@pytest.fixture(params=PROVIDERS)
def harness(request: pytest.FixtureRequest, gtrain_home: Path, tmp_path: Path) -> Iterator[Harness]:
    name = request.param
    if name == "fake":
        from tests.fake_provider import installed

        with installed(tmp_path / "fake-cloud"):
            yield fake_harness(tmp_path / "fake-cloud")
    elif name == "local":
        yield local_harness(gtrain_home)
    elif name == "ssh":
        from gtrain.remote import ssh as sshmod

        sshmod.close_all()  # this test's GTRAIN_HOME has its own known_hosts: no pooled connection from before
        yield ssh_harness(request.getfixturevalue("ssh_hosts"))
        sshmod.close_all()
    elif name == "aws":
        request.getfixturevalue("moto_server")
        yield aws_harness()
    elif name == "kubernetes":
        from tests.fixtures.fake_kube import FakeKube

        kube = FakeKube(tmp_path / "kube").start()
        mp = request.getfixturevalue("monkeypatch")
        mp.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig")))
        try:
            yield kubernetes_harness(kube)
        finally:
            kube.stop()
    elif name == "lambda":
        yield lambda_harness(request.getfixturevalue("fake_lambda"))
    elif name == "azure":
        yield azure_harness(request.getfixturevalue("fake_arm"))
    elif name == "gcp-tpu":
        yield tpu_harness(request.getfixturevalue("fake_tpu"), request.getfixturevalue("fake_gce"))
    else:
        yield gcp_harness(request.getfixturevalue("fake_gce"))


def unique(h: Harness) -> str:
    return f"ct-{h.provider}-{uuid.uuid4().hex[:6]}"  # valid everywhere: GCE names and labels included


def ledger(cluster: Cluster) -> list[tuple[str, str, str]]:
    store = StateStore()
    try:
        return [(r.kind, r.ref, r.status) for r in store.resources(cluster.id)]
    finally:
        store.close()


def describe(cluster: Cluster) -> list[tuple[int, str]]:
    store = StateStore()
    try:
        return [(s.rank, s.status) for s in get_provider(cluster.provider, store).describe(cluster)]
    finally:
        store.close()


def runner_addresses(cluster: Cluster) -> list[str]:
    store = StateStore()
    try:
        return [r.address for r in get_provider(cluster.provider, store).runners(cluster)]
    finally:
        store.close()


def reprovision(cluster: Cluster, spec: ClusterSpec, plan: Plan) -> None:
    store = StateStore()
    try:
        get_provider(cluster.provider, store).provision(spec, store.get_cluster_by_id(cluster.id), plan)
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------- the contract


def test_plan_creates_nothing(harness: Harness) -> None:
    name = unique(harness)
    before = harness.inventory()
    res = gtrain.up(harness.spec(name, 2), dry_run=True)
    assert res.cluster is None and not res.created
    plan = res.plan
    assert plan.provider == harness.provider and plan.num_nodes == 2
    assert isinstance(plan.market, str) and plan.market
    assert plan.price_per_hour >= 0 and plan.cluster_price_per_hour >= 0
    assert harness.leftovers(name) == []
    assert harness.inventory() == before, "a dry run changed the backend"
    assert name not in {c["name"] for c in gtrain.status()}
    with pytest.raises(ClusterNotFound):
        gtrain.status(name)


def test_up_idempotent_up_down(harness: Harness) -> None:
    name = unique(harness)
    spec = harness.spec(name, 2)
    res = gtrain.up(spec)
    try:
        cluster = res.cluster
        assert res.created and cluster is not None and cluster.status == "up"

        # up: 2 nodes with addresses, every ledger resource created, each node running as the provider sees it
        st = gtrain.status(name)[0]
        assert st["status"] == "up" and st["num_nodes"] == 2 and st["provider"] == harness.provider
        nodes = st["nodes"]
        assert [n["rank"] for n in nodes] == [0, 1]
        assert all(n["address"] for n in nodes), nodes
        assert all(n["status"] == "running" for n in nodes), nodes
        resources = ledger(cluster)
        assert resources, "provision recorded nothing in the state ledger"
        assert all(status in ("created", "not-created") for _k, _r, status in resources), resources
        assert any(status == "created" for _k, _r, status in resources), resources
        assert describe(cluster) == [(0, "running"), (1, "running")]
        assert harness.leftovers(name), "status says up, but the backend holds nothing for the cluster"

        # runners: one per node, in rank order, at the addresses status shows
        assert runner_addresses(cluster) == [n["address"] for n in nodes]

        # a second up of the same spec: nothing new
        made = sorted(harness.leftovers(name))
        again = gtrain.up(spec)
        assert not again.created and again.cluster is not None and again.cluster.id == cluster.id
        assert [(n["rank"], n["address"]) for n in gtrain.status(name)[0]["nodes"]] == \
            [(n["rank"], n["address"]) for n in nodes]
        assert sorted(harness.leftovers(name)) == made
        assert ledger(cluster) == resources

        # the ABC's provision is idempotent too (an interrupted `up` is resumed through it): run again, it makes
        # nothing new and keeps the nodes where they are
        reprovision(cluster, spec, again.plan)
        assert sorted(harness.leftovers(name)) == made
        assert [(n["rank"], n["address"], n["status"]) for n in gtrain.status(name)[0]["nodes"]] == \
            [(n["rank"], n["address"], n["status"]) for n in nodes]
        assert all(status in ("created", "not-created") for _k, _r, status in ledger(cluster))
    finally:
        down = gtrain.down(name)

    # down: nothing left, every ledger resource deleted, one cost line per node
    assert not down.already_down and down.cost.cluster_id == cluster.id
    assert harness.leftovers(name) == []
    after = ledger(cluster)
    assert after and all(status in ("deleted", "not-created") for _k, _r, status in after), after
    assert any(status == "deleted" for _k, _r, status in after), after
    lines = down.cost.lines
    assert sorted(ln.node_rank for ln in lines) == [0, 1]
    assert all(ln.hours > 0 and ln.cost_usd >= 0 for ln in lines), lines
    history = [r for r in gtrain.cost() if r.cluster_id == cluster.id]
    assert len(history) == 1 and history[0].status == "terminated"
    assert sorted(ln.node_rank for ln in history[0].lines) == [0, 1]
    assert all(ln.hours > 0 and ln.cost_usd >= 0 for ln in history[0].lines)
    assert name not in {c["name"] for c in gtrain.status()}

    # a second down: already down, and still nothing there
    second = gtrain.down(name)
    assert second.already_down
    assert harness.leftovers(name) == []


def test_provider_class_implements_the_abc(harness: Harness) -> None:
    abstract = {"plan", "provision", "describe", "terminate", "runners", "price"}
    assert Provider.__abstractmethods__ == abstract  # the contract this suite checks
    store = StateStore()
    try:
        p = get_provider(harness.provider, store)
    finally:
        store.close()
    cls = type(p)
    assert isinstance(p, Provider) and cls.name == harness.provider
    assert provider_class(harness.provider) is cls
    assert not getattr(cls, "__abstractmethods__", frozenset())
    for m in sorted(abstract):
        impl = getattr(cls, m)
        assert impl is not getattr(Provider, m), f"{cls.__name__}.{m} is the ABC's stub"
        assert list(inspect.signature(impl).parameters) == list(inspect.signature(getattr(Provider, m)).parameters), m


def test_public_cost_is_the_api_function(gtrain_home: Path) -> None:
    """``gtrain.cost`` is the API function even after ``up``/``down`` have imported gtrain's own modules (a
    subpackage named like an API function would replace it on the package when imported)."""
    gtrain.up(parse_spec({"name": "ct-cost-api", "provider": "local", "num_nodes": 1}))
    gtrain.down("ct-cost-api")
    assert callable(gtrain.cost), f"gtrain.cost is {gtrain.cost!r} after up/down"
    assert [r.cluster for r in gtrain.cost()] == ["ct-cost-api"]
