"""``gtrain sync``: mirror a local directory to or from an object store (``s3://``, ``gs://`` or ``az://``).

The engine here knows nothing about any SDK: each store is a :class:`Backend` (``gtrain.sync.s3``,
``gtrain.sync.gcs``, ``gtrain.sync.azure``), imported only when a sync needs it, which translates its own
SDK's errors into gtrain's. What the engine guarantees, whichever the store:

* **incremental** -- a manifest under ``$GTRAIN_HOME/sync/`` (sqlite, one per (local dir, remote URL))
  records, per file, what the local file was (size, mtime_ns, sha256, md5) when it last matched a remote
  object, and that object's version (S3 ETag / GCS generation). A file whose size+mtime_ns and whose
  listed remote size+version still match is skipped without being read; one listing of the prefix, no
  per-file request. A file present on both sides with the same size but not vouched for by the manifest is
  read once and compared with the store's md5 / the ``gtrain-sha256`` metadata before anything moves.
* **parallel** -- one thread pool over files; large files go through each SDK's own multipart (S3
  TransferConfig) or chunked resumable (GCS) machinery.
* **integrity** -- uploads carry ``gtrain-sha256`` metadata and the SDK's wire checksums (see the backends);
  downloads land in a temp file next to the final name, are checked against sha256 (else md5) while
  streaming or after, and only then renamed: never a partial or unverified file under a final name.
  Leftover temp files of an interrupted sync are removed by the next one; the manifest is committed as
  files complete, so a re-run moves only what is missing.
* **key safety** -- a remote key that would land outside the destination (``..``, absolute, empty
  components) refuses the whole download before anything is written; ``--delete`` never touches anything
  outside the prefix / the destination directory.
* **progress** -- ``on_progress`` receives :class:`ProgressEvent` s (throttled); the engine never prints.

This module is the entry point (:func:`sync`, :func:`parse_location`, and every name below re-exported). The
modules, by concern (none imports an SDK, pydantic, typer or rich: they also run on nodes, see
``gtrain.jobs.data``):

- :mod:`gtrain.sync.model`: the data types, the :class:`Backend` protocol and the defaults;
- :mod:`gtrain.sync.local`: scanning and hashing local files, temp files, keys that must stay inside the destination;
- :mod:`gtrain.sync.manifest`: the sqlite manifest and its lock;
- :mod:`gtrain.sync.engine`: planning, the transfer thread pool, deletes, progress.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gtrain.errors import ConfigError
from gtrain.sync.engine import Engine, Progress
from gtrain.sync.local import TMP_TAG, hash_file, safe_rel_from_key
from gtrain.sync.manifest import Manifest
from gtrain.sync.model import (
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    DEFAULT_WORKERS,
    META_SHA256,
    Action,
    Backend,
    Digests,
    MiB,
    ProgressEvent,
    RemoteObject,
    RemoteURL,
    SyncResult,
)

_SCHEMES = {"s3": "S3", "gs": "GCS", "az": "Azure"}
_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_LOOKS_LIKE_URL_RE = re.compile(r"^(s3|gs|gcs|s3a|s3n|az):(?!//)", re.IGNORECASE)
_S3_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GCS_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_AZ_CONTAINER_RE = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_IP_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_BAD_CHARS_RE = re.compile(r"[\x00-\x1f\x7f\\]")


# ---------------------------------------------------------------------------------------------- parsing


def parse_location(value: str, fld: str) -> Path | RemoteURL:
    """A local path, or ``s3://bucket[/prefix]`` / ``gs://bucket[/prefix]`` / ``az://container[/prefix]`` checked
    strictly."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{fld} is empty", hint="give a local directory or s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX",
                          field=fld)
    cred = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://[^/]*@", value)
    if cred:  # never repeated: the part before '@' is a key or a password
        raise ConfigError(f"{fld} {cred.group(1)}://***@...: credentials in a URL are refused (not shown here)",
                          hint="give credentials in the environment (AWS_ACCESS_KEY_ID, a profile, "
                               "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_KEY), never in the URL", field=fld)
    m = _URL_RE.match(value)
    if m is None:
        if _LOOKS_LIKE_URL_RE.match(value):
            raise ConfigError(f"{fld} {value!r} looks like a bucket URL but is malformed",
                              hint="write s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX",
                              field=fld)
        if "\x00" in value:
            raise ConfigError(f"{fld} contains a NUL byte", field=fld)
        return Path(value).expanduser()
    scheme, rest = m.group(1), m.group(2)
    if scheme not in _SCHEMES:
        hint = "gtrain sync speaks s3://, gs:// and az://"
        if scheme.lower() in _SCHEMES:
            hint = f"write the scheme in lower case: {scheme.lower()}://"
        elif scheme.lower() == "gcs":
            hint = "Google Cloud Storage URLs are gs://BUCKET/PREFIX"
        raise ConfigError(f"{fld} {value!r}: unsupported URL scheme {scheme!r}", hint=hint, field=fld)
    bucket, _, prefix = rest.partition("/")
    store = _SCHEMES[scheme]
    if not bucket:
        raise ConfigError(f"{fld} {value!r} has no bucket name", hint=f"write {scheme}://BUCKET/PREFIX", field=fld)
    ok = {"s3": _S3_BUCKET_RE, "gs": _GCS_BUCKET_RE, "az": _AZ_CONTAINER_RE}[scheme].match(bucket)
    if (not ok or ".." in bucket or _IP_RE.match(bucket)
            or (scheme == "gs" and any(len(p) > 63 for p in bucket.split(".")))):
        kind = "container" if scheme == "az" else "bucket"
        rule = ("container names are 3-63 lower-case letters, digits and single '-'" if scheme == "az" else
                "bucket names are 3-63 lower-case letters, digits, '-' and '.'"
                + (" (and '_' on GCS)" if scheme == "gs" else ""))
        raise ConfigError(f"{fld} {value!r}: {bucket!r} is not a valid {store} {kind} name", hint=rule, field=fld)
    if prefix.endswith("/"):
        prefix = prefix[:-1]
    if prefix:
        if _BAD_CHARS_RE.search(prefix):
            raise ConfigError(f"{fld} {value!r}: the prefix holds a control character or a backslash",
                              field=fld)
        parts = prefix.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"{fld} {value!r}: the prefix may not hold empty, '.' or '..' components",
                              hint=f"write {scheme}://{bucket}/some/prefix", field=fld)
    return RemoteURL(scheme, bucket, prefix)


