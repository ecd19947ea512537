"""Launchers: golden files of every launcher's rendered scripts, the commands they run, the spawner's
rank env and fail-fast, and bad input (exit 2 naming the field)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.jobs.launchers import NAMES, launcher_names
from gtrain.jobs.launchers.spawn import rank_env
from gtrain.jobs.render import NodeContext, render_all
from gtrain.spec import parse_spec

GOLDEN = Path(__file__).parent / "golden" / "launchers"
SPAWN = Path(__file__).resolve().parents[2] / "gtrain" / "jobs" / "launchers" / "spawn.py"
OPTIONS = {"accelerate": {"config_file": "accel.yaml", "args": ["--mixed_precision", "no"], "_distributed_type": ""},
           "deepspeed": {"config": "ds_config.json", "config_arg": "--deepspeed_config"},
           "jax": {"initialize": True}, "tensorflow": {}}


def ctx(launcher: str, **over: object) -> NodeContext:
    base = dict(
        job_id="demo-20260101-000000-abcd", cluster="demo", node_rank=1, num_nodes=2,
        node_ips=["10.0.0.5", "10.0.0.6"], node_addr="10.0.0.6", master_addr="10.0.0.5", master_port=29500,
        nproc_per_node=2, job_dir="/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd",
        workdir="/home/u/gtrain/demo/workdir", checkpoint_dir="/home/u/gtrain/demo/workdir/checkpoints",
        python="python3", argv=["train.py", "--steps", "50", "--name", "a b;c"], env={"LR": "0.01"},
        secret_names=["HF_TOKEN"], launcher=launcher, launcher_options=OPTIONS.get(launcher, {}),
    )
    base.update(over)
    return NodeContext(**base)  # type: ignore[arg-type]


def test_every_spec_launcher_is_registered() -> None:
    assert sorted(launcher_names()) == sorted(NAMES)


@pytest.mark.parametrize("launcher", NAMES)
def test_golden_scripts(launcher: str) -> None:
    files = render_all(ctx(launcher))
    for name in ("launch.sh", "rank.sh", "command", "hostfile"):
        if name not in files:
            continue
        golden = GOLDEN / f"{launcher}.{name}"
        if os.environ.get("GTRAIN_UPDATE_GOLDEN") == "1":
            golden.write_text(files[name])
        assert files[name] == golden.read_text(), f"{launcher} {name} changed; GTRAIN_UPDATE_GOLDEN=1 rewrites"
    for name, text in files.items():
        if name.endswith(".sh") or name == "command":
            subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # valid bash


def test_torchrun_is_todays_launch_script() -> None:
    from tests.unit.test_render import ctx as render_ctx

    old = Path(__file__).parent / "golden"
    files = render_all(render_ctx())
    assert files["launch.sh"] == (old / "launch.sh").read_text()
    assert files["rank.sh"] == (old / "rank.sh").read_text()


def test_commands_name_every_multi_node_field() -> None:
    acc = render_all(ctx("accelerate"))["command"]
    for flag in ("--num_machines=2", "--machine_rank=1", "--main_process_ip=10.0.0.5", "--main_process_port=29500",
                 "--num_processes=4", "--rdzv_backend=static", "--multi_gpu", "--no_python",
                 "--config_file=/home/u/gtrain/demo/workdir/accel.yaml", "--mixed_precision no"):
        assert flag in acc.replace(" \\\n  ", " "), flag
    ds = render_all(ctx("deepspeed"))["command"]
    for flag in ("--no_ssh", "--node_rank=1", "--master_addr=10.0.0.5", "--master_port=29500", "--num_nodes=2",
                 "--num_gpus=2", "--no_local_rank", "--deepspeed_config /home/u/gtrain/demo/workdir/ds_config.json"):
        assert flag in ds.replace(" \\\n    ", " "), flag
    assert "torch.distributed.run" in ds  # the fallback
    assert render_all(ctx("deepspeed"))["hostfile"] == "node-0 slots=2\nnode-1 slots=2\n"
    jx = render_all(ctx("jax"))
    assert "jaxrun.py" in jx and "--flavor=jax" in jx["command"] and "/jaxrun.py train.py" in jx["command"]
    no_init = render_all(ctx("jax", launcher_options={"initialize": False}))["command"]
    assert "jaxrun.py" not in no_init
    one = render_all(ctx("accelerate", num_nodes=1, nproc_per_node=1, launcher_options={}))["command"]
    assert one.startswith("RANK=0 ") and "--multi_gpu" not in one


def test_spawner_rank_env() -> None:
    env = [rank_env("tensorflow", 1, 2, 2, "10.0.0.5:29500", ["10.0.0.5", "10.0.0.6"], lr) for lr in (0, 1)]
    assert [e["RANK"] for e in env] == ["2", "3"] and {e["WORLD_SIZE"] for e in env} == {"4"}
    assert {e["NODE_RANK"] for e in env} == {"1"} and {e["LOCAL_WORLD_SIZE"] for e in env} == {"2"}
    tf = json.loads(env[1]["TF_CONFIG"])
    assert tf == {"cluster": {"worker": ["10.0.0.5:29500", "10.0.0.5:29501", "10.0.0.6:29502", "10.0.0.6:29503"]},
                  "task": {"type": "worker", "index": 3}}
    jx = rank_env("jax", 1, 2, 1, "10.0.0.5:29500", ["10.0.0.5", "10.0.0.6"], 0)
    got = (jx["JAX_COORDINATOR_ADDRESS"], jx["JAX_NUM_PROCESSES"], jx["JAX_PROCESS_ID"])
    assert got == ("10.0.0.5:29500", "2", "1")


def test_spawner_fails_fast_with_the_first_code(tmp_path: Path) -> None:
    """Local rank 1 exits 7 at once; rank 0 would sleep 60 s: it is stopped and the node exits 7."""
    code = "import os,sys,time; r=int(os.environ['LOCAL_RANK']); time.sleep(60) if r == 0 else sys.exit(7)"
    t0 = time.time()
    p = subprocess.run([sys.executable, str(SPAWN), "--flavor=python", "--node-rank=0", "--num-nodes=1", "--nproc=2",
                        "--master=127.0.0.1:1", "--node-ips=127.0.0.1", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 7, p.stderr
    assert time.time() - t0 < 30 and "local rank 1 exited 7" in p.stderr


def spec(job: dict, **top: object) -> dict:  # type: ignore[type-arg]
    return {"name": "x", "job": {"run": "t.py", **job}, **top}


@pytest.mark.parametrize(("job", "field"), [
    ({"launcher": "horovod"}, "job.launcher"),
    ({"launcher": "jax", "accelerate": {"config_file": "a.yaml"}}, "job.accelerate"),
    ({"deepspeed": {}}, "job.deepspeed"),
    ({"launcher": "accelerate", "accelerate": {"config_file": "/etc/a.yaml"}}, "job.accelerate.config_file"),
    ({"launcher": "accelerate", "accelerate": {"bogus": 1}}, "job.accelerate.bogus"),
    ({"launcher": "jax", "env": {"JAX_PROCESS_ID": "3"}}, "job.env"),
])
def test_bad_spec_names_the_field(job: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as e:
        parse_spec(spec(job))
    assert e.value.field == field, e.value.message


def _contexts(tmp_path: Path, job: dict, accelerators: str | None = None) -> list[NodeContext]:  # type: ignore[type-arg]
    from gtrain.jobs.nodescript import node_contexts
    from gtrain.state import Cluster

    (tmp_path / "t.py").write_text("")
    res = {"accelerators": accelerators} if accelerators else {}
    s = parse_spec(spec({"workdir": str(tmp_path), **job}, num_nodes=2, resources=res))
    assert s.job is not None

    class R:
        def __init__(self, k: int) -> None:
            self.address, self.root, self.python = "127.0.0.1", f"/n{k}", "python3"

    cluster = Cluster.__new__(Cluster)
    cluster.name = "x"
    return node_contexts(cluster, s, s.job, [R(0), R(1)], "x-1", 29500)  # type: ignore[list-item]


def test_missing_config_file_and_jax_nproc_are_exit_2(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _contexts(tmp_path, {"launcher": "accelerate", "accelerate": {"config_file": "accel.yaml"}})
    assert e.value.field == "job.accelerate.config_file" and "does not exist" in e.value.message
    with pytest.raises(ConfigError) as e:
        _contexts(tmp_path, {"launcher": "deepspeed", "deepspeed": {"config": "ds.json"}})
    assert e.value.field == "job.deepspeed.config"
    with pytest.raises(ConfigError) as e:
        _contexts(tmp_path, {"launcher": "jax", "nproc_per_node": 2})
    assert e.value.field == "job.nproc_per_node" and "CPU" in e.value.message
    assert _contexts(tmp_path, {"launcher": "jax"})[0].nproc_per_node == 1  # one process per node
    assert _contexts(tmp_path, {"launcher": "jax", "nproc_per_node": 4}, "H100:4")[0].nproc_per_node == 4
    assert _contexts(tmp_path, {"launcher": "python"}, "A100:8")[1].nproc_per_node == 8  # the node's GPUs
    assert _contexts(tmp_path, {"launcher": "python"})[1].nproc_per_node == 1  # else 1


def test_accelerate_config_that_sets_gtrains_fields_warns(tmp_path: Path) -> None:
    (tmp_path / "accel.yaml").write_text("distributed_type: MULTI_GPU\nnum_machines: 8\nmachine_rank: 3\n")
    c = _contexts(tmp_path, {"launcher": "accelerate", "accelerate": {"config_file": "accel.yaml"}})
    assert "num_machines, machine_rank" in c[0].launcher_notes[0]
    launch = render_all(c[1])["launch.sh"]
    assert "[gtrain] warning: job.accelerate.config_file" in launch and "--num_machines=2" in launch
    (tmp_path / "accel.yaml").write_text("distributed_type: DEEPSPEED\n")
    cmd = render_all(_contexts(tmp_path, {"launcher": "accelerate",
                                          "accelerate": {"config_file": "accel.yaml"}})[0])["command"]
    assert "--multi_gpu" not in cmd and "--deepspeed_multinode_launcher=standard" in cmd


def test_rank_wrapper_records_the_ranks_own_code_when_a_stop_races_its_exit(tmp_path: Path) -> None:
    """A peer's failure stops every rank with TERM; a rank that had already ended 0 when the TERM reached its
    wrapper is recorded as 0, not as the interrupted ``wait``'s 143 (seen in CI under load). The rank itself sends
    the TERM to its wrapper and exits 0 at once, so the race is forced every time."""
    from gtrain.jobs.templating import render

    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    (job / "pid").write_text("1\n")
    (job / "rank.sh").write_text(render("rank.sh", ctx("python", job_dir=str(job), python=sys.executable),
                                        launcher_starter="test"))
    code = ("import os, signal, time\n"  # TERM to rank.sh, then end 0 at once
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "time.sleep(0.1)\n"
            "pid = os.getppid()\n"  # the nearest ancestor running rank.sh (whatever sits between)
            "while b'rank.sh' not in open(f'/proc/{pid}/cmdline', 'rb').read():\n"
            "    pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
            "os.kill(pid, signal.SIGTERM); os._exit(0)")
    for trial in range(10):
        p = subprocess.run(["bash", str(job / "rank.sh"), "-c", code], env={**os.environ, "RANK": str(trial)},
                           timeout=30)
        assert (p.returncode, (job / "logs" / f"rank-{trial}.exit").read_text().split()[0]) == (0, "0"), trial
