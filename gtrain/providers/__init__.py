"""Provider registry: name -> ``"module:Class"``, imported only when a cluster of that provider is used, so
`gtrain --help` and `gtrain status` never import a cloud SDK or paramiko.

The built-in providers are listed in :data:`REGISTRY`; a provider in its own package registers through the
``gtrain.providers`` entry-point group (``name = "pkg.module:Class"``), as TorchX schedulers do, or at run
time with :func:`register`. Everything else (the spec's provider sections -- one per registered name, read
only by that provider --, `gtrain gc`, the CLI's cost confirmation) asks the registry and the provider
class, never a provider's name.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError
from gtrain.registry import (
    _ADDED,
    ENTRY_POINT_GROUP,
    PLANNED,
    REGISTRY,
    _target,
    provider_names,
)
from gtrain.registry import (
    _entry_points as _entry_points,
)

__all__ = ["ENTRY_POINT_GROUP", "PLANNED", "REGISTRY", "get_provider", "provider_class", "provider_names",
           "register", "unregister"]

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.base import Provider
    from gtrain.state import StateStore

def register(name: str, target: str) -> None:
    """Add a provider at run time (``"module:Class"``); a plug-in package would use the entry point instead."""
    _ADDED[name] = target
    provider_class.cache_clear()


def unregister(name: str) -> None:
    _ADDED.pop(name, None)
    provider_class.cache_clear()


@cache
def provider_class(name: str) -> type[Provider]:
    """The provider's class (its module imported; the SDK it uses is not, until used)."""
    target = _target(name)
    if target is None:
        why = PLANNED.get(name, "not available in this version of gtrain")
        raise ConfigError(f"provider {name!r} is {why}", hint=f"available: {', '.join(provider_names())}",
                          field="provider")
    mod, _, cls = target.partition(":")
    try:
        module = importlib.import_module(mod)
    except ModuleNotFoundError as e:
        raise ConfigError(f"provider {name!r}: its module {mod!r} cannot be imported ({e})",
                          hint="is the package that provides it installed?", field="provider") from None
    klass: type[Provider] = getattr(module, cls)
    return klass


def get_provider(name: str, store: StateStore, report: Reporter | None = None) -> Provider:
    from gtrain.events import SILENT

    return provider_class(name)(store, report or SILENT)

