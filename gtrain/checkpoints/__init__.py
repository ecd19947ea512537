"""Durable runs: checkpoints streamed from the nodes to an object store, restored on every launch, and the
recovery loop run by whoever waits on the job (see docs/durable.md).

- :mod:`gtrain.checkpoints.store`: the store layout, per-checkpoint manifests, upload, listing, restore
  (stdlib + gtrain's sync engine: it runs on the nodes too, from ``gtrain-ckpt.pyz``);
- :mod:`gtrain.checkpoints.node`: what runs beside the job on each node (restore, the uploader, the
  spot / preemption notice watcher), stdlib only;
- :mod:`gtrain.runs.ship`: the bundle, the store probe at launch, the relaunch of a job's next attempt;
- :mod:`gtrain.runs.recovery`: detecting a lost node and recovering, with no controller;
- :mod:`gtrain.spec.checkpoints`: the spec's models (``policies.recovery``).
"""
