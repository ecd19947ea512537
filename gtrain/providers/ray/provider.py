"""The ``ray`` provider: a team's running Ray cluster (KubeRay, Anyscale, a ``ray up`` VM cluster). gtrain does
not start or own it.

``up`` checks, reserving nothing: the Jobs API answers at ``ray.address`` (else ``RAY_ADDRESS``), the cluster's
Ray version, and how many alive Ray nodes offer one node's bundle (``resources.accelerators`` as
``ray.gpu_resource``, ``ray.cpus_per_node`` CPUs). Jobs run through
:class:`~gtrain.providers.ray.backend.RayBackend`. ``down`` stops every Ray job whose metadata names the
cluster. The cost is the time up (from `up` to `down`) x GPUs x ``ray.price_per_gpu_hour``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError, ProviderError
from gtrain.providers.base import IntervalCost, NodeStatus, Plan, Provider
from gtrain.providers.ray.api import RayAPI, check_version, stop_job
from gtrain.providers.ray.options import RayOptions, parse_options

if TYPE_CHECKING:
    from gtrain.jobs.backend import JobBackend
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval
    from gtrain.state.nodes import NodeRecord


class RayProvider(Provider):
    name = "ray"

    # ---- plan / provision --------------------------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        opts = parse_options(spec)
        gpus = spec.resources.gpus_per_node if spec.resources.accelerators else 0
        try:
            where = opts.job_address()
        except ConfigError:
            where = "RAY_ADDRESS (not set)"
        return Plan(
            provider="ray", num_nodes=spec.num_nodes, instance_type=f"bundle:{opts.bundle(gpus)}",
            market="ray", region=where, gpu_name=spec.resources.gpu_name, gpus_per_node=gpus,
            price_per_hour=opts.price_per_gpu_hour * gpus, max_hours=spec.policies.max_hours,
            notes=["reserves nothing at `up`: each launch is one Ray job whose driver places "
                   f"{spec.num_nodes} bundle(s) {opts.bundle(gpus)} ({opts.placement}) (`launch --dry-run` "
                   "prints it)", f"charged ${opts.price_per_gpu_hour}/GPU-hour x GPUs per node, `up` to `down` "
                   "(ray.price_per_gpu_hour)"])

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        opts = parse_options(spec)
        address = opts.job_address()
        version = self.check_cluster(spec, opts, RayAPI(address))
        extra = {**cluster.extra, "ray": {"address": address, "version": version}}
        self.store.update_cluster(cluster.id, extra=extra)
        cluster.extra = extra
        for k in range(spec.num_nodes):
            self.store.upsert_node(cluster.id, k, status="up", address=f"bundle {k}",
                                   instance_id=f"ray:{address}/bundle-{k}", meta={})
        self.report.info(f"Ray cluster at {address} (Ray {version}) recorded: each launch is one Ray job there")

    def check_cluster(self, spec: ClusterSpec, opts: RayOptions, api: RayAPI) -> str:
        """The address answers, the Ray version, the alive nodes that fit one bundle, said plainly."""
        try:
            version = api.version()
        except ProviderError as e:
            if "does not answer" in e.message or "not as a Ray dashboard" in e.message:
                raise ConfigError(e.message + "; nothing was created", hint=e.hint, field="ray.address") from None
            raise
        check_version(version, api.address)
        gpus = spec.resources.gpus_per_node if spec.resources.accelerators else 0
        bundle = opts.bundle(gpus)
        alive = [n for n in api.nodes() if n.get("state") == "ALIVE"]
        fit = [n for n in alive if all(float((n.get("resources_total") or {}).get(r, 0)) >= v
                                       for r, v in bundle.items())]
        said = f"{len(fit)} of {len(alive)} alive Ray node(s) offer {bundle}"
        if opts.placement == "strict_spread" and len(fit) < spec.num_nodes:
            self.report.warn(f"the cluster cannot place the job now: {said}, num_nodes is {spec.num_nodes} (a "
                             f"launch waits up to ray.pending_timeout_s={opts.pending_timeout_s:g} s for "
                             "the autoscaler, then fails)")
        else:
            self.report.info(f"Ray {version}, capacity: {said}")
        return version

    # ---- describe / terminate ----------------------------------------------------------------------

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        address = (cluster.extra.get("ray") or {}).get("address")
        return [NodeStatus(n.rank, "running" if n.status == "up" else n.status, n.address, f"Ray at {address}")
                for n in self.store.nodes(cluster.id)]

    def terminate(self, cluster: Cluster) -> None:
        info = cluster.extra.get("ray") or {}
        if info.get("address"):
            api = RayAPI(str(info["address"]))
            try:
                jobs = api.jobs()
            except ProviderError as e:
                raise ProviderError(f"{e.message} (down stops the cluster's Ray jobs there)", hint=e.hint) from None
            for rj in jobs:
                meta = rj.get("metadata") or {}
                if meta.get("gtrain_cluster") == cluster.id and rj.get("status") not in ("STOPPED", "SUCCEEDED",
                                                                                         "FAILED"):
                    stop_job(api, str(rj.get("submission_id")))
        for res in self.store.resources(cluster.id, live_only=True):
            self.store.mark_resource(res.id, "deleted")

    def runners(self, cluster: Cluster) -> list[Runner]:
        return []  # the Ray nodes are reached only through Ray: checkpoints leave through the job's own output

    def node_records(self, cluster: Cluster) -> list[NodeRecord]:
        return self.store.node_records(cluster.id)

    def job_backend(self, cluster: Cluster) -> JobBackend:
        from gtrain.providers.ray.backend import RayBackend

        return RayBackend(self, cluster)

    # ---- cost --------------------------------------------------------------------------------------

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        from gtrain.spec import Resources

        res = cluster.spec.get("resources") or {}
        r = Resources.model_validate(res)
        gpus = r.gpus_per_node if res.get("accelerators") else 0
        rate = RayOptions.model_validate(cluster.spec.get("ray") or {}).price_per_gpu_hour
        seconds = max(0.0, (interval.stopped_at or time.time()) - interval.started_at)
        gpu_h = seconds * gpus / 3600
        return IntervalCost(round(gpu_h * rate, 6), estimate=True,
                            note=f"{seconds / 3600:.4f} hour(s) up x {gpus} GPU(s) = {gpu_h:.4f} GPU-hour(s) x "
                                 f"${rate}/GPU-hour")
