"""The local provider: nodes are directories under ``$GTRAIN_HOME/clusters/<name>/node-K`` on this
machine, commands run as local subprocesses, torchrun rendezvous over 127.0.0.1 with gloo. $0/h, but
node-hours are still recorded and reported."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gtrain.errors import ConfigError
from gtrain.providers.base import IntervalCost, NodeStatus, Plan, Provider, ProviderCheck
from gtrain.remote.base import Runner
from gtrain.remote.local import LocalRunner
from gtrain.spec import ClusterSpec, volumes
from gtrain.state import Cluster, CostInterval

MAX_LOCAL_NODES = 16


class LocalProvider(Provider):
    name = "local"

    def cluster_dir(self, name: str) -> Path:
        return self.store.home / "clusters" / name

    def plan(self, spec: ClusterSpec) -> Plan:
        if section := spec.section("local"):
            first = next(iter(section))
            raise ConfigError(f"invalid spec: local.{first}: unknown field — the local provider has no options",
                              hint="remove the `local:` section", field=f"local.{first}")
        if spec.num_nodes > MAX_LOCAL_NODES:
            raise ConfigError(
                f"num_nodes: {spec.num_nodes} — the local provider runs at most {MAX_LOCAL_NODES} nodes "
                "on this machine",
                hint="use fewer nodes, or a cloud provider", field="num_nodes",
            )
        if spec.resources.use_spot:
            raise ConfigError("resources.use_spot: true — the local provider has no spot market",
                              hint="remove use_spot, or use provider: aws / gcp", field="resources.use_spot")
        return Plan(
            provider="local", num_nodes=spec.num_nodes, instance_type="local", market="local",
            region=os.uname().nodename, gpu_name=spec.resources.gpu_name, gpus_per_node=spec.resources.gpus_per_node,
            price_per_hour=0.0, max_hours=spec.policies.max_hours,
            notes=["nodes are directories on this machine; training runs on its CPU (gloo) or GPUs",
                   *_unenforced(spec), *volumes.path_notes(spec)],
        )

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        if volumes.path_volumes(spec):  # host folders: checked (nothing made on a refusal), then linked
            self._volumes(spec)
        base = self.cluster_dir(cluster.name)
        for rank in range(spec.num_nodes):
            path = base / f"node-{rank}"
            rid = self.store.record_resource(cluster.id, "node-dir", str(path))
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            (path / "workdir").mkdir(exist_ok=True)
            (path / "jobs").mkdir(exist_ok=True)
            self.store.mark_resource(rid, "created")
            self.store.upsert_node(cluster.id, rank, status="up", address="127.0.0.1", instance_id=str(path))
            self.report.node(rank, f"ready at {path}")

    def _volumes(self, spec: ClusterSpec) -> None:
        import subprocess

        if err := volumes.root_refusal(spec, str(self.store.home.resolve()), "this machine ($GTRAIN_HOME)"):
            raise err
        for link in (False, True):
            r = subprocess.run(["bash", "-c", volumes.path_script(spec, link=link)], capture_output=True, text=True,
                               timeout=60, check=False, stdin=subprocess.DEVNULL)
            if err := volumes.path_refusal(spec, "this machine", r.stdout):
                raise err
            if r.returncode != 0:
                raise ConfigError(f"volumes: could not link the mounts: {r.stderr.strip()[-300:]}", field="volumes")

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        out = []
        for node in self.store.nodes(cluster.id):
            exists = bool(node.instance_id) and os.path.isdir(node.instance_id or "")
            out.append(NodeStatus(node.rank, "running" if exists else "missing", node.address))
        return out

    def terminate(self, cluster: Cluster) -> None:
        for res in self.store.resources(cluster.id, live_only=True):
            self.store.mark_resource(res.id, "deleting")
            shutil.rmtree(res.ref, ignore_errors=True)
            self.store.mark_resource(res.id, "deleted")
        base = self.cluster_dir(cluster.name)
        if base.is_dir() and not any(base.iterdir()):
            base.rmdir()

    def runners(self, cluster: Cluster) -> list[Runner]:
        return [
            LocalRunner(node.instance_id or self.cluster_dir(cluster.name) / f"node-{node.rank}",
                        label=f"node {node.rank}", address=node.address or "127.0.0.1")
            for node in self.store.nodes(cluster.id)
        ]

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        return IntervalCost(0.0, estimate=False, note="local: no charge")


def _unenforced(spec: ClusterSpec) -> list[str]:
    """The plan's word on the limits that only nodes of a cloud hold (they end themselves there)."""
    pol = spec.policies
    given = [f"{k}: {v:g}" for k, v in (("idle_minutes", pol.idle_minutes), ("max_hours", pol.max_hours),
                                         ("max_cost_usd", pol.max_cost_usd)) if v is not None]
    if not given:
        return []
    return [f"policies {', '.join(given)}: not enforced on local (aws and gcp nodes end themselves); "
            "nothing here ends the cluster but `gtrain down`"]


def check(timeout: float) -> ProviderCheck:
    """``gtrain check local``: always usable (folders on this machine); the GPUs ``nvidia-smi -L`` lists."""
    import subprocess

    smi = shutil.which("nvidia-smi")
    gpus = "no nvidia-smi: CPU only (gloo)"
    if smi:
        try:
            p = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=timeout, check=False,
                               stdin=subprocess.DEVNULL)
            gpus = f"{sum(ln.startswith('GPU ') for ln in p.stdout.splitlines())} GPUs (nvidia-smi -L)"
        except (OSError, subprocess.TimeoutExpired) as e:
            gpus = f"nvidia-smi: {type(e).__name__}"
    return ProviderCheck("local", True, f"this machine ({os.cpu_count()} CPUs), nodes as folders",
                         credentials="none needed", call=None, quota=gpus, ssh_key="none: local processes")
