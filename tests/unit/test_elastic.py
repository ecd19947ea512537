"""Elastic runs (issue 37): the spec's `num_nodes: {min, max}`, what it refuses (exit 2 naming the field), the
torchrun command and rank.sh an elastic node runs, and the pure rule of which losses are replaced alone."""

from __future__ import annotations

import subprocess

import pytest

from gtrain.errors import ConfigError
from gtrain.jobs.elastic import replaceable
from gtrain.jobs.render import render_all
from gtrain.spec import parse_spec
from gtrain.spec.elastic import torchrun_settings
from tests.unit.test_launchers import ctx


def test_num_nodes_min_max_round_trips() -> None:
    s = parse_spec({"name": "e", "num_nodes": {"min": 2, "max": 8}, "job": {"run": "t.py"}})
    assert (s.num_nodes, s.min_nodes, s.elastic) == (8, 2, True)
    assert s.to_yaml_dict()["num_nodes"] == {"min": 2, "max": 8}
    again = parse_spec(s.to_yaml_dict())
    assert (again.num_nodes, again.min_nodes) == (8, 2)
    plain = parse_spec({"name": "e", "num_nodes": 3})
    assert (plain.num_nodes, plain.min_nodes, plain.elastic) == (3, None, False)
    assert plain.to_yaml_dict()["num_nodes"] == 3
    same = parse_spec({"name": "e", "num_nodes": {"min": 2, "max": 2}})
    assert same.elastic is False


@pytest.mark.parametrize(("extra", "said"), [
    ({"num_nodes": {"min": 3, "max": 2}}, "min 3 is more than max 2"),
    ({"num_nodes": {"min": 1}}, "both keys are needed"),
    ({"num_nodes": {"min": 1, "max": 2, "step": 1}}, "unknown key(s) step"),
    ({"num_nodes": {"min": 0, "max": 2}}, "num_nodes.min: 0"),
    ({"num_nodes": {"min": True, "max": 2}}, "num_nodes.min: True"),
    ({"num_nodes": {"min": 1, "max": 10000}}, "num_nodes"),
    ({"min_nodes": 2}, "write num_nodes: {min: 2, max: 8}"),
    ({"num_nodes": {"min": 1, "max": 2}, "job": {"run": "t.py", "launcher": "deepspeed"}}, "fixed hostfile"),
    ({"num_nodes": {"min": 1, "max": 2}, "job": {"run": "t.py", "launcher": "jax"}}, "num_processes"),
    ({"num_nodes": {"min": 1, "max": 2}, "provider": "slurm"}, "sbatch --nodes"),
    ({"num_nodes": {"min": 1, "max": 2}, "provider": "kubernetes"}, "Indexed Job"),
    ({"num_nodes": {"min": 1, "max": 2}, "job": {"run": "t.py", "image": "pytorch/pytorch:2.5.1"}}, "job.image"),
])
def test_what_cannot_be_elastic_is_refused(extra: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "e", **extra})
    assert said in e.value.message and "num_nodes" in e.value.message


def test_elastic_torchrun_command_and_rank_sh() -> None:
    spec = parse_spec({"name": "e", "num_nodes": {"min": 2, "max": 3}, "job": {"run": "t.py"},
                       "policies": {"recovery": {"max_restarts": 5}}})
    el = torchrun_settings(spec, "local")
    assert el == {"min_nodes": 2, "max_nodes": 3, "join_timeout": 120, "last_call_timeout": 1, "keep_alive_interval": 1,
                  "read_timeout": 60, "max_restarts": 5}
    assert torchrun_settings(spec, "aws")["keep_alive_interval"] == 5
    for rank in (0, 1):
        files = render_all(ctx("torchrun", node_rank=rank, num_nodes=2, checkpoint_store="s3://b/runs", **el))
        cmd = files["command"]
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in cmd and "--nnodes=2:3" in cmd
        assert "--rdzv_backend=c10d" in cmd and "--node_rank" not in cmd and "--max_restarts=5" in cmd
        assert f"is_host={'true' if rank == 0 else 'false'}" in cmd
        assert "last_call_timeout=1" in cmd and "keep_alive_interval=1" in cmd and "read_timeout=60" in cmd
        assert "elastic_round.py" in files and "agree get" in files["rank.sh"]
        assert "export -f __gtrain_ckpt" in files["launch.sh"]
        for name in ("launch.sh", "rank.sh", "command"):
            subprocess.run(["bash", "-n"], input=files[name], text=True, check=True)
    fixed = render_all(ctx("torchrun"))
    assert "--rdzv_backend=static" in fixed["command"] and "elastic_round.py" not in fixed


def test_which_losses_are_replaced_alone() -> None:
    info = {"elastic": {"min": 2, "max": 4, "mode": "torchrun"}}
    assert replaceable(info, [3], 4) is None
    assert replaceable(info, [2, 3], 4) is None
    assert "fewer than num_nodes.min 2" in (replaceable(info, [1, 2, 3], 4) or "")
    assert "node 0 hosts the rendezvous" in (replaceable(info, [0], 4) or "")
    assert "Lighthouse" in (replaceable({"elastic": {"min": 1, "max": 2, "mode": "torchft"}}, [0], 2) or "")
    assert replaceable({"elastic": {"min": 1, "max": 2, "mode": "torchft", "node0": False}}, [0], 2) is None
    assert replaceable({}, [1], 2) == "the job is not elastic"
    assert replaceable(info, [], 4) == "no node was lost"


@pytest.mark.parametrize("nodes, provider, join, keep_alive, read", [
    (3, "aws", 900, 5, 60),  # the provider's base up to 64 nodes
    (64, "aws", 900, 5, 66),
    (512, "aws", 900 + 2 * 448, 25, 111),
    (1000, "aws", 900 + 2 * 936, 50, 160),
    (1000, "ssh", 300 + 2 * 936, 20, 160),
    (4096, "aws", 3600, 200, 469),  # the join timeout's cap
])
def test_rendezvous_timeouts_grow_with_the_nodes(nodes: int, provider: str, join: int, keep_alive: int,
                                                 read: int) -> None:
    spec = parse_spec({"name": "e", "num_nodes": {"min": 1, "max": nodes}, "job": {"run": "t.py"}})
    el = torchrun_settings(spec, provider)
    assert (el["join_timeout"], el["keep_alive_interval"], el["read_timeout"]) == (join, keep_alive, read)


def test_a_fixed_worlds_static_rendezvous_waits_longer_for_more_nodes() -> None:
    from gtrain.spec.elastic import rendezvous_settings

    assert rendezvous_settings(2) == {"join_timeout": 300} == rendezvous_settings(64)
    assert rendezvous_settings(1000) == {"join_timeout": 300 + 2 * 936}
    cmd = render_all(ctx("torchrun", num_nodes=1000, **rendezvous_settings(1000)))["command"]
    assert "--rdzv_conf=timeout=2172" in cmd and "--nnodes=1000" in cmd
