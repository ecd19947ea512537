"""torchft mode (``job.fault_tolerance: torchft``): what the spec refuses (exit 2 naming the field), and what each
node runs -- its own torchrun as replica group NODE_RANK, node 0 the Lighthouse too (docs/durable.md, "torchft
mode"). The run itself: tests/integration/test_torchft_local.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.jobs.render import NodeContext, render_all
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.spec.torchft import TorchftOptions, problem


def spec(job: dict, **top: object) -> ClusterSpec:  # type: ignore[type-arg]
    return parse_spec({"name": "x", "num_nodes": 2, "job": {"run": "t.py", "fault_tolerance": "torchft", **job},
                       **top})


def contexts(tmp_path: Path, s: ClusterSpec, market: str | None = "on-demand") -> list[NodeContext]:
    from gtrain.jobs.nodescript import node_contexts
    from gtrain.state import Cluster

    assert s.job is not None

    class R:
        def __init__(self, k: int) -> None:
            self.address, self.root, self.python = f"10.0.0.{5 + k}", f"/n{k}", "python3"

    cluster = Cluster.__new__(Cluster)
    cluster.name, cluster.provider, cluster.market = "x", "local", market
    return node_contexts(cluster, s, s.job, [R(0), R(1)], "x-1", 29500)  # type: ignore[list-item]


@pytest.mark.parametrize(("job", "top", "field", "words"), [
    ({"launcher": "accelerate"}, {}, "job.launcher", "'accelerate' cannot run job.fault_tolerance: torchft"),
    ({"launcher": "python"}, {}, "job.launcher", "set launcher: torchrun"),
    ({"env": {"REPLICA_GROUP_ID": "3"}}, {}, "job.env", "REPLICA_GROUP_ID is set by gtrain"),
    ({"env": {"TORCHFT_LIGHTHOUSE": "http://h:1"}}, {}, "job.env", "job.torchft.lighthouse"),
    ({"image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}, {}, "job.fault_tolerance", "with job.image"),
    ({}, {"provider": "slurm", "slurm": {"partition": "gpu"}}, "job.fault_tolerance", "provider slurm"),
])
def test_what_torchft_mode_refuses(tmp_path: Path, job: dict, top: dict, field: str,  # type: ignore[type-arg]
                                   words: str) -> None:
    try:
        s = spec(job, **top)
    except ConfigError as e:  # the spec's own check (gtrain.spec.torchft.check), where the spec calls it
        assert words in e.message, e.message
        return
    found = problem(s)
    assert found is not None and found[0] == field and words in found[1], found
    with pytest.raises(ConfigError) as err:  # every backend renders through launcher_of: exit 2, naming the field
        contexts(tmp_path, s)
    assert err.value.field == field and words in err.value.message


def test_torchrun_passes_and_other_jobs_are_untouched() -> None:
    assert problem(spec({})) is None
    assert problem(parse_spec({"name": "x", "job": {"run": "t.py", "launcher": "accelerate"}})) is None


def test_options_defaults_are_torchfts_readme_and_urls_are_checked() -> None:
    o = TorchftOptions()
    assert (o.min_replicas, o.join_timeout_ms, o.quorum_tick_ms, o.heartbeat_timeout_ms) == (1, 10000, 100, 5000)
    assert o.lighthouse_args() == ["1", "10000", "100", "5000"]
    assert TorchftOptions(lighthouse="http://10.1.2.3:29510").lighthouse == "http://10.1.2.3:29510"
    with pytest.raises(ValueError, match="give http://HOST:PORT"):
        TorchftOptions(lighthouse="10.1.2.3; rm -rf /")
    for bad in ({"heartbeat_timeout_ms": True}, {"min_replicas": "2"}, {"port": 80}, {"bogus": 1}):
        with pytest.raises(ValueError):
            TorchftOptions.model_validate(bad)


def test_each_node_is_its_own_replica_group_and_node_0_runs_the_lighthouse(tmp_path: Path) -> None:
    ctxs = contexts(tmp_path, spec({"nproc_per_node": 2}))
    files = [render_all(c) for c in ctxs]
    for k, f in enumerate(files):
        cmd = f["command"]
        assert cmd.startswith(f"REPLICA_GROUP_ID={k} NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://10.0.0.5:29500 ")
        for flag in ("--nnodes=1", "--nproc_per_node=2",
                     "--standalone",  # its own rendezvous and MASTER_PORT, on this node, on a free port
                     f"--local_addr=10.0.0.{5 + k}"):  # MASTER_ADDR: this node
            assert flag in cmd, (k, flag, cmd)
        assert "--node_rank" not in cmd and "static" not in cmd
        for name, text in f.items():
            if name.endswith(".sh") or name == "command":
                subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    launch0, launch1 = files[0]["launch.sh"], files[1]["launch.sh"]
    assert "torchft_lighthouse.py" in files[0] and "torchft_lighthouse.py" not in files[1]
    start = launch0.index("torchft_lighthouse.py 0.0.0.0:29500 1 10000 100 5000")
    assert start < launch0.index("REPLICA_GROUP_ID=0")  # the Lighthouse first, then the group's torchrun
    assert '>"$JOB_DIR/logs/lighthouse.log" 2>&1 &' in launch0
    assert "trap 'kill -TERM \"$__gtrain_lighthouse\" 2>/dev/null' EXIT" in launch0
    assert "lighthouse" not in launch1.replace("TORCHFT_LIGHTHOUSE=http://10.0.0.5:29500", "")
    assert not any("spot" in n for c in ctxs for n in c.launcher_notes)


def test_a_spot_node_0_warns_at_launch(tmp_path: Path) -> None:
    ctxs = contexts(tmp_path, spec({}), market="spot")
    assert "node 0, which is a spot node" in ctxs[0].launcher_notes[-1] and not ctxs[1].launcher_notes
    assert "[gtrain] warning: job.fault_tolerance: torchft runs the Lighthouse on node 0" in \
        render_all(ctxs[0])["launch.sh"]


def test_a_lighthouse_of_ones_own_starts_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gtrain.spec import torchft

    own = TorchftOptions(lighthouse="http://lh.example:29510/")
    monkeypatch.setattr(torchft, "options", lambda _spec: own)  # job.torchft, once the Job model has the field
    ctxs = contexts(tmp_path, spec({}), market="spot")
    files = render_all(ctxs[0])
    assert "TORCHFT_LIGHTHOUSE=http://lh.example:29510 " in files["command"]
    assert "torchft_lighthouse.py" not in files and "__gtrain_lighthouse" not in files["launch.sh"]
    assert not ctxs[0].launcher_notes  # node 0 is nothing special: no warning for its being spot


def test_torchrun_without_torchft_is_unchanged(tmp_path: Path) -> None:
    s = parse_spec({"name": "x", "num_nodes": 2, "job": {"run": "t.py"}})
    f = render_all(contexts(tmp_path, s)[1])
    assert "--rdzv_backend=static" in f["command"] and "REPLICA_GROUP_ID" not in f["command"]
    assert "lighthouse" not in f["launch.sh"]
