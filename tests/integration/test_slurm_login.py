"""provider: slurm with ``slurm.login: USER@HOST``: every Slurm command (sbatch or salloc, squeue, scontrol,
scancel, srun for exec), the workdir sync, the job files and the log reads go through an sshd test host acting
as the login node: a held allocation's job (logs of every rank, pull), and a submitted job (exec on its nodes,
cancelled by `down`).

In netns mode the login node is its own network namespace: its 127.0.0.1 is not this machine's, so it gets a
copy of the test cluster's slurm.conf naming the bridge address of this machine for slurmctld and the nodes
(the daemons listen on every address); munge's socket and ``shared_dir`` are files under /tmp, which the
namespaces share (only the home folder is the host's own)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_slurm import _slurm_id, cli, down_cancels_running, slurm_spec, write


@pytest.fixture
def login(slurm_cluster: Any, ssh_hosts: Any) -> dict[str, Any]:
    """The ``slurm:`` fields of a cluster reached through the last sshd test host."""
    h = ssh_hosts[len(ssh_hosts) - 1]
    gw = f"{ssh_hosts.subnet}.1" if ssh_hosts.mode == "netns" else "127.0.0.1"
    conf = slurm_cluster.write_conf(ctld_addr=gw, path=str(slurm_cluster.base / f"slurm-login-{gw}.conf"))
    return {"login": f"{h.user}@{h.address}:{h.port}", "login_identity_file": h.identity_file,
            "login_host_key": h.host_key_line, "conf": conf, "_host": h, "_mode": ssh_hosts.mode}


def _spec(c: Any, tmp: Path, name: str, run: str, login: dict[str, Any]) -> dict[str, Any]:
    return slurm_spec(c, tmp, name, run, **{k: v for k, v in login.items() if not k.startswith("_")})


def _logins(login: dict[str, Any]) -> int:
    log = login["_host"].dir / "sshd.log"
    return log.read_text(errors="replace").count("Accepted publickey") if log.exists() else 0


def test_held_two_node_job_through_the_login_node(slurm_cluster: Any, login: dict[str, Any],
                                                  tmp_path: Path) -> None:
    # slurm.hold: salloc at `up`, the step's wrapper started detached on the login node (its srun there)
    spec = _spec(slurm_cluster, tmp_path, "sl-login", "slurm_train.py --steps 3", {**login, "hold": True})
    dest = tmp_path / "pulled"
    before = _logins(login)
    res = cli("up", write(tmp_path, spec))
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        res = cli("launch", write(tmp_path, spec), "--wait")
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        for r in range(4):  # every rank's lines, read through the login node
            assert f"slurm rank {r}/4" in out, out[-3000:]
        res = cli("pull", "sl-login", "--to", str(dest))
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads((dest / "state.json").read_text()) == {"step": 3, "sum": 10.0, "restart": "0"}
        assert _logins(login) > before  # the commands went through the login node's sshd
        assert [j.split()[1] for j in slurm_cluster.jobs() if j.endswith(" gtrain-hold-sl-login")] == ["RUNNING"]
    finally:
        res = cli("down", "sl-login")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (slurm_cluster.shared / "gtrain" / "sl-login").exists()  # removed through the login node
    assert [j.split()[1] for j in slurm_cluster.jobs() if j.endswith(" gtrain-hold-sl-login")] == ["CANCELLED"]


def test_exec_and_down_through_the_login_node(slurm_cluster: Any, login: dict[str, Any], tmp_path: Path) -> None:
    spec = _spec(slurm_cluster, tmp_path, "sl-login-down", "slurm_train.py --steps 200 --step-s 0.5", login)

    def exec_on_the_nodes(job_id: str) -> None:  # srun --overlap from the login node to the job's nodes
        res = cli("exec", "sl-login-down", "--", "echo where=$SLURMD_NODENAME")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"inside Slurm job {_slurm_id(job_id)}" in res.stderr, res.stderr
        assert "where=gtn1" in res.stdout and "where=gtn2" in res.stdout, res.stdout

    down_cancels_running(slurm_cluster, spec, exec_on_the_nodes)
