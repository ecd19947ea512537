"""tensorflow: one worker per rank, started by gtrain's spawner, each with its ``TF_CONFIG`` for
``MultiWorkerMirroredStrategy`` (cluster.worker = every worker's address:port in rank order, worker r on
``MASTER_PORT + r``; task.index = rank)."""

from __future__ import annotations

from gtrain.jobs.launchers.base import SpawnedLauncher


class TensorFlow(SpawnedLauncher):
    name = "tensorflow"
    flavor = "tensorflow"


LAUNCHER = TensorFlow()
