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

__all__ = ["ENTRY_POINT_GROUP", "PLANNED", "REGISTRY", "check_providers", "get_provider", "provider_class",
           "provider_names", "register", "unregister"]

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.base import Provider, ProviderCheck
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


def attach_providers() -> list[str]:
    """The providers whose class can find a cluster by its tags (``gtrain attach``: it overrides
    ``find_by_name``), for the message that names them; a provider whose module cannot be imported is left out."""
    from gtrain.providers.base import Provider

    out = []
    for name in provider_names():
        try:
            if provider_class(name).find_by_name is not Provider.find_by_name:
                out.append(name)
        except ConfigError:
            continue
    return out


def get_provider(name: str, store: StateStore, report: Reporter | None = None) -> Provider:
    from gtrain.events import SILENT

    return provider_class(name)(store, report or SILENT)



def check_providers(names: list[str], timeout: float = 10.0) -> list[ProviderCheck]:
    """``gtrain check``: each provider's own check (``registry.CHECKS``, else its class's ``check``), all at once,
    read-only, in ``names``' order. A check that has not answered in ``timeout`` s is reported as such and left
    behind on a daemon thread (it never holds the process); what it raises is its one line and its fix."""
    import threading
    import time

    results: dict[str, ProviderCheck] = {}
    threads = []
    for name in names:
        t = threading.Thread(target=_check_one, args=(name, timeout, results), daemon=True,
                             name=f"gtrain-check-{name}")
        t.start()
        threads.append(t)
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    from gtrain.providers.base import ProviderCheck

    return [results.get(n) or ProviderCheck(n, False, f"no answer in {timeout:g} s",
                                            fix=f"check the network or the endpoint, then `gtrain check {n}`",
                                            seconds=round(timeout, 2)) for n in names]


def _check_one(name: str, timeout: float, results: dict[str, ProviderCheck]) -> None:
    import time

    from gtrain.errors import GtrainError
    from gtrain.providers.base import ProviderCheck
    from gtrain.registry import check_function

    t0 = time.monotonic()
    try:
        fn = check_function(name) or getattr(provider_class(name), "check", None)
        if fn is None:
            got = ProviderCheck(name, False, "this provider has no check", fix="see its documentation")
        else:
            got = fn(timeout)
            if not isinstance(got, ProviderCheck):
                got = ProviderCheck(name, False, f"its check answered {type(got).__name__}, not a ProviderCheck")
    except ModuleNotFoundError as e:
        got = ProviderCheck(name, False, f"a module it needs is not installed ({e.name})",
                            fix=f"pip install 'gtrain[{name}]'")
    except GtrainError as e:
        got = ProviderCheck(name, False, e.message if hasattr(e, "message") else str(e), fix=e.hint)
    except Exception as e:  # noqa: BLE001 - one provider's failure is its line, never the command's
        got = ProviderCheck(name, False, f"the check failed: {type(e).__name__}: {e}".splitlines()[0])
    got.seconds = round(time.monotonic() - t0, 2)
    results[name] = got
