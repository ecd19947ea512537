"""``gtrain down`` with a checkpoint store: say which checkpoints are safely in the store before the nodes are
deleted, and refuse (without ``--yes``) when the newest one on the nodes is not."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import GtrainError, JobConflict

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.state import Cluster


def _local_newest(files: list[dict[str, Any]]) -> tuple[str, float] | None:
    """The newest checkpoint (top-level entry) among a node's checkpoint_dir files, and when it was written."""
    newest: dict[str, float] = {}
    for f in files:
        top = str(f["path"]).split("/", 1)[0]
        if top.startswith(".") or top.endswith((".done", ".tmp", ".partial")):
            continue
        newest[top] = max(newest.get(top, 0.0), float(f["mtime"]))
    if not newest:
        return None
    name = max(newest, key=lambda n: (newest[n], n))
    return name, newest[name]


def check_down(cluster: Cluster, ctx: Context, *, yes: bool) -> list[str]:
    """Report the store's checkpoints; JobConflict when the newest on the nodes is not there (unless ``yes``)."""
    from gtrain.checkpoints.pull import store_checkpoints
    from gtrain.remote.fanout import parallel

    job = ctx.store.latest_job(cluster.id)
    if job is None or not job.info.get("checkpoint_store"):
        return []
    from gtrain.checkpoints.pull import store_key

    where = f"{job.info['checkpoint_store']}/{store_key(job)}"
    try:
        stored = {c["name"]: c for c in store_checkpoints(job) or [] if c["complete"]}
    except GtrainError as e:
        stored = {}
        ctx.report.warn(f"cannot list the checkpoint store {where}: {e.message}")
    names = sorted(stored, key=lambda n: stored[n]["mtime"])
    ctx.report.info(f"checkpoints safely in {where}: {', '.join(names) if names else 'none'}")
    ckpt = str(job.info.get("checkpoint_dir") or "checkpoints")
    if cluster.status == "stopped":  # `gtrain stop`: the nodes cannot be asked without starting them
        ctx.report.warn(f"{cluster.name} is stopped: its nodes' own checkpoints were not compared with the store "
                        f"(`gtrain start {cluster.name}` then `gtrain pull` first to keep them)")
        return []
    try:
        runners = ctx.runners(cluster)
        local = parallel(lambda r: r.call("manifest", f"{r.root}/workdir/{ckpt}"), runners)
    except GtrainError:
        return []  # the nodes cannot be asked (gone already): nothing more on them to lose
    unsafe = []
    for i, files in enumerate(local):
        newest = _local_newest(list(files))
        if newest is None:
            continue
        name, mtime = newest
        if name not in stored or stored[name]["mtime"] + 1e-3 < mtime:
            unsafe.append(f"node {i}: {name}")
    if unsafe and not yes:
        raise JobConflict(f"the newest checkpoint is not safely in {where} yet ({'; '.join(unsafe)}); down would "
                          "delete it with the nodes",
                          hint=f"`gtrain pull {cluster.name}` first, wait for the upload, or `gtrain down "
                               f"{cluster.name} --yes` (it pulls them here first)")
    if unsafe:
        dest = rescue(cluster, ctx, job, ckpt, runners, unsafe)
        return [f"not in the store, pulled to {dest} before the nodes were deleted: {u}" for u in unsafe]
    return []


def rescue(cluster: Cluster, ctx: Context, job: Any, ckpt: str, runners: list[Any], unsafe: list[str]) -> Path:
    """Never delete the only copy: pull the nodes' checkpoint_dir to the run's local destination (where the
    last pull went, else ``./<cluster>-<checkpoint_dir>``); a pull that fails stops the teardown
    (JobConflict), ``--yes`` or not."""
    from gtrain.sync.pull import default_pull_dest, pull_dir

    dest = Path(str(job.info.get("pulled_to") or default_pull_dest(cluster.name, ckpt)))
    ctx.report.warn(f"checkpoints not in the store ({'; '.join(unsafe)}): pulling them from the nodes to {dest} "
                    "before deleting the nodes")
    try:
        res = pull_dir([(i, r, f"{r.root}/workdir/{ckpt}") for i, r in enumerate(runners)], dest, report=ctx.report)
    except GtrainError as e:
        raise JobConflict(f"the newest checkpoint is only on the nodes ({'; '.join(unsafe)}) and pulling it to "
                          f"{dest} failed: {e.message}; the nodes are kept",
                          hint=f"`gtrain pull {cluster.name} --node K --to DIR`, then `gtrain down "
                               f"{cluster.name}`") from None
    ctx.report.info(f"pulled {res.files} file(s) from the nodes to {dest}")
    return dest
