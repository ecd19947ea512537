"""Launchers: what starts a job's ranks on a node (torchrun, accelerate, deepspeed, jax, tensorflow, python).

``get_launcher(name)`` gives the :class:`~gtrain.jobs.launchers.base.Launcher` registered under ``name``;
``register`` adds one. See docs/launchers.md for the node contract each of them keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gtrain.spec.launchers import DEFAULT, NAMES

if TYPE_CHECKING:
    from gtrain.jobs.launchers.base import Launcher

__all__ = ["DEFAULT", "NAMES", "get_launcher", "launcher_names", "register"]

_REGISTRY: dict[str, Launcher] = {}


def register(launcher: Launcher) -> Launcher:
    _REGISTRY[launcher.name] = launcher
    return launcher


def _load_builtin() -> None:
    from gtrain.jobs.launchers import accelerate, deepspeed, jax, python, tensorflow, torchrun

    for mod in (torchrun, accelerate, deepspeed, jax, tensorflow, python):
        if mod.LAUNCHER.name not in _REGISTRY:
            register(mod.LAUNCHER)


def launcher_names() -> list[str]:
    _load_builtin()
    return list(_REGISTRY)


def get_launcher(name: str | None) -> Launcher:
    _load_builtin()
    try:
        return _REGISTRY[name or DEFAULT]
    except KeyError:
        from gtrain.errors import ConfigError

        raise ConfigError(f"job.launcher: {name!r} is not a launcher",
                          hint=f"one of {', '.join(launcher_names())}", field="job.launcher") from None
