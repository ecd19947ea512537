"""``policies.idle_minutes`` on a cloud: a watcher started detached on every node (``nodeside.idle_watch``)
runs the section's ``idle_command`` once the node has had no gtrain job process and no interactive SSH login
for that long. The nodes hold the policy themselves, with no laptop and no gtrain process left."""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gtrain.notify.nodestart import PIDFILE

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.options import CloudOptions
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

IDLE_PIDFILE = PIDFILE  # one watcher per node


def start_idle_watch(runners: list[Runner], idle_minutes: float, command: list[str], report: Reporter,
                     max_workers: int = 16, cluster: str | None = None) -> None:
    """Start the watcher on every node (one per node: starting it again is a no-op). With ``cluster``, only that
    cluster's job processes (``GTRAIN_CLUSTER`` in their environment) keep the node busy."""
    from gtrain.remote.base import nodeside_source

    idle_s = max(1, int(idle_minutes * 60))
    poll_s = max(1, min(30, idle_s // 4))
    src = nodeside_source().encode()

    def one(r: Runner) -> None:
        args = [r.python, "-", "idle_watch", str(idle_s), str(poll_s), IDLE_PIDFILE, *command]
        env = f"GTRAIN_IDLE_CLUSTER={shlex.quote(cluster)} " if cluster else ""
        r.start_detached(env + " ".join(map(shlex.quote, args)) + ' >>"$HOME/.gtrain-idle-watch.log" 2>&1',
                         stdin=src)

    with ThreadPoolExecutor(min(max_workers, max(1, len(runners)))) as pool:
        for f in [pool.submit(one, r) for r in runners]:
            f.result()
    report.info(f"idle watch on {len(runners)} node(s): `{' '.join(command)}` after {idle_minutes:g} min with "
                "no job and no SSH login (policies.idle_minutes)")


def idle_watch(spec: ClusterSpec, opts: CloudOptions, runners: list[Runner], report: Reporter,
               max_workers: int, cluster: Cluster | None = None, ranks: list[int] | None = None,
               ends_in: dict[int, int] | None = None, limits: bool = False) -> None:
    """The last step of a cloud ``up`` (and ``start``): the idle watch, when the spec asks for one and SSH was
    waited for. With ``notify:`` targets the nodes can reach (webhook, e-mail), rank 0's watcher also sends
    ``idle_stopped`` / ``budget_80`` / ``budget_reached`` itself (:mod:`gtrain.notify.nodewatch`). ``ranks``:
    the nodes' ranks (default 0..); ``ends_in``: seconds left of each node's lifetime (default: counted from
    the cluster's creation); ``limits``: the nodes end themselves at their lifetime (the provider's
    ``nodes_enforce_limits``: only then does the node send the budget events)."""
    from gtrain.notify.nodestart import start, wanted
    from gtrain.providers.cloud.lifetime import cluster_lifetime_s

    minutes = spec.policies.idle_minutes
    life = cluster_lifetime_s(cluster) if cluster is not None and limits else None
    sends = bool(wanted(spec)) and cluster is not None and bool(minutes or life)
    if not minutes and not sends:
        return
    if not opts.wait_ssh:
        report.warn("policies.idle_minutes and the nodes' own notify: need SSH to the nodes to start their watch, "
                    f"and {spec.provider}.wait_ssh is false: neither is on for this cluster")
        return
    ranks = list(range(len(runners))) if ranks is None else ranks
    if sends and 0 in ranks and cluster is not None:
        import time

        age = max(0.0, time.time() - cluster.created_at)
        # `start` says what is left where it re-arms the lifetime; where it does not, no budget event is sent
        left = ends_in.get(0) if ends_in is not None else (None if life is None else int(life - age))
        idle_s = max(1, int(minutes * 60)) if minutes else None
        start(runners[ranks.index(0)], spec, report, idle_s=idle_s, poll_s=max(1, min(30, (idle_s or 120) // 4)),
              command=list(opts.idle_command), life_s=life, ends_in_s=left,
              usd_per_h=(cluster.price_per_hour or 0) * cluster.num_nodes or None, age_s=age)
        runners = [r for r, k in zip(runners, ranks, strict=True) if k != 0]
    if minutes and runners:
        start_idle_watch(runners, minutes, opts.idle_command, report, max_workers, cluster=spec.name)
