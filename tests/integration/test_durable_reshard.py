"""Sharded checkpoints across shapes and half-written saves (issue 36), on one real FSDP2 + DCP run
(tests/integration/jobs/fsdp_dcp_train.py, CPU + gloo), its store on SeaweedFS.

The seed run, once for the module: 2 local nodes x 2 processes, saving with ``dcp.async_save``. On attempt 1
the coordinator's writer stalls in ``finish()`` at step STALL: every rank's ``__R_0.distcp`` of ``step-6/`` is
written (and uploaded: both nodes' parts are in the store), ``.metadata`` never is. Node 1 is killed there; the
recovery must restore ``step-4`` (the previous complete step), never the half-written ``step-6``, and the run
goes on to STEPS (it saves ``step-6`` anew, then no more), and its end is pulled (``gtrain pull``).

Then the same run (same ``job.checkpoint_store`` and ``job.run_id``) is relaunched on other shapes: 1 node x 4
processes (the same cluster name, after the seed's teardown) and 4 nodes x 1 (a new cluster, ``run_id:
<seed-cluster>/<id>``). Each restores the whole ``step-6`` on every node, DCP reshards it at load, and each
trains on to STEPS: its final weights equal the seed's, bit for bit (same world size, data per (step, rank)).
The pulled ``step-6/`` loads with ``dcp.load`` in this one process, with no process group."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.checkpoints.store import Store
from gtrain.jobs.backend import LogLine
from tests.fixtures.seaweedfs import _CLEAR, Weed
from tests.integration import durable_nodes as dn

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY, STALL, RUN_ID, SEED = 8, 2, 6, "dcp-run", "reshard"
SHARDS = [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
FAST = {"GTRAIN_CHECKPOINT_POLL_S": "0.3", "GTRAIN_WATCH_POLL_S": "1", "GTRAIN_IMDS_ENDPOINT": "",
        "GTRAIN_GCE_METADATA_ENDPOINT": "", "OMP_NUM_THREADS": "1", "NO_COLOR": "1"}


@dataclass
class Seed:
    home: Path
    store: str
    signals: Path
    out: Path
    res: Any
    text: list[str]
    step6_before_kill: dict[str, Any]


def _env(mp: pytest.MonkeyPatch, weed: Weed, home: Path) -> None:
    for k in _CLEAR:
        mp.delenv(k, raising=False)
    for k, v in {**weed.env(), **FAST, "GTRAIN_HOME": str(home)}.items():
        mp.setenv(k, v)
    mp.delenv("GTRAIN_DEBUG", raising=False)


def _spec(root: Path, name: str, store: str, nodes: int, procs: int, run_id: str, **env: str) -> Path:
    work = root / f"work-{name}-{nodes}x{procs}"
    work.mkdir()
    (work / "fsdp_dcp_train.py").write_text((JOBS / "fsdp_dcp_train.py").read_text())
    spec = root / f"{name}-{nodes}x{procs}.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "local", "num_nodes": nodes,
        "job": {"workdir": str(work), "run": f"fsdp_dcp_train.py {STEPS} {EVERY}", "nproc_per_node": procs,
                "checkpoint_dir": "ckpt", "checkpoint_store": store, "run_id": run_id,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3},
                "env": {"OMP_NUM_THREADS": "1", "DCP_ASYNC": "1", "SAVE_LAST": str(STALL), **env}},
        "policies": {"recovery": {"max_restarts": 1, "backoff_s": 0}}}))
    return spec


def _kill_node_1_mid_save(home: Path, store: str, key: str, signals: Path, seen: dict[str, Any]) -> threading.Thread:
    """Once the writer stalls before ``.metadata`` of step STALL and both nodes' parts of it are in the store:
    SIGKILL every process of node 1 (what the store held of the step then goes into ``seen``)."""
    def run() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            jobs = list((home / "clusters" / SEED / "node-1" / "jobs").glob("*/pid"))
            if jobs and (signals / "stalled-meta").exists():
                st = Store(store, key)
                half = [c for c in st.checkpoints() if c.name == f"step-{STALL}"]
                st.close()
                if half and sorted(half[0].manifests) == [0, 1]:
                    seen.update(complete=half[0].complete, lacks=half[0].lacks,
                                files=sorted(str(f["path"]) for m in half[0].manifests.values() for f in m["files"]))
                    if dn.kill9(dn.pids_where(dn.of_node(jobs[0].parent.name, 1))):
                        (home / "killed").write_text(str(time.time()))
                    return
            time.sleep(0.2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.fixture(scope="module")
def seed(seaweedfs: Weed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seed]:
    import boto3

    root = tmp_path_factory.mktemp("reshard")
    home, signals = root / "gtrain-home", root / "signals"
    signals.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        _env(mp, seaweedfs, home)
        bucket = f"gt-reshard-{os.getpid()}-{int(time.time())}"
        # a fresh session: boto3's default one keeps the first credentials it saw (an earlier test's)
        boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
        store = f"s3://{bucket}/runs"
        spec = _spec(root, SEED, store, 2, 2, RUN_ID, SIGNALS=str(signals), DCP_STALL_META=str(STALL),
                     FULL_DIR=str(signals), FINAL=str(signals / "final-2x2.pt"))
        seen: dict[str, Any] = {}
        killer = _kill_node_1_mid_save(home, store, dn.run_key(spec), signals, seen)
        lines: list[LogLine] = []
        res = gtrain.run(spec, to=root / "out", on_line=lines.append)
        killer.join(timeout=1)
        yield Seed(home, store, signals, root / "out", res, [x.text for x in lines], seen)


def test_async_save_killed_mid_write_restores_the_previous_step(seed: Seed) -> None:
    text = seed.text
    assert (seed.home / "killed").exists(), ("node 1 was never killed mid-save", seed.step6_before_kill, text[-30:])
    # the half-written step was in the store, both nodes' shards, no .metadata: not complete
    half = seed.step6_before_kill
    assert half["complete"] is False and half["lacks"] == ("dcp", [f"step-{STALL}/.metadata"]), half
    assert half["files"] == [f"step-{STALL}/{s}" for s in SHARDS[1:]], half
    res = seed.res
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    assert len(res.recoveries) == 1 and res.recoveries[0]["lost"] == [1], res.recoveries
    starts = sorted(x for x in text if x.startswith("attempt 2 "))
    assert starts == [f"attempt 2 rank {r} start {STALL - EVERY}" for r in range(4)], text[-40:]
    for node in (0, 1):
        said = [x for x in text if x.startswith(f"[gtrain] node {node} attempt 2: resume from")]
        assert said, text[-40:]
        doc = json.loads(said[0].split(" (", 1)[1].rstrip(")"))  # the half-written step-6 moved out of the way
        assert doc["name"] == f"step-{STALL - EVERY}" and doc["set_aside"] == [f"step-{STALL}"], doc
    # attempt 2 wrote step-6 whole; the store now holds it complete
    st = Store(seed.store, f"{SEED}/{RUN_ID}")
    done = {c.name: c.complete for c in st.checkpoints()}
    st.close()
    assert done == {f"step-{s}": True for s in range(EVERY, STALL + 1, EVERY)}, done


def test_pulled_dcp_step_loads_in_one_process(seed: Seed) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn

    pulled = sorted(p.name for p in seed.out.iterdir() if not p.name.startswith("."))  # .gtrain-pull: pull's own
    assert pulled == [f"step-{s}" for s in range(EVERY, STALL + 1, EVERY)], pulled
    step = seed.out / f"step-{STALL}"
    assert sorted(p.name for p in step.iterdir()) == SHARDS
    assert not dist.is_initialized()
    width = int(os.environ.get("FSDP_WIDTH", "64"))
    net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))
    state = {"model": {k: torch.zeros_like(v) for k, v in net.state_dict().items()}}
    with pytest.warns(UserWarning, match="load in a single process"):  # no process group: DCP reads every shard
        dcp.load(state, checkpoint_id=str(step), no_dist=True)
    want = torch.load(seed.signals / f"full-step-{STALL}.pt")
    assert sorted(state["model"]) == sorted(want)
    for k, v in want.items():
        assert torch.equal(state["model"][k], v), k


@pytest.mark.parametrize("nodes,procs", [(1, 4), (4, 1)])
def test_relaunch_on_another_shape_reshards_and_trains_on(seed: Seed, seaweedfs: Weed, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, nodes: int,
                                                           procs: int) -> None:
    import torch

    assert seed.res.status == "succeeded", seed.text[-30:]
    _env(monkeypatch, seaweedfs, seed.home)
    # 1x4: the same cluster name again (the seed's was torn down); 4x1: a new cluster, naming the seed's run
    name, run_id = (SEED, RUN_ID) if nodes == 1 else ("wide", f"{SEED}/{RUN_ID}")
    final = tmp_path / "final.pt"
    spec = _spec(tmp_path, name, seed.store, nodes, procs, run_id, FINAL=str(final))
    assert dn.run_key(spec) == f"{SEED}/{RUN_ID}"
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    text = [x.text for x in lines]
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    starts = sorted(x for x in text if x.startswith("attempt 1 rank "))
    assert starts == [f"attempt 1 rank {r} start {STALL}" for r in range(4)], text[-40:]
    holds = sorted(x for x in text if " node holds " in x)  # every node got the whole step
    assert holds == [f"rank {r} node holds {' '.join(SHARDS)}" for r in range(4)], holds
    for node in range(nodes):
        said = [x for x in text if x.startswith(f"[gtrain] node {node} attempt 1: resume from")]
        assert said and json.loads(said[0].split(" (", 1)[1].rstrip(")"))["name"] == f"step-{STALL}", said
    got, want = torch.load(final), torch.load(seed.signals / "final-2x2.pt")
    assert got["step"] == want["step"] == STEPS
    assert sorted(got["model"]) == sorted(want["model"])
    for k, v in want["model"].items():  # model and optimizer state both resharded right: the same next steps
        assert torch.equal(got["model"][k], v), k
