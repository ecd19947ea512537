"""A Cloud TPU slice's health check, instead of nvidia-smi: on every worker host, JAX's own count of its local
devices (``jax.local_device_count()``) against the chips per host of ``resources.accelerators``, and the
platform JAX found (``tpu``; anything else means the TPU runtime, libtpu, is not there). The TPU API's ``health``
field is in ``gtrain status`` (the node's detail)."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

from gtrain.errors import RemoteError
from gtrain.health.model import Check, Verdict
from gtrain.remote.fanout import parallel

if TYPE_CHECKING:
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec

__all__ = ["PROBE", "probe", "tpu_checks", "verdict"]

PROBE = ("import json, jax; d = jax.local_devices(); "
         "print(json.dumps({'count': len(d), 'platform': d[0].platform if d else ''}))")


def tpu_checks(spec: ClusterSpec, runners: list[Runner]) -> list[Check]:
    from gtrain.registry import accelerator_shape

    t = accelerator_shape(spec.resources.accelerators or "")
    python = spec.job.python if spec.job and spec.job.python else None
    return [verdict(t.name, t.chips_per_node, i, got)
            for i, got in enumerate(parallel(lambda r: probe(r, python), runners))]


def probe(r: Runner, python: str | None) -> dict[str, object]:
    """``{"count", "platform"}`` from JAX on the node, or ``{"error"}``."""
    cmd = f"{shlex.quote(python or r.python)} -c {shlex.quote(PROBE)}"
    try:
        res = r.run(cmd, timeout=120, check=False)
    except RemoteError as e:
        return {"error": f"unreachable: {e.message}"}
    lines = res.stdout.strip().splitlines()
    try:
        return dict(json.loads(lines[-1])) if res.rc == 0 and lines else {"error": _last(res.stderr, res.rc)}
    except ValueError:
        return {"error": _last(res.stdout, res.rc)}


def _last(text: str, rc: int) -> str:
    lines = text.strip().splitlines()
    return f"exit {rc}: {lines[-1] if lines else 'no output'}"


def verdict(name: str, want: int, node: int, got: dict[str, object]) -> Check:
    if "error" in got:
        return Check("tpu.chips", Verdict.FAIL, "jax failed", f"`import jax; jax.local_devices()`: {got['error']} "
                     "(is jax[tpu] installed?)", node)
    n, platform = int(str(got["count"])), str(got["platform"])
    if n != want:
        return Check("tpu.chips", Verdict.FAIL, f"{n}/{want}", f"spec asks {name} ({want} chip(s) per host); JAX "
                     f"sees {n} {platform} device(s)", node, dict(got))
    if platform != "tpu":
        return Check("tpu.chips", Verdict.WARN, f"{n}/{want} {platform}", f"JAX sees {n} {platform} device(s), not "
                     "TPU chips: the TPU runtime (libtpu) is missing or JAX_PLATFORMS excludes it", node, dict(got))
    return Check("tpu.chips", Verdict.OK, f"{n}/{want}", f"JAX sees {n} TPU chip(s); spec asks {name}", node, dict(got))
