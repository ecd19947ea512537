"""accelerate: ``accelerate launch`` (torchrun underneath, so ``RANK`` is set on every rank) with the
multi-node fields gtrain must set: ``--num_machines``, ``--machine_rank``, ``--main_process_ip/port``,
``--num_processes`` (the total), ``--rdzv_backend static`` (group rank = machine rank = node rank). A user
``config_file`` is passed through; what it says about those fields is overridden by the flags, with a warning."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError
from gtrain.jobs.launchers.base import Launcher, config_file

if TYPE_CHECKING:
    from gtrain.jobs.templating import NodeContext
    from gtrain.spec import ClusterSpec

#: config keys gtrain sets on the command line (they win over the file)
GTRAIN_SETS = ("num_machines", "machine_rank", "main_process_ip", "main_process_port", "num_processes",
               "rdzv_backend")
#: distributed types whose own launcher path accelerate picks from the file (gtrain adds no --multi_gpu)
OWN_PATH = ("DEEPSPEED", "FSDP", "MEGATRON_LM")


class Accelerate(Launcher):
    name = "accelerate"
    starter = "accelerate launch (torchrun underneath)"

    def _config(self, path: Path) -> dict[str, Any]:
        from gtrain.spec import loader as specyaml

        try:
            # the spec's loader: its limits (depth, size, aliases, long numbers) hold for this file too
            data = specyaml.load(path.read_text(), f"job.accelerate.config_file {path.name!r}", merge=True)
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"job.accelerate.config_file: cannot read {path.name!r}: {e}",
                              field="job.accelerate.config_file") from None
        except ConfigError as e:
            raise ConfigError(e.message, hint=e.hint, field="job.accelerate.config_file") from None
        if not isinstance(data, dict):
            raise ConfigError(f"job.accelerate.config_file: {path.name!r} is not a mapping of accelerate settings",
                              hint="write it with `accelerate config`", field="job.accelerate.config_file")
        return data

    def check(self, spec: ClusterSpec, workdir: Path, nproc: int) -> tuple[dict[str, Any], list[str]]:
        job = spec.job
        opts = self.options(job.accelerate.model_dump() if job and job.accelerate else {})
        path = config_file("job.accelerate.config_file", opts.config_file, workdir)
        if path is None:
            return {}, []
        data = self._config(path)
        derived = {"_distributed_type": str(data.get("distributed_type") or "")}
        tried = [k for k in GTRAIN_SETS if k in data]
        if not tried:
            return derived, []
        return derived, [f"job.accelerate.config_file {opts.config_file!r} sets {', '.join(tried)}: gtrain sets "
                         f"them for this cluster ({spec.num_nodes} node(s) x {nproc}); the file's values are not used"]

    def node_command(self, ctx: NodeContext) -> str:
        dtype = str(ctx.launcher_options.get("_distributed_type") or "").upper()
        return self._render(ctx, multi=ctx.num_nodes * ctx.nproc_per_node > 1 and dtype not in OWN_PATH,
                            deepspeed_path=dtype == "DEEPSPEED")

    def options(self, raw: dict[str, Any]) -> Any:
        return super().options({k: v for k, v in raw.items() if not k.startswith("_")})


LAUNCHER = Accelerate()
