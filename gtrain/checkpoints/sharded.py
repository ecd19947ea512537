"""Sharded checkpoints: what makes a step that several nodes wrote whole, per framework. Stdlib only (it runs
on the nodes, from ``gtrain-ckpt.pyz``; torch is never imported, at upload time or any other).

- **torch.distributed.checkpoint (DCP)**: a step folder of ``__R_I.distcp`` data files, one set per rank, and
  the ``.metadata`` file the coordinator (global rank 0) writes LAST (``.metadata.tmp``, then a rename), once
  every rank's write has finished. The metadata is a pickled ``torch.distributed.checkpoint.metadata.Metadata``
  whose ``storage_data`` maps each tensor piece to a ``_StorageInfo(relative_path=...)``: the data files the
  step needs. It is read here without torch: a restricted unpickler that maps every class to a stand-in (no
  code of the pickle runs), else a scan of its strings. A DCP step is whole when ``.metadata`` and every file it
  names are in the store; without ``.metadata`` it is not (some rank had not finished).
- **DCP without a coordinator** (``dcp.save(..., use_collectives=False)``, torch 2.13): no ``.metadata``;
  each rank writes ``__R.metadata`` (its own pieces, each tensor's global size) after its ``__R_0.distcp``, and
  ``dcp.load`` has each rank read its own. Whole when ``__0.metadata`` .. ``__K.metadata`` are in with no gap,
  every file they name is in, and the pieces they list cover every tensor's global size (a missing rank above
  K leaves a gap there). Each node's manifest carries its ranks' pieces (``dcp_ranks``, ``dcp_keys``).
- **DeepSpeed ZeRO**: a ``global_stepN/`` folder (the one ``latest`` names) of per-rank files
  ``zero_pp_rank_R_mp_rank_M_optim_states.pt`` (``bf16_``-prefixed with the bf16 optimizer; ZeRO-3 also
  ``..._model_states.pt`` per rank) beside ``mp_rank_M_model_states.pt``. The model states (a torch zip, its
  ``data.pkl`` read as above: tensors are never loaded) give ``dp_world_size`` and ``mp_world_size``: the node
  holding them writes every rank's file name into its manifest (``requires``), and the step is whole when all
  are in. Without readable model states: the ranks' files run 0..R with no gap and every node that wrote the
  previous step wrote its part (the store's rule).
- anything else: the store's rule alone (every node that wrote the previous step folder wrote this one).
"""

from __future__ import annotations

import builtins
import io
import pickle
import pickletools
import re
import zipfile
from pathlib import Path
from typing import Any

DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"
#: dot-files a framework writes as part of a checkpoint folder (uploaded and restored with it); other names
#: starting with ``.`` (and ``*.tmp`` / ``*.partial``, as DCP's ``.metadata.tmp``) are never uploaded
FRAMEWORK_DOTFILES = (DCP_METADATA,)
METADATA_MAX = 256 << 20  # bytes: larger is no DCP metadata we read
_ZERO = re.compile(r"(bf16_)?zero_pp_rank_(\d+)_(?:mp_rank_(\d+)_)?(optim|model)_states\.pt")
_RANK_META = re.compile(r"__(\d+)\.metadata")
_MODEL = re.compile(r"(?:.*_)?mp_rank_\d+_model_states\.pt")


class _Stub:
    """Whatever class a pickle names: keeps its arguments and state, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def field(self, name: str) -> Any:
        st = getattr(self, "state", None)  # made by ``__new__`` alone (no __init__, no state): no field
        if isinstance(st, tuple) and len(st) == 2 and isinstance(st[1], dict):  # (dict, slots)
            st = {**(st[0] or {}), **st[1]}
        if isinstance(st, dict) and name in st:
            return st[name]
        return None


class _Dict(dict):  # type: ignore[type-arg]
    """``collections.OrderedDict``, whose pickle may carry attributes (a state_dict's ``_metadata``): dropped."""

    def __setstate__(self, state: Any) -> None:
        return None


class _Stubs(pickle.Unpickler):
    _SAFE = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "int", "float",
                                       "bytes", "bool", "complex", "slice")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._SAFE:
            return getattr(builtins, name)
        if (module, name) == ("collections", "OrderedDict"):
            return _Dict
        return type(name, (_Stub,), {})  # a fresh stand-in: no code of the pickle's classes runs

    def persistent_load(self, pid: Any) -> Any:  # a torch zip's tensor storage: never loaded
        return None


