"""The spec's fields set on the command line of up / launch / run: ``--env K=V`` (repeatable), ``--num-nodes``,
``--gpus``/``--accelerators``, ``--spot/--on-demand``, ``--name``. Each is written into the spec's mapping before
the spec models validate it, so a flag is held to the same rules as the field; a refusal names the flag."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from gtrain.spec import ClusterSpec

ENV: Any = typer.Option(None, "--env", "-e", metavar="K=V", show_default=False,
                        help="Set job.env K to V (repeatable; overrides the spec's value).")
NUM_NODES: Any = typer.Option(None, "--num-nodes", metavar="N", show_default=False,
                              help="Nodes of the cluster (overrides num_nodes:).")
GPUS: Any = typer.Option(None, "--gpus", "--accelerators", metavar="GPU:COUNT", show_default=False,
                         help="GPUs per node, e.g. A100:8 (overrides resources.accelerators).")
SPOT: Any = typer.Option(None, "--spot/--on-demand", show_default=False,
                         help="Spot / preemptible or on-demand capacity (overrides resources.use_spot).")


@dataclass
class Overrides:
    env: list[str] = field(default_factory=list)
    num_nodes: int | None = None
    gpus: str | None = None
    spot: bool | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        import sys

        from gtrain.errors import ConfigError

        if self.spot is not None:  # a --spot/--on-demand pair keeps the last: both given is a contradiction
            argv = sys.argv[1:]
            argv = argv[:argv.index("--")] if "--" in argv else argv
            if "--spot" in argv and "--on-demand" in argv:
                raise ConfigError("--spot and --on-demand given together; they contradict each other",
                                  field="--spot", hint="give one of them (or neither: the spec's resources.use_spot)")

    def flags(self) -> dict[str, str]:
        """The spec field each given flag sets -> the flag as the user wrote it (values of --env left out)."""
        got: dict[str, str] = {}
        if self.name is not None:
            got["name"] = f"--name {self.name}"
        if self.num_nodes is not None:
            got["num_nodes"] = f"--num-nodes {self.num_nodes}"
        if self.gpus is not None:
            got["resources.accelerators"] = f"--gpus {self.gpus}"
        if self.spot is not None:
            got["resources.use_spot"] = "--spot" if self.spot else "--on-demand"
        if self.env:
            got["job.env"] = "--env " + ", --env ".join(kv.split("=", 1)[0] for kv in self.env)
        return got

    def apply(self, data: dict[str, Any]) -> dict[str, Any]:
        from gtrain.errors import ConfigError

        data = dict(data)
        if self.num_nodes is not None:
            data["num_nodes"] = self.num_nodes
        if self.gpus is not None or self.spot is not None:
            res = data.get("resources")
            res = dict(res) if isinstance(res, dict) else {}
            if self.gpus is not None:
                _no_gpus_on_tpu(res.get("accelerators"), self.gpus)
                res["accelerators"] = self.gpus
            if self.spot is not None:
                res["use_spot"] = self.spot
            data["resources"] = res
        if self.env:
            job = data.get("job")
            if not isinstance(job, dict):
                raise ConfigError("--env: the spec has no job: section to set it in", field="--env",
                                  hint="add a job: section, or drop --env (up does without a job)")
            env = dict(job.get("env") or {})
            for kv in self.env:
                k, eq, v = kv.partition("=")
                if not eq or not k:
                    raise ConfigError(f"--env {kv!r}: must be NAME=VALUE", field="--env", hint="e.g. --env LR=0.01")
                env[k] = v
            data["job"] = {**job, "env": env}
        return data

    def load(self, path: str) -> ClusterSpec:
        """The spec at ``path`` with these overrides; a value a flag gave that the spec refuses names the flag."""
        from gtrain.errors import ConfigError
        from gtrain.spec import load_spec

        try:
            return load_spec(path, name=self.name, edit=self.apply)
        except ConfigError as e:
            if self._flag_of(e.field) is None:
                raise
            try:  # the spec alone is bad too: its own error, not the flag's
                load_spec(path)
            except ConfigError:
                raise e from None
            raise self.blame(e) from None

    def blame(self, e: BaseException) -> BaseException:
        """``e`` naming the flag when it is a refusal of a field a flag set (the provider's plan refuses
        ``--gpus BANANA`` after the models took it), else ``e`` itself."""
        from gtrain.errors import ConfigError

        flag = self._flag_of(e.field) if isinstance(e, ConfigError) else None
        if flag is None or not isinstance(e, ConfigError):
            return e
        opt = flag.split()[0]
        return ConfigError(f"{flag}: {e.message.removeprefix('invalid spec: ')}", field=opt,
                           hint=e.hint or f"give {opt} a value the spec's {e.field} takes (docs/spec.md)")

    def _flag_of(self, fld: str | None) -> str | None:
        if not fld:
            return None
        for path, flag in self.flags().items():
            if fld == path or fld.startswith(path + "."):
                return flag
        return None

    def note(self) -> str | None:
        """One line for the plan: what the command line changed."""
        got = self.flags()
        return "from the command line: " + ", ".join(got.values()) if got else None


def _no_gpus_on_tpu(spec_value: object, flag: str) -> None:
    """``--gpus A100:8`` on a spec that names a Cloud TPU slice: GPUs on a TPU spec (its provider, num_nodes and
    nproc follow the slice) is a mistake, not an override; another slice type is fine."""
    from gtrain.errors import ConfigError
    from gtrain.registry import accelerator_family

    if isinstance(spec_value, str) and accelerator_family(spec_value) and not accelerator_family(flag):
        raise ConfigError(f"--gpus {flag}: the spec names a Cloud TPU slice ({spec_value}); --gpus sets GPUs",
                          field="--gpus", hint="give another slice type (--accelerators tpu-v5p-16), or change "
                          "resources.accelerators in the spec")
