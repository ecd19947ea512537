"""Global rank 0 on node 0, by construction (issue 27): every multi-node launcher gtrain renders pins the node's
place from its node rank, never from the order the nodes join. Static rendezvous (torchrun's and accelerate's
``--rdzv_backend=static``) makes the group rank the ``--node_rank`` / ``--machine_rank`` given, so one run
that joins in the adverse order is as good as twenty; under c10d the node that joined first took group rank 0
(global rank 0 was on node 1 in 5 of 6 launches). Checked two ways:

- every launcher's command, rendered for every node of clusters of 1 to 8 nodes (no rendezvous that assigns
  ranks by arrival);
- the torchrun command run for real (2 nodes x 2 processes on this machine,
  the agents' rendezvous only: the rank script is a line of bash), node 1 started well before node 0."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtrain.jobs.launchers import NAMES, get_launcher
from gtrain.jobs.render import NodeContext, render_all

RANK_SH = 'echo "$GTRAIN_NODE_RANK $NODE_RANK $GROUP_RANK $RANK $LOCAL_RANK" > "$OUT/rank-$RANK"\n'
#: the flag by which each launcher's command names its node's place (jax and tensorflow: gtrain's spawner)
PLACE = {"torchrun": "--node_rank={}", "accelerate": "--machine_rank={}", "deepspeed": "--node_rank={}",
         "python": "--node-rank={}", "jax": "--node-rank={}", "tensorflow": "--node-rank={}"}


def _ctx(launcher: str, node: int, num_nodes: int, job_dir: Path, port: int = 29500) -> NodeContext:
    return NodeContext(job_id=f"place-{launcher}", cluster="place", node_rank=node, num_nodes=num_nodes,
                       node_ips=["127.0.0.1"] * num_nodes, node_addr="127.0.0.1", master_addr="127.0.0.1",
                       master_port=port, nproc_per_node=2, job_dir=str(job_dir), workdir=str(job_dir),
                       checkpoint_dir=str(job_dir / "ckpt"), python=sys.executable, argv=[], join_timeout=60,
                       launcher=launcher,
                       launcher_options={"_distributed_type": ""} if launcher == "accelerate" else {})


@pytest.mark.parametrize("launcher", NAMES)
def test_every_launcher_places_node_k_by_its_node_rank(launcher: str, tmp_path: Path) -> None:
    assert set(PLACE) == set(NAMES), "a new launcher: say how its command pins the node's place"
    for num_nodes in range(1, 9):
        for node in range(num_nodes):
            files = render_all(_ctx(launcher, node, num_nodes, tmp_path))
            cmd = get_launcher(launcher).node_command(_ctx(launcher, node, num_nodes, tmp_path))
            assert PLACE[launcher].format(node) in cmd, (launcher, num_nodes, node, cmd)
            assert "c10d" not in cmd and "etcd" not in cmd, cmd
            if launcher in ("torchrun", "accelerate", "deepspeed"):  # deepspeed: its torchrun fallback
                assert cmd.count("--rdzv_backend=static") == 1, cmd
            # GTRAIN_NODE_RANK and NODE_RANK (Lightning reads it) are the node rank on every launcher
            env = dict(re.findall(r"^export (GTRAIN_NODE_RANK|NODE_RANK)=(\S+)", files["launch.sh"], re.M))
            assert env == {"GTRAIN_NODE_RANK": str(node), "NODE_RANK": str(node)}, (launcher, env)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_global_rank_0_is_on_node_0_when_node_1_joins_first(tmp_path: Path) -> None:
    (tmp_path / "rank.sh").write_text(RANK_SH)
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    launchers = ("torchrun",)  # accelerate for real: test_launchers::test_accelerate_trains_two_by_two
    ports = {name: _port() for name in launchers}
    for node in (1, 0):  # node 1's agents first, node 0's a second later (under c10d: node 1 took rank 0)
        for name in launchers:
            out = tmp_path / f"out-{name}"
            out.mkdir(exist_ok=True)
            env_sh = f"export OUT={out} GTRAIN_NODE_RANK={node} NODE_RANK={node}\n"
            cmd = get_launcher(name).node_command(_ctx(name, node, 2, tmp_path, ports[name]))
            procs.append((name, subprocess.Popen(["bash", "-c", env_sh + cmd], stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True)))
        time.sleep(1.0)
    for name, p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, (name, out[-3000:])
    for name in launchers:
        got = {f.name: f.read_text().split() for f in (tmp_path / f"out-{name}").iterdir()}
        # node rank = GTRAIN_NODE_RANK = NODE_RANK = GROUP_RANK; global ranks 0, 1 on node 0
        assert got == {"rank-0": ["0", "0", "0", "0", "0"], "rank-1": ["0", "0", "0", "1", "1"],
                       "rank-2": ["1", "1", "1", "2", "0"], "rank-3": ["1", "1", "1", "3", "1"]}, (name, got)