# ---------------------------------------------------------------------------------------------- backends


def make_backend(url: RemoteURL, *, fld: str, client_factory: Callable[[], Any] | None = None,
                 workers: int = DEFAULT_WORKERS, multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
                 part_size: int = DEFAULT_PART_SIZE) -> Backend:
    client = client_factory() if client_factory is not None else None
    if url.scheme == "az":
        from gtrain.sync.azure import AzureBackend

        if client is None:  # the compiled engine where it serves this environment (gtrain.sync.azfast)
            from gtrain.sync import azfast

            if azfast.usable():
                return azfast.ObstoreAzureBackend(fld=fld, workers=workers, multipart_threshold=multipart_threshold,
                                                  part_size=part_size)
        return AzureBackend(client, fld=fld, workers=workers, multipart_threshold=multipart_threshold,
                            part_size=part_size)
    if url.scheme == "s3":
        from gtrain.sync.s3 import S3Backend

        if client is None:  # the compiled engine where it serves this environment (gtrain.sync.s3fast)
            from gtrain.sync import s3fast

            fast = s3fast.ObstoreS3Backend(fld=fld, workers=workers, multipart_threshold=multipart_threshold,
                                           part_size=part_size)
            if s3fast.usable(fast.wire.settings):
                return fast
            client = fast.wire
        return S3Backend(client, fld=fld, workers=workers, multipart_threshold=multipart_threshold,
                         part_size=part_size)
    from gtrain.sync.gcs import GCSBackend

    return GCSBackend(client, fld=fld, workers=workers, multipart_threshold=multipart_threshold,
                      part_size=part_size)


# ---------------------------------------------------------------------------------------------- sync