def _stub_load(data: bytes) -> Any:
    return _Stubs(io.BytesIO(data)).load()


def _read(path: Path) -> bytes | None:
    try:
        if path.stat().st_size > METADATA_MAX:
            return None
        return path.read_bytes()
    except OSError:
        return None


def _dcp_files(md: Any) -> list[str] | None:
    storage = md.field("storage_data") if isinstance(md, _Stub) else None
    if isinstance(storage, dict):
        paths = {info.field("relative_path") for info in storage.values() if isinstance(info, _Stub)}
        if paths and all(isinstance(p, str) for p in paths):
            return sorted(paths)
    return None


def dcp_data_files(metadata: Path) -> list[str] | None:
    """The data files (relative to the step folder) a DCP ``.metadata`` names, sorted; None when it cannot be
    read as one (then no file list is known)."""
    data = _read(metadata)
    if data is None:
        return None
    try:
        if (got := _dcp_files(_stub_load(data))) is not None:
            return got
    except Exception:  # noqa: BLE001, S110 - a pickle of another shape: fall back to its strings
        pass
    try:  # no class to stand in for: every string of the pickle that names a data file
        found = {str(arg) for op, arg, _pos in pickletools.genops(data)
                 if "UNICODE" in op.name and isinstance(arg, str) and arg.endswith(DCP_SUFFIX)}
    except Exception:  # noqa: BLE001 - not a pickle
        return None
    return sorted(found) or None


def _dims(v: Any) -> list[int] | None:
    """A ``torch.Size`` (a stand-in holding its tuple) or a tuple as a list of ints."""
    if isinstance(v, _Stub) and len(v.args) == 1:
        v = v.args[0]
    if isinstance(v, tuple | list) and all(isinstance(d, int) and not isinstance(d, bool) for d in v):
        return list(v)
    return None


def dcp_rank_metadata(path: Path) -> dict[str, Any] | None:
    """A rank-local DCP ``__R.metadata``: {"files": the data files it names, "chunks": {key: [global size,
    [[offsets, sizes], ...]]} for each tensor, None for a non-tensor}; None when it cannot be read so."""
    data = _read(path)
    if data is None:
        return None
    try:
        md = _stub_load(data)
        files = _dcp_files(md)
        sdm = md.field("state_dict_metadata") if isinstance(md, _Stub) else None
        if files is None or not isinstance(sdm, dict):
            return None
        chunks: dict[str, Any] = {}
        for key, v in sdm.items():
            size = _dims(v.field("size")) if isinstance(v, _Stub) else None
            if size is None:
                chunks[str(key)] = None  # bytes (or another non-tensor): any rank's copy will do
                continue
            pieces = []
            for c in (v.field("chunks") or []) if isinstance(v, _Stub) else []:
                off, sz = (_dims(c.field("offsets")), _dims(c.field("sizes"))) if isinstance(c, _Stub) else (None, None)
                if off is None or sz is None:
                    return None
                pieces.append([off, sz])
            chunks[str(key)] = [size, pieces]
        return {"files": files, "chunks": chunks}
    except Exception:  # noqa: BLE001 - another layout: no rule of ours
        return None


def _covered(chunks: dict[str, list[Any]]) -> bool:
    """Every tensor's pieces (across ranks; the same piece from several ranks counted once) add up to its
    global size. Pieces of one tensor never overlap in DCP's plans unless identical (replicated)."""
    for size, pieces in chunks.values():
        whole = 1
        for d in size:
            whole *= d
        got = 0
        for _off, sz in {(tuple(o), tuple(z)) for o, z in pieces}:
            n = 1
            for d in sz:
                n *= d
            got += n
        if got < whole:
            return False
    return True


