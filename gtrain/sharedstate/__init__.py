"""Shared state in the team's object store: ``GTRAIN_STATE=s3://bucket/prefix`` (or ``gs://``, ``az://``, or
``state:`` in ``$GTRAIN_HOME/config.yaml``). No server: every change is a conditional write (see
``gtrain.sync.condput``), the local SQLite (``gtrain.state``) is the cache and, without a URL, the only store.

Layout under the prefix (docs/state.md):

- ``clusters/<cluster id>.json``: the cluster with its nodes, jobs, resources and cost intervals, one object;
- ``names/<name>.json``: which cluster id holds a live name (taken with create-only writes);
- ``leases/<name>.json``: who works on the cluster now, until when (``gtrain.sharedstate.lease``);
- ``runs/<cluster id>/...``: the run archive (events, metrics) as ``gtrain report`` / ``plot`` read it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError

if TYPE_CHECKING:
    from gtrain.state import StateStore
    from gtrain.sync.condput import CondStore
    from gtrain.sync.model import RemoteURL

_STORES: dict[str, CondStore] = {}
_LOCK = threading.Lock()


def _config_value(home: Path) -> tuple[str, str] | None:
    """``state:`` from ``$GTRAIN_HOME/config.yaml``: (value, field name for messages)."""
    path = home / "config.yaml"
    if not path.is_file():
        return None
    from gtrain.spec.loader import MAX_BYTES
    from gtrain.spec.loader import load as load_yaml_text

    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}", field="state",
                          hint=f"make {path} readable, or remove it (it holds `state: s3://BUCKET/PREFIX` only)") \
            from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start + 1} is 0x{raw[e.start]:02x}): it is not a "
                          "config file", field="state",
                          hint=f"write `state: s3://BUCKET/PREFIX` (or gs://, az://) in it, or remove {path}") \
            from None
    doc = load_yaml_text(text, str(path))
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} must be a mapping (state: s3://BUCKET/PREFIX)", field="state")
    unknown = sorted(set(doc) - {"state"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}", hint="the config file knows `state:` only",
                          field=unknown[0])
    value = doc.get("state")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"state in {path} must be a URL string, not {type(value).__name__}",
                          hint="state: s3://BUCKET/PREFIX (or gs://, az://)", field="state")
    return value, f"state (in {path})"


def state_url(home: Path) -> RemoteURL | None:
    """The shared state's URL, or None: local state only."""
    got = _state_value(home)
    return None if got is None else got[0]


def _state_value(home: Path) -> tuple[RemoteURL, str, str] | None:
    """(the shared state's URL, the field that named it, its text as written), or None: local state only."""
    raw = os.environ.get("GTRAIN_STATE")
    fld = "GTRAIN_STATE"
    if raw is None or not raw.strip():
        got = _config_value(home)
        if got is None:
            return None
        raw, fld = got
    from gtrain.sync.model import RemoteURL as _URL
    from gtrain.sync.objstore import parse_location

    loc = parse_location(raw.strip(), fld)
    if not isinstance(loc, _URL):
        raise ConfigError(f"{fld} {raw!r} is not an object store URL",
                          hint="write s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX", field=fld)
    return loc, fld, raw.strip()


def remote(home: Path) -> CondStore | None:
    """The conditional-write client of the shared state (one per URL per process), or None. Its errors are
    gtrain's, naming the field and its value (``gtrain.sharedstate.edge``)."""
    got = _state_value(home)
    if got is None:
        return None
    url, fld, raw = got
    key = f"{url.scheme}://{url.bucket}/{url.prefix}"
    with _LOCK:
        if key not in _STORES:
            from gtrain.sharedstate.edge import Guarded
            from gtrain.sync.condput import open_store

            _STORES[key] = Guarded(lambda: open_store(url), url, fld, raw)
        return _STORES[key]


def open_store(home: Path | None = None) -> StateStore:
    """The state store of this gtrain: the local SQLite, or (``GTRAIN_STATE`` / ``state:`` in
    ``$GTRAIN_HOME/config.yaml``) the shared objects with the SQLite as their cache."""
    from gtrain.state import StateStore, gtrain_home

    home = Path(home) if home else gtrain_home()
    shared = remote(home)
    if shared is None:
        return StateStore(home)
    from gtrain.sharedstate.store import SharedStateStore

    return SharedStateStore(shared, home)


from gtrain.state.identity import identity  # noqa: E402  re-exported

__all__ = ["identity", "open_store", "remote", "state_url"]
