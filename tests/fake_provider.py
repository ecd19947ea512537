"""A provider that lives outside gtrain/: a pretend cloud of directories, plugged in through the
``gtrain.providers`` entry point, as a provider in its own package would be (docs/architecture.md, "Adding a
provider", is this file's walk-through).

The "cloud" is ``$GTRAIN_FAKE_CLOUD/<region>/<instance-id>/``, each instance a directory with a ``tags.json``
(cluster id and name, rank) -- so, like a real cloud, what gtrain made is found again by tag when local state
is gone (``terminate`` and ``gc`` look there, not in state). Instances cost $0.50/h, billed per second with a
60 s minimum; nodes are reached with gtrain's public ``LocalRunner``. The job backend is the default one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from gtrain.errors import CapacityError, ConfigError
from gtrain.providers.base import GCResult, IntervalCost, NodeStatus, Orphan, Plan, Provider
from gtrain.remote.base import Runner
from gtrain.remote.local import LocalRunner
from gtrain.spec import ClusterSpec
from gtrain.state import Cluster, CostInterval
from gtrain.state.nodes import NodeRecord

PRICE = 0.5
REGION = "fake-1"


def cloud() -> Path:
    return Path(os.environ["GTRAIN_FAKE_CLOUD"])


def tagged(cluster_id: str | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every instance of the pretend cloud (of one cluster), with its tags."""
    out = []
    for tags in sorted(cloud().glob("*/*/tags.json")):
        t = json.loads(tags.read_text())
        if cluster_id is None or t["cluster"] == cluster_id:
            out.append((tags.parent, t))
    return out


class FakeProvider(Provider):
    name = "fake"
    billing_minimum_s = 60.0
    confirms_cost = True
    gc_scope: ClassVar[str | None] = "region"

    def plan(self, spec: ClusterSpec) -> Plan:
        if spec.num_nodes > 8:
            raise ConfigError(f"num_nodes: {spec.num_nodes} — the fake cloud has 8 instances", field="num_nodes")
        return Plan(provider=self.name, num_nodes=spec.num_nodes, instance_type="fake.small", market="on-demand",
                    region=REGION, price_per_hour=PRICE, max_hours=spec.policies.max_hours)

    def quota_check(self, spec: ClusterSpec, plan: Plan) -> str | None:
        """The pretend account's instance quota, ``$GTRAIN_FAKE_CLOUD/quota`` (a count), when that file exists."""
        f = cloud() / "quota"
        if f.is_file() and plan.num_nodes > (limit := int(f.read_text())):
            return f"instance quota {limit}, {plan.num_nodes} asked"
        return None

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        have = {t["rank"]: d for d, t in tagged(cluster.id)}
        cap = cloud() / "capacity"  # instances the pretend region can still hold, when that file exists
        missing = [r for r in range(spec.num_nodes) if r not in have]
        if missing and cap.is_file() and len(missing) > int(cap.read_text()):
            raise CapacityError(f"no capacity for {len(missing)} instance(s) in {REGION}", [f"{REGION}: no capacity"])
        for rank in range(spec.num_nodes):
            path = have.get(rank)
            if path is None:
                path = cloud() / REGION / f"i-{uuid.uuid4().hex[:10]}"
                rid = self.store.record_resource(cluster.id, "instance", path.name, region=REGION)
                (path / "root").mkdir(parents=True)
                (path / "tags.json").write_text(json.dumps({"cluster": cluster.id, "name": cluster.name,
                                                            "rank": rank}))
                self.store.mark_resource(rid, "created")
            self.store.put_node(cluster.id, NodeRecord(rank, "up", address="127.0.0.1", instance_id=path.name,
                                                       zone=REGION, root=str(path / "root"), python=sys.executable,
                                                       launched_at=time.time(), extra={"dir": str(path)}))

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        live = {t["rank"] for _d, t in tagged(cluster.id)}
        return [NodeStatus(n.rank, "running" if n.rank in live else "missing", n.address)
                for n in self.node_records(cluster)]

    def terminate(self, cluster: Cluster) -> None:
        for d, _t in tagged(cluster.id):  # by tag: what state forgot goes too
            shutil.rmtree(d)
        for res in self.store.resources(cluster.id, live_only=True):
            self.store.mark_resource(res.id, "deleted")

    def runners(self, cluster: Cluster) -> list[Runner]:
        return [LocalRunner(n.root or "", label=f"node {n.rank}", address=n.address or "127.0.0.1",
                            python=n.python) for n in self.node_records(cluster)]

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        return IntervalCost(round(self.billed_cost(interval, time.time()), 6), note=f"fake ${PRICE}/h")

    def gc(self, regions: list[str] | None, live_cluster_ids: set[str], delete: bool,
           **options: str | None) -> GCResult:
        res = GCResult(regions or [REGION])
        for d, t in tagged():
            if t["cluster"] not in live_cluster_ids and d.parent.name in res.regions:
                res.orphans.append(Orphan(d.parent.name, t["cluster"], "instance", d.name))
        if delete:
            for o in res.orphans:
                shutil.rmtree(cloud() / o.region / o.id)
            res.deleted = bool(res.orphans)
        return res


@contextlib.contextmanager
def installed(cloud_dir: Path) -> Iterator[Path]:
    """Install this provider the way a plug-in package is installed: a ``*.dist-info`` with an
    ``entry_points.txt`` naming it under ``gtrain.providers``, on ``sys.path`` (and ``PYTHONPATH``, for the
    CLI in subprocesses). Yields the site folder."""
    import importlib

    import gtrain.providers as reg
    from gtrain import registry

    site = Path(tempfile.mkdtemp(prefix="gtrain-fake-plugin-"))
    dist = site / "gtrain_fake_provider-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gtrain-fake-provider\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gtrain.providers]\nfake = tests.fake_provider:FakeProvider\n")
    repo = str(Path(__file__).resolve().parent.parent)  # so `tests.fake_provider` imports in subprocesses
    cloud_dir.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "GTRAIN_FAKE_CLOUD")}
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), repo, saved["PYTHONPATH"]) if p)
    os.environ["GTRAIN_FAKE_CLOUD"] = str(cloud_dir)
    importlib.invalidate_caches()
    registry._entry_points.cache_clear()
    reg.provider_class.cache_clear()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        registry._entry_points.cache_clear()
        reg.provider_class.cache_clear()
        shutil.rmtree(site, ignore_errors=True)