def zero_world(path: Path) -> tuple[int, int] | None:
    """(dp_world_size, mp_world_size) a DeepSpeed model states file (``torch.save``'s zip) records, read from
    its ``data.pkl`` without torch (stand-ins; tensors never loaded); None when it cannot be read so."""
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next((i for i in z.infolist() if i.filename.endswith("/data.pkl")), None)
            if pkl is None or pkl.file_size > METADATA_MAX:
                return None
            doc = _stub_load(z.read(pkl))
    except Exception:  # noqa: BLE001 - not a torch zip (the legacy format, or no checkpoint at all)
        return None
    if not isinstance(doc, dict):
        return None
    dp, mp = doc.get("dp_world_size"), doc.get("mp_world_size", 1)
    if isinstance(dp, int) and isinstance(mp, int) and 0 < dp <= 1 << 20 and 0 < mp <= 1 << 12:
        return dp, mp
    return None


def kind(name: str, paths: set[str]) -> str | None:
    """"dcp", "zero" or None: the framework that wrote step folder ``name`` (``paths``: its files, relative to
    checkpoint_dir, across the nodes)."""
    base = [p[len(name) + 1:] for p in paths if p.startswith(f"{name}/")]
    if any(b == DCP_METADATA or _RANK_META.fullmatch(b) or (b.endswith(DCP_SUFFIX) and "/" not in b) for b in base):
        return "dcp"
    if any(_ZERO.fullmatch(b) for b in base):
        return "zero"
    return None


def _dcp_local(name: str, paths: set[str], manifests: dict[int, dict[str, Any]]) -> list[str] | None:
    """What a coordinator-less DCP step (``__R.metadata`` per rank) lacks; None: a rank's metadata was not read."""
    ranks: dict[int, dict[str, Any]] = {}
    for m in manifests.values():
        for r, info in (m.get("dcp_ranks") or {}).items() if isinstance(m.get("dcp_ranks"), dict) else []:
            if str(r).isdigit() and isinstance(info, dict):
                ranks[int(r)] = {"files": info.get("files"), "chunks": rank_chunks(m, info)}
    present = {int(x.group(1)) for p in paths
               if p.startswith(f"{name}/") and (x := _RANK_META.fullmatch(p[len(name) + 1:]))}
    if not present <= set(ranks):
        return None
    top = max(present)
    writers = {int(b[2:].split("_", 1)[0]) for p in paths if p.startswith(f"{name}/__")
               and (b := p[len(name) + 1:]).endswith(DCP_SUFFIX) and b[2:].split("_", 1)[0].isdigit()}
    out = [f"{name}/__{r}{DCP_METADATA}" for r in sorted(set(range(top)) | writers) if r not in present]
    out += sorted({f"{name}/{f}" for info in ranks.values() for f in info.get("files") or []} - paths)
    chunks: dict[str, list[Any]] = {}
    try:
        for info in ranks.values():
            for key, c in (info.get("chunks") or {}).items():
                if c is not None:
                    chunks.setdefault(key, [c[0], []])[1].extend(c[1])
        if not out and not _covered(chunks):
            out.append(f"{name}/__{top + 1}{DCP_METADATA}")  # some rank above the highest present wrote nothing
    except (TypeError, ValueError, IndexError):
        return None
    return out


