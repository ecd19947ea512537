"""The sync engine as a zip a node's python imports from (``gtrain-sync.pyz``): what ``job.data`` and the
checkpoint tool carry to nodes that have python3 and no gtrain. Deterministic bytes, so re-sends can be skipped."""

from __future__ import annotations

import io
import zipfile
from functools import lru_cache
from pathlib import Path

#: gtrain-relative paths of the modules the zip holds: stdlib-only (botocore, google-auth or obstore where
#: the node's python has them)
MODULES = ("__init__.py", "errors.py", "redact.py", "events.py",
            "sync/__init__.py", "sync/model.py", "sync/local.py", "sync/manifest.py",
            "sync/engine.py", "sync/objstore.py", "sync/s3.py", "sync/s3wire.py", "sync/s3fast.py",
            "sync/gcs.py", "sync/gcswire.py", "sync/s3auth.py", "sync/httpconn.py", "sync/ranges.py",
            "sync/azure.py", "sync/azwire.py", "sync/azfast.py")


@lru_cache(maxsize=1)
def bundle() -> bytes:
    """The sync engine as a zip python can import from (deterministic bytes, so re-sends can be skipped)."""
    root = Path(__file__).resolve().parent.parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in MODULES:
            info = zipfile.ZipInfo(f"gtrain/{rel}", date_time=(2020, 1, 1, 0, 0, 0))
            z.writestr(info, (root / rel).read_bytes())
    return buf.getvalue()
