"""The nodes' checkpoint tool as one file, ``python3 gtrain-ckpt.pyz``: the sync engine's zip
(:mod:`gtrain.sync.bundle`) plus :mod:`gtrain.checkpoints.store`, ``sharded``, ``subset`` and
:mod:`gtrain.checkpoints.node`. Shipped over a backend's runners by :mod:`gtrain.runs.ship`, or carried in a
scheduler's plan (kubernetes, ray)."""

from __future__ import annotations

import io
import zipfile
from functools import lru_cache
from pathlib import Path

BUNDLE = "gtrain-ckpt.pyz"
_MINE = ("checkpoints/__init__.py", "checkpoints/store.py", "checkpoints/sharded.py",
         "checkpoints/subset.py", "checkpoints/node.py")
_MAIN = "import sys\nfrom gtrain.checkpoints.node import main\nsys.exit(main())\n"


@lru_cache(maxsize=1)
def bundle() -> bytes:
    """``job.data``'s sync-engine zip plus the checkpoint tool, runnable as ``python3 gtrain-ckpt.pyz``."""
    from gtrain.sync.bundle import bundle as sync_bundle

    root = Path(__file__).resolve().parent.parent
    buf = io.BytesIO(sync_bundle())
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED) as z:
        for rel in _MINE:
            z.writestr(zipfile.ZipInfo(f"gtrain/{rel}", date_time=(2020, 1, 1, 0, 0, 0)), (root / rel).read_bytes())
        z.writestr(zipfile.ZipInfo("__main__.py", date_time=(2020, 1, 1, 0, 0, 0)), _MAIN)
    return buf.getvalue()