def missing(name: str, manifests: dict[int, dict[str, Any]]) -> tuple[str | None, list[str] | None]:
    """(framework, what step folder ``name`` lacks for it to be whole) over the nodes' manifests (node ->
    {files: [{path, ...}], requires?, dcp_ranks?}). The list is empty when the framework's rule holds; None when
    the framework gives no rule here (another trainer, or a DCP metadata that could not be read: the store's
    rule of the previous step's writers decides). A ZeRO list without ``requires`` in any manifest (model states
    not read) is the no-gap rule alone: the previous step's writers decide too (:func:`names_every_rank`)."""
    paths = {str(f.get("path")) for m in manifests.values() for f in m.get("files") or [] if isinstance(f, dict)}
    what = kind(name, paths)
    if what == "dcp":
        meta = f"{name}/{DCP_METADATA}"
        if meta not in paths:
            if any(_RANK_META.fullmatch(p[len(name) + 1:]) for p in paths if p.startswith(f"{name}/")):
                return what, _dcp_local(name, paths, manifests)
            return what, [meta]
        holders = [m for m in manifests.values() if any(isinstance(f, dict) and f.get("path") == meta
                                                        for f in m.get("files") or [])]
        newest = max(holders, key=lambda m: (float(m.get("mtime") or 0), float(m.get("written_at") or 0)))
        req = newest.get("requires")
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            return what, None
        return what, sorted(r for r in req if r not in paths)
    if what == "zero":
        need = {r for m in manifests.values() if isinstance(m.get("requires"), list)
                for r in m["requires"] if isinstance(r, str)}
        if need:
            return "zero", sorted(need - paths)
        base = [p[len(name) + 1:] for p in paths if p.startswith(f"{name}/")]
        out = [] if any(_MODEL.fullmatch(b) for b in base) else [f"{name}/mp_rank_00_model_states.pt"]
        families: dict[tuple[str, str, str], set[int]] = {}
        for b in base:
            if m := _ZERO.fullmatch(b):
                families.setdefault((m.group(1) or "", m.group(3) or "", m.group(4)), set()).add(int(m.group(2)))
        top = max(set().union(*families.values()))
        for (bf16, mp, what_states), got in sorted(families.items()):
            for r in range(top + 1):
                if r not in got:
                    mp_part = f"_mp_rank_{mp}" if mp else ""
                    out.append(f"{name}/{bf16}zero_pp_rank_{r}{mp_part}_{what_states}_states.pt")
        return "zero", out
    return None, None


def names_every_rank(what: str | None, manifests: dict[int, dict[str, Any]]) -> bool:
    """The framework's own metadata (DCP's, ZeRO's model states) named every rank's part of the step: its rule
    replaces the previous step's writers (a run resumed on fewer nodes writes whole steps at once). ZeRO: only
    when every file of the step is a model states or ZeRO file (pipeline stages' ``layer_*`` files, MoE experts'
    are not in ``requires``: the previous step's writers still decide there)."""
    if what != "zero":
        return what == "dcp"
    names = [str(f.get("path")).rsplit("/", 1)[-1] for m in manifests.values() for f in m.get("files") or []
             if isinstance(f, dict)]
    return any(isinstance(m.get("requires"), list) for m in manifests.values()) \
        and all(_ZERO.fullmatch(n) or _MODEL.fullmatch(n) for n in names)


def _zero_requires(root: Path, name: str, files: list[str]) -> list[str] | None:
    base = [f[len(name) + 1:] for f in files if f.startswith(f"{name}/")]
    model = [b for b in base if _MODEL.fullmatch(b)]
    world = next((w for b in sorted(model) if (w := zero_world(root / name / b)) is not None), None)
    if world is None:
        return None
    dp, mp = world
    families = {(m.group(1) or "", m.group(4)) for b in base if (m := _ZERO.fullmatch(b))}
    out = {f"{name}/{bf16}zero_pp_rank_{r}_mp_rank_{k:02d}_{st}_states.pt"
           for bf16, st in families for r in range(dp) for k in range(mp)}
    if any(not _ZERO.fullmatch(b) for b in model):  # ZeRO 1/2: the model states of each model-parallel rank
        out |= {f"{name}/mp_rank_{k:02d}_model_states.pt" for k in range(mp)}
    return sorted(out)


def requires(root: Path, name: str, files: list[str]) -> list[str] | None:
    """What a node's part of checkpoint ``name`` says the whole step needs, for its manifest: the files (relative
    to checkpoint_dir) its DCP ``.metadata`` names, or every rank's ZeRO file by its model states' world size,
    when it holds one; else None."""
    meta = f"{name}/{DCP_METADATA}"
    if meta not in files:
        return _zero_requires(root, name, files)
    got = dcp_data_files(root / meta)
    return None if got is None else [f"{name}/{p}" for p in got]


