"""What a restore puts on a node of a sharded run (docs/durable.md, "Sharded checkpoints"): the whole step (the
default), or (``GTRAIN_CHECKPOINT_RESTORE=subset``) only what this node's ranks read at ``dcp.load``, told from
DCP's own metadata, for a step written by the shape this launch has. Stdlib only (it runs on the nodes, from
``gtrain-ckpt.pyz``).

How DCP loads (torch 2.13: ``torch/distributed/checkpoint/state_dict_loader.py``, ``default_planner.py``,
``filesystem.py``): every rank reads ``.metadata`` (else, with no coordinator, its own ``__R.metadata``); its load
planner makes a read item for each stored piece that overlaps what the rank's own state_dict holds (a DTensor:
its local shard; a plain tensor: all of it; bytes: the item), and ``FileSystemReader.read_data`` opens the
files ``storage_data`` names for those items (``_StorageInfo.relative_path``), no other. At save, an item several
ranks hold (a replicated tensor, an optimizer's ``param_groups``) is written once, by the rank with the least
planned bytes (``_dedup_save_plans``), not by rank 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from gtrain.checkpoints.sharded import DCP_METADATA, METADATA_MAX, _dims, _Stub, _stub_load, kind
from gtrain.checkpoints.store import Checkpoint, Store

_FILE_RANK = re.compile(r"__(\d+)_\d+\.distcp")


def file_rank(name: str) -> int | None:
    """The rank that wrote DCP data file ``name`` (``__R_I.distcp``: DCP's ``FileSystemWriter`` prefixes every
    file of rank R's plan ``__R_``), else None."""
    m = _FILE_RANK.fullmatch(name)
    return int(m.group(1)) if m else None


def dcp_items(data: bytes) -> dict[str, tuple[bool, set[str]]] | None:
    """A DCP ``.metadata``'s items: {fqn: (a tensor?, the data files holding its pieces)}, from ``storage_data``
    (``MetadataIndex(fqn, offset, index)`` -> ``_StorageInfo(relative_path, ...)``) and ``state_dict_metadata``
    (a ``TensorStorageMetadata`` has a ``size``; ``BytesStorageMetadata`` none); None when it cannot be read so."""
    try:
        md = _stub_load(data)
        storage = md.field("storage_data") if isinstance(md, _Stub) else None
        sdm = md.field("state_dict_metadata") if isinstance(md, _Stub) else None
        if not isinstance(storage, dict) or not isinstance(sdm, dict) or not storage:
            return None
        out: dict[str, tuple[bool, set[str]]] = {}
        for idx, info in storage.items():
            fqn = idx.field("fqn") if isinstance(idx, _Stub) else None
            path = info.field("relative_path") if isinstance(info, _Stub) else None
            if not isinstance(fqn, str) or not isinstance(path, str) or "/" in path:
                return None
            v = sdm.get(fqn)
            tensor = isinstance(v, _Stub) and _dims(v.field("size")) is not None
            out.setdefault(fqn, (tensor, set()))[1].add(path)
        return out
    except Exception:  # noqa: BLE001 - another layout: no rule of ours
        return None


def dcp_rank_reads(items: dict[str, tuple[bool, set[str]]], ranks: set[int], world: int
                   ) -> tuple[list[str] | None, str]:
    """The data files ranks ``ranks`` of a ``world``-rank job read at ``dcp.load`` of a step whose ``.metadata``
    holds ``items`` (:func:`dcp_items`), when it was written by the same world size and each rank loads the shard
    layout it saved; (None, why) when that cannot be told. Per rank R, as DCP's default load planner plans it
    (each rank reads the stored pieces that overlap what its own state_dict holds):

    - a tensor with a piece in R's own files (``__R_*``): a shard R wrote; R reads its own piece(s) only;
    - a tensor with no piece there: one R may hold whole (a replicated tensor, saved once: DCP's save dedup gives
      it to ONE rank, the one with the least planned bytes, not rank 0) or a shard R shares with another rank
      (HSDP): every file holding a piece of it;
    - a non-tensor item (bytes: an optimizer's param_groups): every rank reads it, from the file holding it.
    """
    files = {f for _t, fs in items.values() for f in fs}
    by_rank = {r for f in files if (r := file_rank(f)) is not None}
    if any(file_rank(f) is None for f in files):
        return None, "a data file of the step is not named __R_I.distcp (another storage writer)"
    written = max(by_rank) + 1
    if written != world:
        return None, f"the step was written by {written} ranks, this run has {world} (DCP reshards: any rank may " \
                     f"read any file)"
    if not ranks or not ranks <= by_rank:
        return None, f"rank(s) {sorted(ranks - by_rank)} of this node wrote no file of the step"
    need: set[str] = set()
    for r in sorted(ranks):
        own = {f for f in files if file_rank(f) == r}
        need |= own
        for tensor, fs in items.values():
            if not tensor or not fs & own:
                need |= fs
    return sorted(need), ""


def dcp_local_reads(ranks_meta: dict[int, list[str]], ranks: set[int], world: int) -> tuple[list[str] | None, str]:
    """Coordinator-less DCP (``__R.metadata`` per rank): ``dcp.load`` has rank R read ``__R.metadata`` and the
    files it names, nothing else. ``ranks_meta``: {R: the files its ``__R.metadata`` names}. Returns (the files
    ranks ``ranks`` read, with their metadata, sorted) or (None, why)."""
    if max(ranks_meta, default=-1) + 1 != world or len(ranks_meta) != world:
        return None, f"the step was written by {len(ranks_meta)} ranks, this run has {world} (each rank reads " \
                     f"its own __R.metadata: the same world size is needed anyway)"
    if not ranks or not ranks <= set(ranks_meta):
        return None, f"rank(s) {sorted(ranks - set(ranks_meta))} of this node have no __R.metadata in the step"
    need = {f"__{r}{DCP_METADATA}" for r in ranks} | {f for r in ranks for f in ranks_meta[r]}
    return sorted(need), ""


def node_reads(name: str, manifests: dict[int, dict[str, Any]], node: int, ranks: set[int], world: int,
               metadata: bytes | None) -> tuple[list[str] | None, str]:
    """The files of DCP step folder ``name`` (paths relative to checkpoint_dir) that node ``node``, whose ranks
    are ``ranks`` of ``world``, reads at ``dcp.load``: the framework's metadata and what it assigns to those ranks
    (:func:`dcp_rank_reads`, :func:`dcp_local_reads`); (None, why) where the whole step is needed or it cannot be
    told. Only for the shape the step was written by: the same world size, and this node's own part of the step
    in the store (``node-K``, from the node of that index) written by exactly these ranks (another number of nodes
    or processes per node, or an elastic round whose group ranks moved: the whole step). ``metadata``: the step's
    ``.metadata`` (None for a step without one)."""
    paths = {str(f.get("path")) for m in manifests.values() for f in m.get("files") or [] if isinstance(f, dict)}
    if kind(name, paths) != "dcp":
        return None, "not a torch.distributed.checkpoint step (DeepSpeed ZeRO and other steps: the whole step)"
    base = f"{name}/"
    mine = {b for f in (manifests.get(node) or {}).get("files") or [] if isinstance(f, dict)
            and (b := str(f.get("path"))[len(base):]) and str(f.get("path")).startswith(base)}
    wrote = {r for b in mine if (r := file_rank(b)) is not None}
    if wrote != ranks:
        return None, (f"this node's part of {name} was written by rank(s) {_span(wrote)}, this node runs rank(s) "
                      f"{_span(ranks)} (another shape: DCP reshards, any rank may read any file)")
    if f"{base}{DCP_METADATA}" in paths:
        items = dcp_items(metadata) if metadata is not None else None
        if items is None:
            return None, f"{DCP_METADATA} could not be read as DCP's Metadata"
        got, why = dcp_rank_reads(items, ranks, world)
        if got is None:
            return None, why
        return sorted({f"{base}{DCP_METADATA}", *(f"{base}{f}" for f in got)}), ""
    local: dict[int, list[str]] = {}
    for m in manifests.values():
        for r, info in (m.get("dcp_ranks") or {}).items() if isinstance(m.get("dcp_ranks"), dict) else []:
            if str(r).isdigit() and isinstance(info, dict) and isinstance(info.get("files"), list):
                local[int(r)] = [str(f) for f in info["files"]]
    if not local:
        return None, "no DCP metadata in the step's manifests"
    got, why = dcp_local_reads(local, ranks, world)
    return (None, why) if got is None else (sorted(f"{base}{f}" for f in got), "")


def _span(ranks: set[int]) -> str:
    if not ranks:
        return "none"
    lo, hi = min(ranks), max(ranks)
    return f"{lo}-{hi}" if ranks == set(range(lo, hi + 1)) and hi > lo else ",".join(map(str, sorted(ranks)))


RESTORE_MODES = ("whole", "subset")


def node_ranks(node: int, env: Mapping[str, str]) -> tuple[set[int], int] | None:
    """(this node's global ranks, the world size) of the launch the restore is for; None when not known.
    Inside a rank's wrapper (an elastic round's restore, templates/rank.sh.j2): torchrun's own ``RANK`` -
    ``LOCAL_RANK`` .. + ``LOCAL_WORLD_SIZE`` of ``WORLD_SIZE``. Else (the restore before the launcher starts):
    node K of ``GTRAIN_NUM_NODES`` x ``GTRAIN_NPROC_PER_NODE`` runs ranks K*P .. K*P+P-1, as every fixed-world
    launcher numbers them (torchrun's static rendezvous, DeepSpeed's, Accelerate's, gtrain's spawner)."""
    def num(k: str) -> int | None:
        v = env.get(k, "")
        return int(v) if v.isdigit() else None

    rank, local, lws, world = num("RANK"), num("LOCAL_RANK"), num("LOCAL_WORLD_SIZE"), num("WORLD_SIZE")
    if rank is not None and local is not None and lws and world and local <= rank:
        return set(range(rank - local, rank - local + lws)), world
    nodes, procs = num("GTRAIN_NUM_NODES"), num("GTRAIN_NPROC_PER_NODE")
    if nodes and procs and node < nodes:
        return set(range(node * procs, node * procs + procs)), nodes * procs
    return None


def restore_mode(store: Store, node: int, env: Mapping[str, str], chose: dict[str, object]
                 ) -> Callable[[Checkpoint], set[str] | None]:
    """What a restore puts on this node, per checkpoint (``chose`` gets ``mode`` and ``why``):
    ``GTRAIN_CHECKPOINT_RESTORE`` ``whole`` (the default): every file of the step; ``subset``: for a DCP step of
    the shape this launch has (:func:`node_reads`), only DCP's metadata and the files
    it assigns to this node's ranks; else the whole step. The JSON line says which and why."""
    want = env.get("GTRAIN_CHECKPOINT_RESTORE", "whole").strip().lower() or "whole"

    def select(ckpt: Checkpoint) -> set[str] | None:
        chose.update(mode="whole", why="the default (GTRAIN_CHECKPOINT_RESTORE=whole): every file of the step")
        if want not in RESTORE_MODES:
            chose["why"] = f"GTRAIN_CHECKPOINT_RESTORE={want!r} is none of {', '.join(RESTORE_MODES)}"
        if want != "subset":
            return None
        if not ckpt.folder:
            chose["why"] = "a single-file checkpoint"
            return None
        shape = node_ranks(node, env)
        if shape is None:
            chose["why"] = "this node's ranks are not known (GTRAIN_NUM_NODES, GTRAIN_NPROC_PER_NODE)"
            return None
        meta = f"{ckpt.name}/{DCP_METADATA}"
        data = store.read_newest(ckpt, meta, METADATA_MAX) if any(
            f.get("path") == meta for m in ckpt.manifests.values() for f in m["files"]) else None
        files, why = node_reads(ckpt.name, ckpt.manifests, node, shape[0], shape[1], data)
        if files is None:
            chose["why"] = why
            return None
        total = {str(f["path"]) for m in ckpt.manifests.values() for f in m["files"]}
        if not set(files) <= total:
            chose["why"] = f"the metadata names {sorted(set(files) - total)[0]}, which no node's manifest holds"
            return None
        if set(files) >= total:
            chose["why"] = ("this node's ranks read every file of the step (DCP's metadata puts what every rank "
                            "reads, replicated tensors and non-tensor state, in other ranks' files)")
            return None
        chose.update(mode="subset", why=f"the shape that wrote the step: rank(s) {_span(shape[0])} of {shape[1]} "
                                        f"read {len(files)} of its {len(total)} files")
        return set(files)

    return select
