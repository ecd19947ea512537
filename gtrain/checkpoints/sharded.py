"""Sharded checkpoints: what makes a step that several nodes wrote whole, per framework. Stdlib only (it runs
on the nodes, from ``gtrain-ckpt.pyz``; torch is never imported, at upload time or any other).

- **torch.distributed.checkpoint (DCP)**: a step folder of ``__R_I.distcp`` data files, one set per rank, and
  the ``.metadata`` file the coordinator (global rank 0) writes LAST (``.metadata.tmp``, then a rename), once
  every rank's write has finished. The metadata is a pickled ``torch.distributed.checkpoint.metadata.Metadata``
  whose ``storage_data`` maps each tensor piece to a ``_StorageInfo(relative_path=...)``: the data files the
  step needs. It is read here without torch: a restricted unpickler that maps every class to a stand-in (no
  code of the pickle runs), else a scan of its strings. A DCP step is whole when ``.metadata`` and every file it
  names are in the store; without ``.metadata`` it is not (some rank had not finished).
- **DeepSpeed ZeRO**: a ``global_stepN/`` folder (the one ``latest`` names) of per-rank files
  ``zero_pp_rank_R_mp_rank_M_optim_states.pt`` (and ZeRO-3's ``..._model_states.pt``) beside
  ``mp_rank_M_model_states.pt``: whole when the model states are in and the ranks' files run 0..R with no gap
  (and, as for any step folder, every node that wrote the previous step wrote its part: the store's rule).
- anything else: the store's rule alone (every node that wrote the previous step folder wrote this one).
"""

from __future__ import annotations

import builtins
import io
import pickle
import pickletools
import re
from pathlib import Path
from typing import Any

DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"
#: dot-files a framework writes as part of a checkpoint folder (uploaded and restored with it); other names
#: starting with ``.`` (and ``*.tmp`` / ``*.partial``, as DCP's ``.metadata.tmp``) are never uploaded
FRAMEWORK_DOTFILES = (DCP_METADATA,)
METADATA_MAX = 256 << 20  # bytes: larger is no DCP metadata we read
_ZERO = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_(?:mp_rank_(\d+)_)?(optim|model)_states\.pt")
_MODEL = re.compile(r"(?:.*_)?mp_rank_\d+_model_states\.pt")


class _Stub:
    """Whatever class a pickle names: keeps its arguments and state, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def field(self, name: str) -> Any:
        st = self.state
        if isinstance(st, tuple) and len(st) == 2 and isinstance(st[1], dict):  # (dict, slots)
            st = {**(st[0] or {}), **st[1]}
        if isinstance(st, dict) and name in st:
            return st[name]
        return None


class _Stubs(pickle.Unpickler):
    _SAFE = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "int", "float",
                                       "bytes", "bool", "complex", "slice")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._SAFE:
            return getattr(builtins, name)
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        return type(name, (_Stub,), {})  # a fresh stand-in: no code of the pickle's classes runs


def dcp_data_files(metadata: Path) -> list[str] | None:
    """The data files (relative to the step folder) a DCP ``.metadata`` names, sorted; None when it cannot be
    read as one (then no file list is known)."""
    try:
        if metadata.stat().st_size > METADATA_MAX:
            return None
        data = metadata.read_bytes()
    except OSError:
        return None
    try:
        md = _Stubs(io.BytesIO(data)).load()
        storage = md.field("storage_data") if isinstance(md, _Stub) else None
        if isinstance(storage, dict):
            paths = {info.field("relative_path") for info in storage.values() if isinstance(info, _Stub)}
            if paths and all(isinstance(p, str) for p in paths):
                return sorted(paths)
    except Exception:  # noqa: BLE001, S110 - a pickle of another shape: fall back to its strings
        pass
    try:  # no class to stand in for: every string of the pickle that names a data file
        found = {str(arg) for op, arg, _pos in pickletools.genops(data)
                 if "UNICODE" in op.name and isinstance(arg, str) and arg.endswith(DCP_SUFFIX)}
    except Exception:  # noqa: BLE001 - not a pickle
        return None
    return sorted(found) or None


def kind(name: str, paths: set[str]) -> str | None:
    """"dcp", "zero" or None: the framework that wrote step folder ``name`` (``paths``: its files, relative to
    checkpoint_dir, across the nodes)."""
    base = [p[len(name) + 1:] for p in paths if p.startswith(f"{name}/")]
    if any(b == DCP_METADATA or (b.endswith(DCP_SUFFIX) and "/" not in b) for b in base):
        return "dcp"
    if any(_ZERO.fullmatch(b) for b in base):
        return "zero"
    return None


def missing(name: str, manifests: dict[int, dict[str, Any]]) -> tuple[str | None, list[str] | None]:
    """(framework, what step folder ``name`` lacks for it to be whole) over the nodes' manifests (node ->
    {files: [{path, ...}], requires?}). The list is empty when the framework's rule holds; None when the
    framework gives no rule here (another trainer, or a DCP metadata that could not be read: the store's rule
    of the previous step's writers decides)."""
    paths = {str(f.get("path")) for m in manifests.values() for f in m.get("files") or [] if isinstance(f, dict)}
    what = kind(name, paths)
    if what == "dcp":
        meta = f"{name}/{DCP_METADATA}"
        if meta not in paths:
            return what, [meta]
        holders = [m for m in manifests.values() if any(isinstance(f, dict) and f.get("path") == meta
                                                        for f in m.get("files") or [])]
        newest = max(holders, key=lambda m: (float(m.get("mtime") or 0), float(m.get("written_at") or 0)))
        req = newest.get("requires")
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            return what, None
        return what, sorted(r for r in req if r not in paths)
    if what == "zero":
        base = [p[len(name) + 1:] for p in paths if p.startswith(f"{name}/")]
        out = [] if any(_MODEL.fullmatch(b) for b in base) else [f"{name}/mp_rank_00_model_states.pt"]
        families: dict[tuple[str, str], set[int]] = {}
        for b in base:
            if m := _ZERO.fullmatch(b):
                families.setdefault((m.group(2) or "", m.group(3)), set()).add(int(m.group(1)))
        ranks = set().union(*families.values())
        top = max(ranks)
        for (mp, what_states), got in sorted(families.items()):
            for r in range(top + 1):
                if r not in got:
                    mp_part = f"_mp_rank_{mp}" if mp else ""
                    out.append(f"{name}/zero_pp_rank_{r}{mp_part}_{what_states}_states.pt")
        return "zero", out
    return None, None


def requires(root: Path, name: str, files: list[str]) -> list[str] | None:
    """What a node's part of checkpoint ``name`` says the whole step needs, for its manifest: the files (relative
    to checkpoint_dir) its DCP ``.metadata`` names, when it holds one; else None."""
    meta = f"{name}/{DCP_METADATA}"
    if meta not in files:
        return None
    got = dcp_data_files(root / meta)
    return None if got is None else [f"{name}/{p}" for p in got]


def dcp_finished(root: Path, name: str, files: list[str]) -> bool:
    """Checkpoint folder ``name`` holds DCP's ``.metadata``, written after every data file of this node: the
    writer has finished (no settle time to wait)."""
    meta = root / name / DCP_METADATA
    try:
        at = meta.stat().st_mtime
        return all((root / f).stat().st_mtime <= at for f in files)
    except OSError:
        return False