def rank_chunks(manifest: dict[str, Any], info: dict[str, Any]) -> dict[str, Any] | None:
    """A rank's pieces ({key: [global size, [[offsets, sizes], ...]]}) from its ``dcp_ranks`` entry: ``chunks``
    (manifests written before the compact form), else its ``pieces`` against the manifest's ``dcp_keys``
    ([[key, global size], ...], once per node; :func:`describe`); None when neither reads so."""
    if isinstance(info.get("chunks"), dict):
        return info["chunks"]  # type: ignore[no-any-return]
    keys, pieces = manifest.get("dcp_keys"), info.get("pieces")
    if not isinstance(keys, list) or not isinstance(pieces, list) or len(keys) != len(pieces) \
            or not all(isinstance(k, list) and len(k) == 2 and isinstance(k[0], str) for k in keys):
        return None
    return {k[0]: [k[1], p] for k, p in zip(keys, pieces, strict=True) if p is not None}


def _compact(ranks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The node's ``dcp_ranks`` with each tensor's name and global size written once (``dcp_keys``) and each
    rank's pieces as a list in that order (``pieces``; null: the rank holds no piece of it, or it is no tensor):
    64 ranks' manifests of a 7B model (1,200 keys) are 7 times smaller so. Ranks that disagree on a tensor's
    global size keep the long form (``chunks``)."""
    sizes: dict[str, Any] = {}
    for info in ranks.values():
        for key, c in info["chunks"].items():
            if c is not None and sizes.setdefault(key, c[0]) != c[0]:
                return {"dcp_ranks": ranks}
    keys = sorted(sizes)
    return {"dcp_keys": [[k, sizes[k]] for k in keys],
            "dcp_ranks": {r: {"files": info["files"], "pieces": [c[1] if (c := info["chunks"].get(k)) else None
                                                               for k in keys]} for r, info in ranks.items()}}


def describe(root: Path, name: str, files: list[str]) -> dict[str, Any]:
    """The fields a node's manifest of step folder ``name`` gets from the framework's metadata it holds:
    ``requires`` (:func:`requires`) and ``dcp_ranks`` ({rank: {files, pieces}} of its ``__R.metadata``
    (:func:`dcp_rank_metadata`), with ``dcp_keys``: :func:`_compact`; read back by :func:`rank_chunks`)."""
    out: dict[str, Any] = {}
    if (req := requires(root, name, files)) is not None:
        out["requires"] = req
    ranks = {}
    for f in files:
        if f.startswith(f"{name}/") and (m := _RANK_META.fullmatch(f[len(name) + 1:])):
            if (got := dcp_rank_metadata(root / f)) is not None:
                ranks[m.group(1)] = got
    if ranks:
        out.update(_compact(ranks))
    return out


def dcp_finished(root: Path, name: str, files: list[str]) -> bool:
    """Checkpoint folder ``name`` holds DCP's ``.metadata``, written after every data file of this node, or
    (no coordinator) each rank's ``__R.metadata`` written after that rank's data files: the writer has finished
    (no settle time to wait)."""
    try:
        meta = root / name / DCP_METADATA
        if meta.exists():
            at = meta.stat().st_mtime
            return all((root / f).stat().st_mtime <= at for f in files)
        base = [f[len(name) + 1:] for f in files if f.startswith(f"{name}/")]
        local = {m.group(1): (root / name / b).stat().st_mtime for b in base if (m := _RANK_META.fullmatch(b))}
        if not local:
            return False
        for b in base:
            if b.endswith(DCP_SUFFIX):
                r = b[2:].split("_", 1)[0] if b.startswith("__") else None
                if r not in local or (root / name / b).stat().st_mtime > local[r]:
                    return False
        return True
    except OSError:
        return False
