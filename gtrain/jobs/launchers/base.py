"""The ``Launcher`` interface: what starts a job's ranks on one node.

A launcher knows its options model (``job.<name>``), the env it sets on every rank, how many ranks a node
gets by default, what it refuses (``check``: exit 2 naming the field), the files it needs in the job
directory (``node_files``: ``rank.sh`` always) and the bash command line that starts one node's ranks
(``node_command``). Every launcher keeps one node contract (docs/launchers.md): each global rank runs through
``JOB/rank.sh`` with ``RANK`` set, which writes ``logs/rank-R.log`` and ``logs/rank-R.exit`` ("rc time"); the
command exits with the first non-zero rank code of its node (0 when all succeeded).

A backend uses it so: render the node's context (:class:`gtrain.jobs.render.NodeContext`), write
``node_files(ctx)`` under ``ctx.job_dir``, export the ``GTRAIN_*`` environment (``templates/_env.sh.j2``),
``cd`` to the workdir and run ``node_command(ctx)`` -- from ``launch.sh`` (node scripts) or once per node from
``srun`` (Slurm).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gtrain.errors import ConfigError
from gtrain.spec.launchers import OPTION_MODELS, RESERVED_BY

if TYPE_CHECKING:
    from gtrain.jobs.templating import NodeContext
    from gtrain.spec import ClusterSpec

SHIPPED = Path(__file__).resolve().parent  # spawn.py and jaxrun.py are copied to the nodes as they are


class Launcher(ABC):
    name: ClassVar[str]
    #: who starts rank.sh, in words (the comment at the top of rank.sh)
    starter: ClassVar[str]

    @property
    def reserved_env(self) -> set[str]:
        """The per-rank variables this launcher sets: ``job.env`` may not shadow them."""
        return set(RESERVED_BY[self.name])

    def options(self, raw: dict[str, Any]) -> Any:
        """This launcher's options model from ``job.<name>`` (its defaults when the block is absent)."""
        model = OPTION_MODELS.get(self.name)
        return model.model_validate(raw) if model is not None else None

    def default_nproc(self, gpus_per_node: int) -> int:
        """Ranks per node when ``job.nproc_per_node`` is not given: the node's GPUs, else 1."""
        return gpus_per_node or 1

    def check(self, spec: ClusterSpec, workdir: Path, nproc: int) -> tuple[dict[str, Any], list[str]]:
        """Refuse what this launcher cannot do (``ConfigError`` naming the field). Returns what the command
        needs from the local workdir (added to ``ctx.launcher_options`` under ``_`` names) and warnings."""
        return {}, []

    def node_files(self, ctx: NodeContext) -> dict[str, str]:
        """Files the command needs in ``ctx.job_dir``, by name."""
        from gtrain.jobs.templating import render

        return {"rank.sh": render("rank.sh", ctx, launcher_starter=self.starter)}

    @abstractmethod
    def node_command(self, ctx: NodeContext) -> str:
        """The bash command line that starts this node's ranks, run from the workdir with the ``GTRAIN_*``
        environment exported; it ends when they all have and exits with the node's code."""

    # ---- helpers for the launchers ----------------------------------------------------------------

    def _render(self, ctx: NodeContext, template: str | None = None, **extra: Any) -> str:
        from gtrain.jobs.templating import render

        return render(f"launchers/{template or self.name}.sh", ctx, options=self.options(ctx.launcher_options),
                      **extra).strip()


def config_file(field: str, rel: str | None, workdir: Path) -> Path | None:
    """A launcher's config file, relative to the workdir; exit 2 naming the field when it is not there."""
    if rel is None:
        return None
    p = workdir / rel
    if not p.is_file():
        raise ConfigError(f"{field}: {rel!r} does not exist in the workdir {str(workdir)!r}",
                          hint="give a path relative to job.workdir, to a file that is there", field=field)
    return p


class SpawnedLauncher(Launcher):
    """Launchers whose ranks gtrain's own per-node spawner (``spawn.py``, stdlib only) starts: it sets
    ``RANK = node_rank * nproc + local_rank`` and the rest, runs each rank through ``rank.sh``, and stops the
    node's other ranks as soon as one fails (fail-fast within the node), exiting with that rank's code."""

    starter = "gtrain's spawner (spawn.py; it sets RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK, ...)"
    flavor: ClassVar[str]

    def node_files(self, ctx: NodeContext) -> dict[str, str]:
        return {**super().node_files(ctx), "spawn.py": (SHIPPED / "spawn.py").read_text()}

    def rank_argv(self, ctx: NodeContext) -> list[str]:
        return list(ctx.argv)

    def node_command(self, ctx: NodeContext) -> str:
        return self._render(ctx, "spawn", flavor=self.flavor, rank_argv=self.rank_argv(ctx))
