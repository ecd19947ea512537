"""gtrain: run PyTorch training on GPU machines it rents, and leave nothing running that nobody watches.

The Python API (``gtrain.up``, ``gtrain.launch``, ``gtrain.wait``, ``gtrain.logs``, ``gtrain.pull``,
``gtrain.down``, ``gtrain.status``, ``gtrain.cost``, ``gtrain.run``) is loaded on first use, so importing
gtrain stays cheap.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself costs ~5 ms of start-up

if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"
__all__ = ["up", "launch", "logs", "wait", "pull", "down", "stop", "start", "status", "cost", "run", "cancel",
           "exec_command",
           "__version__"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gtrain import api

        return getattr(api, name)
    raise AttributeError(f"module 'gtrain' has no attribute {name!r}")