def sync(src: str, dst: str, *, delete: bool = False, dry_run: bool = False, workers: int = DEFAULT_WORKERS,
         on_progress: Callable[[ProgressEvent], None] | None = None, client_factory: Callable[[], Any] | None = None,
         multipart_threshold: int | None = None, part_size: int | None = None) -> SyncResult:
    """Make ``dst`` hold what ``src`` holds (one side a local directory, the other ``s3://``/``gs://``/``az://``).

    ``delete`` also removes what ``dst`` holds beyond ``src`` (within the prefix / directory only);
    ``dry_run`` plans (and may read local files to compare) but changes nothing, the plan in
    ``result.actions``. ``client_factory`` returns the wire client to use (``S3Wire`` / ``AzureWire``, or for GCS
    any object with an ``api_endpoint``); default: built from the environment. ``multipart_threshold`` /
    ``part_size`` tune the SDKs' multipart/chunked transfers (defaults 32 MiB / 16 MiB).
    """
    t0 = time.monotonic()
    s, d = parse_location(src, "SRC"), parse_location(dst, "DST")
    if isinstance(s, RemoteURL) and isinstance(d, RemoteURL):
        raise ConfigError(f"cannot sync {src} to {dst}: bucket-to-bucket sync is not supported",
                          hint="one side must be a local directory", field="DST")
    if not isinstance(s, RemoteURL) and not isinstance(d, RemoteURL):
        raise ConfigError(f"cannot sync {src} to {dst}: neither side is a bucket URL",
                          hint="one side must be s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX "
                               "(use rsync for local copies)",
                          field="DST")
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, not {workers}", field="workers")
    threshold = DEFAULT_MULTIPART_THRESHOLD if multipart_threshold is None else multipart_threshold
    psize = DEFAULT_PART_SIZE if part_size is None else part_size
    if psize < 256 * 1024 or threshold < 1:
        raise ConfigError(f"part_size must be at least 256 KiB (got {psize})", field="part_size")

    if isinstance(d, RemoteURL):
        assert isinstance(s, Path)
        local, url, direction, rfld = s, d, "upload", "DST"
        if not local.exists():
            raise ConfigError(f"SRC {src!r} does not exist", field="SRC")
        if not local.is_dir():
            raise ConfigError(f"SRC {src!r} is not a directory", hint="gtrain sync mirrors directories", field="SRC")
    else:
        assert isinstance(s, RemoteURL) and isinstance(d, Path)
        local, url, direction, rfld = d, s, "download", "SRC"
        if local.exists() and not local.is_dir():
            raise ConfigError(f"DST {dst!r} exists and is not a directory", field="DST")

    result = SyncResult(src=src, dst=dst, direction=direction, dry_run=dry_run)  # type: ignore[arg-type]
    backend = make_backend(url, fld=rfld, client_factory=client_factory, workers=workers,
                           multipart_threshold=threshold, part_size=psize)
    try:
        manifest = Manifest(local, url, readonly=dry_run)
        try:
            # a backend with an upload journal resumes (or aborts) what a killed sync left unfinished
            journaled = direction == "upload" and not dry_run and hasattr(backend, "attach_journal")
            if journaled:
                backend.attach_journal(manifest)  # type: ignore[attr-defined]
            Engine(local, url, direction, backend, manifest, result, delete=delete, dry_run=dry_run,
                   workers=workers, progress=Progress(on_progress)).run()
            if journaled:
                backend.sweep_journal(url)  # type: ignore[attr-defined]
        finally:
            manifest.close()
    finally:
        backend.close()
    result.actions.sort(key=lambda a: (a.kind, a.path))
    result.seconds = time.monotonic() - t0
    return result


__all__ = ["Action", "Backend", "Digests", "ProgressEvent", "RemoteObject", "RemoteURL", "SyncResult",
           "hash_file", "make_backend", "parse_location", "safe_rel_from_key", "sync", "DEFAULT_MULTIPART_THRESHOLD",
           "DEFAULT_PART_SIZE", "DEFAULT_WORKERS", "META_SHA256", "MiB", "TMP_TAG"]
