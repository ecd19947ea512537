"""python: the script nproc_per_node times per node, started by gtrain's spawner, with the torch-style
env set (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``NODE_RANK``): for Lightning and frameworks that bring their own launcher logic."""

from __future__ import annotations

from gtrain.jobs.launchers.base import SpawnedLauncher


class Python(SpawnedLauncher):
    name = "python"
    flavor = "python"


LAUNCHER = Python()
