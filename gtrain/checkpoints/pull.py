"""A job's checkpoints in its store, read from this machine: the store's folder of the job, its listing, and
``gtrain pull`` straight from the store (no node asked; each file verified by sha256)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import SyncError

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.state import Job as JobRecord
    from gtrain.sync.pull import PullResult


def store_key(job: JobRecord) -> str:
    """The job's folder in its store: its run's (``<cluster>/<run_id>``); a job launched before runs were keyed
    so (no ``checkpoint_key`` in its info) kept its checkpoints under its job id."""
    return str(job.info.get("checkpoint_key") or job.id)


def store_checkpoints(job: JobRecord) -> list[dict[str, Any]] | None:
    """The job's checkpoints in its store (None: the job has no store), oldest first."""
    url = job.info.get("checkpoint_store")
    if not url:
        return None
    from gtrain.checkpoints.store import Store

    st = Store(str(url), store_key(job))
    try:
        return [c.to_dict() for c in st.checkpoints()]
    finally:
        st.close()


class StoreHasNoCheckpoint(SyncError):
    """The job's store holds no complete checkpoint (yet): what the nodes hold is all there is."""


def pull_from_store(job: JobRecord, dest: Path, report: Reporter | None = None) -> PullResult:
    """``gtrain pull`` of a job with a store: every complete checkpoint, straight from the store (no node is
    asked; each file verified by sha256)."""
    from gtrain.checkpoints.store import LinkInDest, Store, point, restorable
    from gtrain.sync.pull import MARKER, MARKER_TEXT, PullResult, check_dest

    st = Store(str(job.info["checkpoint_store"]), store_key(job))
    t0 = time.monotonic()
    res = PullResult(str(dest), [])
    try:
        done = [c for c in st.checkpoints() if c.complete]
        if not done:
            raise StoreHasNoCheckpoint(f"{st.where}: no complete checkpoint in the store yet")
        check_dest(dest)
        created = not os.path.lexists(dest)
        dest.mkdir(parents=True, exist_ok=True)
        if created:  # as a pull from the nodes: a folder gtrain made is never synced to the nodes
            (dest / MARKER).write_bytes(MARKER_TEXT)
        for ckpt in done:
            why = st.problem(ckpt)
            if why is None:
                try:
                    got, kept, nbytes = st.restore(ckpt, dest, no_links=True)
                except LinkInDest:
                    raise
                except SyncError as e:
                    why = e.message
            if why is not None:  # a tampered or torn checkpoint: refused, the others still come
                res.refused.append({"name": ckpt.name, "why": why})
                if report is not None:
                    report.warn(f"checkpoint {ckpt.name} refused, not pulled: {why}")
                continue
            res.transferred += got
            res.skipped += kept
            res.bytes += nbytes
            res.nodes = sorted(set(res.nodes) | set(ckpt.manifests))
        pulled = [c for c in restorable(st.listing) if c.name not in {r["name"] for r in res.refused}]
        if pulled:  # a pointer pulled (DeepSpeed's latest) names the newest whole step pulled
            point(dest, pulled[-1], st.listing)
        if len(res.refused) == len(done):
            raise SyncError(f"{st.where}: every complete checkpoint was refused: "
                            + "; ".join(f"{r['name']}: {r['why']}" for r in res.refused))
        res.files = len(res.transferred) + len(res.skipped)
        res.seconds = time.monotonic() - t0
        return res
    finally:
        st.close()
