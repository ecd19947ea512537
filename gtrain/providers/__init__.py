"""Provider registry: name -> "module:Class", imported only when a cluster of that provider is used,
so `gtrain --help` and `gtrain status` never import a cloud SDK or paramiko."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.base import Provider
    from gtrain.state import StateStore

REGISTRY: dict[str, str] = {
    "local": "gtrain.providers.local:LocalProvider",
    "aws": "gtrain.providers.aws:AWSProvider",
    "gcp": "gtrain.providers.gcp:GCPProvider",
    "ssh": "gtrain.providers.ssh:SSHProvider",
}


def get_provider(name: str, store: StateStore, report: Reporter | None = None) -> Provider:
    from gtrain.events import SILENT

    target = REGISTRY.get(name)
    if target is None:
        raise ConfigError(
            f"provider {name!r} is not available in this version of gtrain",
            hint=f"available: {', '.join(sorted(REGISTRY))}",
            field="provider",
        )
    mod, cls = target.split(":")
    klass = getattr(importlib.import_module(mod), cls)
    return klass(store, report or SILENT)  # type: ignore[no-any-return]
