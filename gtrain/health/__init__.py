"""Node health: checks before training (``gtrain health``, ``policies.preflight``) and GPU telemetry during it
(``gtrain status --gpus``, ``gtrain top``, ``policies.min_gpu_util``). See docs/health.md.

Modules: :mod:`~gtrain.health.model` (verdicts, report, policy models; imported by the spec, so kept light),
:mod:`~gtrain.health.nodeprobe` (stdlib-only, runs on the nodes), :mod:`~gtrain.health.gpu` (nvidia-smi CSV
parsed and judged), :mod:`~gtrain.health.probejob` (the all-reduce + silent-data-corruption job, run through
the cluster's job backend), :mod:`~gtrain.health.checks` (everything together), :mod:`~gtrain.health.telemetry`.
"""
