"""``gtrain attach NAME --provider slurm``: a cluster's record rebuilt on a machine that never ran its ``up``.

The spec's ``slurm:`` section says how the login side is reached (``login``, ``login_identity_file``, ``conf``,
``shared_dir``). The cluster is found by what gtrain leaves on the shared filesystem and in the scheduler:
``<shared_dir>/gtrain/<name>/gtrain-record.json`` (written after each launch: the cluster id, its spec and its
jobs, nothing secret), else its live Slurm jobs -- named ``<name>-…`` (or ``gtrain-hold-<name>``, a held
allocation) with ``--comment=gtrain:<cluster id>`` (``squeue --me``).
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.providers.slurm.login import login_info, runner_for
from gtrain.providers.slurm.options import parse_options, shared_where

if TYPE_CHECKING:
    from gtrain.providers.slurm.login import SlurmHost
    from gtrain.remote.base import Runner
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

_MAX_RECORD = 4 << 20


def _login_side(p: SlurmHost, spec: ClusterSpec) -> tuple[Runner, Any]:
    from gtrain.providers.slurm.commands import Slurm

    opts = parse_options(spec)
    runner = runner_for(opts.model_dump(), "/", f"{spec.name} login side", p.report, tofu=True)
    return runner, Slurm(runner, opts.conf)


def _folder(p: SlurmHost, spec: ClusterSpec, runner: Runner) -> tuple[str | None, dict[str, Any] | None]:
    """(the cluster's folder, resolved; its attach record) on the shared filesystem; (None, None) if no folder."""

    sub = shlex.quote(f"gtrain/{spec.name}")
    res = runner.run(f"cd {shared_where(parse_options(spec))}/{sub} 2>/dev/null && pwd -P && "
                     f"head -c {_MAX_RECORD} gtrain-record.json 2>/dev/null; true", timeout=60, check=False)
    root, _, body = res.stdout.partition("\n")
    if not root.strip():
        return None, None
    try:
        doc = json.loads(body) if body.strip() else None
    except ValueError:
        doc = None
    return root.strip(), doc if isinstance(doc, dict) and doc.get("name") == spec.name else None


def _live_jobs(slurm: Any, name: str) -> dict[str, tuple[str, str]]:
    """Live Slurm jobs of this user that gtrain submitted for cluster ``name``: slurm id -> (job name, cluster id)."""
    res = slurm.run(["squeue", "-h", "--me", "-o", "%i|%j|%k"], check=False)
    out: dict[str, tuple[str, str]] = {}
    for ln in res.stdout.splitlines():
        parts = ln.split("|", 2)
        if len(parts) == 3 and parts[2].startswith("gtrain:") and (
                parts[1].startswith(f"{name}-") or parts[1] == f"gtrain-hold-{name}"):
            out[parts[0]] = (parts[1], parts[2].removeprefix("gtrain:"))
    return out


def find_by_name(p: SlurmHost, spec: ClusterSpec) -> tuple[str, str | None] | None:
    runner, slurm = _login_side(p, spec)
    root, record = _folder(p, spec, runner)
    if root is not None and record is not None and isinstance(record.get("cluster_id"), str):
        return record["cluster_id"], None
    ids = {cid for _, cid in _live_jobs(slurm, spec.name).values()}
    if len(ids) > 1:
        raise ConfigError(f"more than one cluster named {spec.name!r} has live Slurm jobs: {sorted(ids)}",
                          field="NAME", hint="`squeue --me -o '%i %j %k'` lists them; scancel the one you don't want")
    if ids and root is None:
        raise ConfigError(f"cluster {spec.name!r} has live Slurm jobs but no folder under slurm.shared_dir "
                          f"({parse_options(spec).shared_dir or '~'})", field="slurm.shared_dir",
                          hint="attach with the spec the cluster was made from (its slurm.shared_dir)")
    return (next(iter(ids)), None) if ids else None


def adopt(p: SlurmHost, spec: ClusterSpec, cluster: Cluster) -> None:
    """Record the cluster's folder (and its held allocation), as ``up`` does, without checking or probing."""
    opts = parse_options(spec)
    runner, slurm = _login_side(p, spec)
    root, _ = _folder(p, spec, runner)
    if root is None:
        raise ConfigError(f"cluster {spec.name!r}: no folder gtrain/{spec.name} under slurm.shared_dir "
                          f"({opts.shared_dir or '~'})", field="slurm.shared_dir",
                          hint="attach with the spec the cluster was made from")
    where = opts.login or "local"
    rid = p.store.record_resource(cluster.id, "slurm-dir", f"{where}:{root}")
    p.store.mark_resource(rid, "created")
    extra = {**cluster.extra, "slurm": login_info(opts, root)}
    held = [sid for sid, (jname, cid) in _live_jobs(slurm, spec.name).items()
            if jname == f"gtrain-hold-{spec.name}" and cid == cluster.id]
    if opts.hold and held:
        extra["slurm"]["alloc_id"] = held[0]
        rid = p.store.record_resource(cluster.id, "slurm-alloc", f"{where}:salloc")
        p.store.mark_resource(rid, "created", ref=f"{where}:{held[0]}")
    p.store.update_cluster(cluster.id, extra=extra)
    cluster.extra = extra
    for k in range(spec.num_nodes):
        p.store.upsert_node(cluster.id, k, status="up", address=opts.partition or "default",
                            instance_id=f"slurm:{opts.partition or 'default'}/node-{k}", meta={"root": root})
