"""``policies.max_hours`` / ``max_cost_usd`` / ``idle_minutes`` on a Cloud TPU slice, enforced by the slice itself.

The TPU API has no ``maxRunDuration`` (GCE's way, gtrain.providers.gcp), and a worker that powers off (the
idle command of GCE VMs) does not end a slice, which bills until it is deleted. So ``up`` arms worker 0 with
what the clouds' nodes run (gtrain.providers.cloud): the time/cost lifetime as the detached ``sleep N && exec
CMD`` of ``lifetime.rearm`` (N: what is left of the run's budget, ``node_lifetime_s``), and the idle watch
(``nodeside.idle_watch`` via ``cloud.idle.start_idle_watch``), where CMD is :mod:`.selfdelete`: worker 0 deletes
the slice (its queued resource, then its node) through the TPU API with the VM's own credentials (a token from
the metadata server). Nothing here needs the laptop once ``up`` returns. docs/providers/tpu.md."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from gtrain.providers.cloud.idle import start_idle_watch
from gtrain.providers.gcp.tpu.api import DEFAULT_ENDPOINT, ENDPOINT_ENV

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.gcp.options import GCPOptions
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec

__all__ = ["METADATA_ENV", "REMOTE", "arm", "delete_command"]

SCRIPT = Path(__file__).with_name("selfdelete.py")
#: where worker 0 keeps the script (its home: the slice's own disk, gone with it)
REMOTE = ".gtrain-tpu-self-delete.py"
#: the metadata server worker 0 asks for its token (an override for tests and emulators, as on the nodes'
#: preemption-notice poll); default GCE's
METADATA_ENV = "GTRAIN_GCE_METADATA_ENDPOINT"
LIFETIME_LOG = ".gtrain-lifetime.log"


def delete_command(python: str, node: str, queued: str | None) -> list[str]:
    """What worker 0 runs to delete the slice: the TPU API endpoint gtrain uses, the metadata server, the names."""
    endpoint = os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT
    metadata = os.environ.get(METADATA_ENV) or "http://metadata.google.internal"
    return [python, f"$HOME/{REMOTE}", endpoint, metadata, node, queued or "-"]


def arm(spec: ClusterSpec, opts: GCPOptions, worker0: Runner, node: str, queued: str | None,
        life_s: int | None, report: Reporter) -> None:
    """Arm worker 0 (after SSH was waited for) with the slice's time/cost lifetime and idle watch."""
    idle = spec.policies.idle_minutes
    if life_s is None and not idle:
        return
    if not opts.wait_ssh:
        report.warn("policies' time/cost/idle limits on a TPU slice are enforced by its worker 0, over SSH, and "
                    "gcp.wait_ssh is false: they are not enforced on this cluster (`gtrain down` deletes it)")
        return
    worker0.run(f"umask 077 && cat > \"$HOME/{REMOTE}\"", stdin=SCRIPT.read_bytes(), timeout=60)
    cmd = delete_command(worker0.python, node, queued)
    line = " ".join(shlex.quote(c) if not c.startswith("$HOME/") else f'"{c}"' for c in cmd)
    if life_s is not None:
        sleeper = f"sleep {life_s} && exec {line}"
        worker0.start_detached(f"sh -c {shlex.quote(sleeper)}" + f' >>"$HOME/{LIFETIME_LOG}" 2>&1')
        report.info(f"time limit: worker 0 deletes the slice {life_s / 3600:.2f} h after it started (policies."
                    "max_hours / max_cost_usd), through the TPU API with its own credentials")
    if idle:
        start_idle_watch([worker0], idle, ["sh", "-c", f"exec {line}"], report, cluster=spec.name)
