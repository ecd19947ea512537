"""The node context and the jinja2 environment the per-node scripts are rendered with (``templates/``).
Every value a user controls reaches the shell only through the ``q`` filter (``shlex.quote``);
StrictUndefined makes a missing variable an error."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any


def templates_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    shipped = here / "templates"  # inside the wheel
    return shipped if shipped.is_dir() else here.parent / "templates"  # source checkout


def shell_quote(value: Any) -> str:
    return shlex.quote(str(value))


@lru_cache(maxsize=1)
def _env() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
    )
    env.filters["q"] = shell_quote
    env.globals["nodebeat_source"] = nodebeat_source
    return env


@lru_cache(maxsize=1)
def nodebeat_source() -> str:
    """The node's heartbeat sender and node 0's aggregator (gtrain.remote.nodebeat), run by launch.sh from a
    heredoc (templates/_heartbeat.sh.j2)."""
    from gtrain.remote import nodebeat

    return Path(nodebeat.__file__).read_text(encoding="utf-8").rstrip("\n")


@dataclass
class NodeContext:
    """Everything a node's scripts are rendered from. No secret values: only their names."""

    job_id: str
    cluster: str
    node_rank: int
    num_nodes: int
    node_ips: list[str]
    node_addr: str
    master_addr: str
    master_port: int
    nproc_per_node: int
    job_dir: str
    workdir: str
    checkpoint_dir: str
    python: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    secret_names: list[str] = field(default_factory=list)
    setup: str | None = None
    max_restarts: int = 0
    join_timeout: int = 300
    #: elastic (``num_nodes: {min, max}``): the fewest nodes torchrun trains on; 0: a fixed world of num_nodes
    min_nodes: int = 0
    max_nodes: int = 0  # elastic: the most nodes (num_nodes: the nodes there are now, min..max)
    last_call_timeout: int = 1  # elastic: how long a rendezvous that has min nodes waits for more (seconds)
    keep_alive_interval: int = 5  # elastic: a node's rendezvous heartbeat; 3 missed: the node is dead
    read_timeout: int = 60  # elastic: c10d's store connect/read timeout (gtrain.spec.elastic: grows with the nodes)
    launcher: str = "torchrun"  # a name in gtrain.jobs.launchers
    launcher_options: dict[str, Any] = field(default_factory=dict)  # job.<launcher>, + what its check derived
    launcher_notes: list[str] = field(default_factory=list)  # warnings from the launcher's local check
    checkpoint_store: str = ""  # durable runs: see gtrain.checkpoints
    checkpoint_key: str = ""  # the run's folder in the store (<cluster>/<run_id>); "" = the job id
    # job.image (gtrain.containers): `docker run ... IMAGE` for the launcher and for setup; empty: no container
    container_argv: list[str] = field(default_factory=list)
    container_setup_argv: list[str] = field(default_factory=list)
    container_runtime: str = ""
    container_name: str = ""
    checkpoint_env: dict[str, str] = field(default_factory=dict)  # job.checkpoint_tuning as GTRAIN_* variables
    #: job.fault_tolerance: "torchft" (each node its own torchft replica group: templates/launchers/torchft.sh.j2)
    fault_tolerance: str = ""
    #: torchft mode: ``lighthouse`` (its URL, every rank's TORCHFT_LIGHTHOUSE), and where node 0 runs it: ``port``
    #: (0: the user runs it), ``bind``, ``args`` (gtrain/jobs/launchers/torchft_lighthouse.py's)
    torchft: dict[str, Any] = field(default_factory=dict)


def render(name: str, ctx: NodeContext, **extra: Any) -> str:
    return str(_env().get_template(f"{name}.j2").render(**asdict(ctx), **extra))


