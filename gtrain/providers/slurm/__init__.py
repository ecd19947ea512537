"""Slurm as a provider (a recorded cluster, checked at `up`) and a job backend (one sbatch job per launch)."""

from gtrain.providers.slurm.provider import SlurmProvider

__all__ = ["SlurmProvider"]
