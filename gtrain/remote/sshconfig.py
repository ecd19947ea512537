"""``$GTRAIN_HOME/ssh/config``: one OpenSSH ``Host <cluster>-<k>`` block per node of every live cluster
reached over SSH, so ``ssh lab-0``, rsync and VS Code Remote work after ``Include``-ing it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtrain.state import StateStore


def config_path(store: StateStore) -> Path:
    return store.home / "ssh" / "config"


def write_ssh_config(store: StateStore, *, exclude: str | None = None) -> Path:
    from gtrain.remote.ssh.hostkeys import known_hosts_path
    from gtrain.state.sshtarget import ssh_config_block

    blocks = ["# Written by gtrain for its live clusters; regenerated on every `gtrain up` and `gtrain down`.\n"]
    for c in store.list_clusters():
        if c.id == exclude or c.status == "terminated":
            continue
        for n in store.node_records(c.id):
            if n.ssh is not None:
                blocks.append(ssh_config_block(f"{c.name}-{n.rank}", n.ssh, known_hosts_path()))
    path = config_path(store)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(".config.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(blocks))
    os.replace(tmp, path)
    return path
