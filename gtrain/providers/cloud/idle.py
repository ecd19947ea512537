"""``policies.idle_minutes`` on a cloud: a watcher started detached on every node (``nodeside.idle_watch``)
runs the section's ``idle_command`` once the node has had no gtrain job process and no interactive SSH login
for that long. The nodes hold the policy themselves, with no laptop and no gtrain process left."""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.options import CloudOptions
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec

IDLE_PIDFILE = "~/.gtrain-idle-watch.pid"


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
               max_workers: int) -> None:
    """The last step of a cloud ``up``: the idle watch, when the spec asks for one and SSH was waited for."""
    minutes = spec.policies.idle_minutes
    if not minutes:
        return
    if not opts.wait_ssh:
        report.warn("policies.idle_minutes needs SSH to the nodes to start their idle watch, and "
                    f"{spec.provider}.wait_ssh is false: it is not enforced on this cluster")
        return
    start_idle_watch(runners, minutes, opts.idle_command, report, max_workers, cluster=spec.name)
