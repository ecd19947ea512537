"""Global rank 0 on node 0: the torchrun command gtrain renders, run for real (2 nodes x 2 processes on this
machine, gloo-free: only the agents' rendezvous), with node 1 started first each time (under c10d the node
that joined first took group rank 0)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from gtrain.jobs.launchers import get_launcher
from gtrain.jobs.render import NodeContext

RANK_SH = 'echo "$GTRAIN_NODE_RANK $NODE_RANK $GROUP_RANK $RANK $LOCAL_RANK" > "$OUT/rank-$RANK"\n'


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(node: int, job_dir: Path, port: int, launch: int) -> str:
    ctx = NodeContext(job_id=f"place-{launch}", cluster="place", node_rank=node, num_nodes=2,
                      node_ips=["127.0.0.1", "127.0.0.1"], node_addr="127.0.0.1", master_addr="127.0.0.1",
                      master_port=port, nproc_per_node=2, job_dir=str(job_dir), workdir=str(job_dir),
                      checkpoint_dir=str(job_dir / "ckpt"), python=sys.executable, argv=[], join_timeout=60)
    return get_launcher("torchrun").node_command(ctx)


def test_global_rank_0_is_on_node_0_in_every_launch(tmp_path: Path) -> None:
    (tmp_path / "rank.sh").write_text(RANK_SH)
    for launch in range(6):
        out = tmp_path / f"out-{launch}"
        out.mkdir()
        port = _port()
        procs = []
        for node in (1, 0):  # node 1 joins first
            env_sh = f"export OUT={out} GTRAIN_NODE_RANK={node} NODE_RANK={node}\n"
            procs.append(subprocess.Popen(["bash", "-c", env_sh + _command(node, tmp_path, port, launch)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            time.sleep(0.5)
        for p in procs:
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
        got = {f.name: f.read_text().split() for f in out.iterdir()}
        # node rank = GTRAIN_NODE_RANK = NODE_RANK = GROUP_RANK; global ranks 0, 1 on node 0
        assert got == {"rank-0": ["0", "0", "0", "0", "0"], "rank-1": ["0", "0", "0", "1", "1"],
                       "rank-2": ["1", "1", "1", "2", "0"], "rank-3": ["1", "1", "1", "3", "1"]}, (launch, got)
