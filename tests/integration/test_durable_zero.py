"""DeepSpeed ZeRO for real (issue 36): tests/integration/jobs/zero_train.py, ZeRO-2 on CPU + gloo, started by
DeepSpeed's own launcher (``launcher: deepspeed``) on 2 local nodes x 1 process, its store on SeaweedFS.

The seed run: node 0 writes ``global_stepN/mp_rank_00_model_states.pt`` and ``zero_pp_rank_0_...``, ``latest``
and ``zero_to_fp32.py``; node 1 writes ``zero_pp_rank_1_...``. Node 1 is killed once ``global_step4`` is whole
in the store (node 0's manifest names every rank's file, from the world size its model states record); the
recovery restores that whole step on both nodes, every rank resumes with ``engine.load_checkpoint`` (the step
``latest`` names), and the run ends with the weights of an uninterrupted run, bit for bit.

Then the same run is relaunched on 1 node x 1 process (world size 2 -> 1): the trainer turns the restored step
into DeepSpeed's universal checkpoint (``ds_to_universal``) and loads it; the weights it loaded are the seed's
last step's, it trains on, and its new steps (written by one node) are whole in the store at once."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.checkpoints.store import Store
from gtrain.jobs.backend import LogLine
from tests.fixtures.seaweedfs import Weed
from tests.integration import durable_nodes as dn
from tests.integration.test_durable_local import kill_node_when_checkpointed
from tests.integration.test_durable_reshard import _env

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY, STALL_AT, RUN_ID, SEED = 8, 2, 4, "zero-run", "zero"
STEP_FILES = ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
              "zero_pp_rank_1_mp_rank_00_optim_states.pt"]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                                    reason="deepspeed is not installed (it is in the test extra)")]


@dataclass
class Seed:
    home: Path
    store: str
    signals: Path
    res: Any
    text: list[str]


def _spec(root: Path, name: str, store: str, nodes: int, run: str, **env: str) -> Path:
    work = root / f"work-{name}-{nodes}"
    work.mkdir()
    (work / "zero_train.py").write_text((JOBS / "zero_train.py").read_text())
    spec = root / f"{name}-{nodes}.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "local", "num_nodes": nodes,
        "job": {"workdir": str(work), "run": run, "launcher": "deepspeed", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "checkpoint_store": store, "run_id": RUN_ID,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3},
                "env": {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", **env}},
        "policies": {"recovery": {"max_restarts": 1, "backoff_s": 0}}}))
    return spec


@pytest.fixture(scope="module")
def seed(seaweedfs: Weed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seed]:
    import boto3

    root = tmp_path_factory.mktemp("zero")
    home, signals = root / "gtrain-home", root / "signals"
    signals.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        _env(mp, seaweedfs, home)
        bucket = f"gt-zero-{os.getpid()}-{int(time.time())}"
        boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
        store = f"s3://{bucket}/runs"
        spec = _spec(root, SEED, store, 2, f"zero_train.py {STEPS} {EVERY} {STALL_AT}", SIGNALS=str(signals),
                     FULL_DIR=str(signals), FINAL=str(signals / "final-2.pt"))
        killer = kill_node_when_checkpointed(home, SEED, store, f"global_step{STALL_AT}", key=dn.run_key(spec))
        lines: list[LogLine] = []
        res = gtrain.run(spec, to=root / "out", on_line=lines.append)
        killer.join(timeout=1)
        yield Seed(home, store, signals, res, [x.text for x in lines])


def _reference(tmp_path: Path) -> dict[str, Any]:
    """The same trainer, uninterrupted, 2 processes on one machine (torchrun, no gtrain)."""
    import torch

    ckpt = tmp_path / "ref"
    ckpt.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GTRAIN_")}
    env.update(GTRAIN_CHECKPOINT_DIR=str(ckpt), GTRAIN_WORKDIR=str(tmp_path), OMP_NUM_THREADS="1",
               DS_ACCELERATOR="cpu")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(JOBS / "zero_train.py"), str(STEPS), str(EVERY)],
                          env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return torch.load(ckpt / "final.pt")  # type: ignore[no-any-return]


def test_zero2_run_loses_a_node_and_resumes_from_the_whole_global_step(seed: Seed, tmp_path: Path) -> None:
    import torch

    text = seed.text
    assert (seed.home / "killed").exists(), ("node 1 was never killed", text[-30:])
    res = seed.res
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    assert len(res.recoveries) == 1 and res.recoveries[0]["lost"] == [1], res.recoveries
    starts = sorted(x for x in text if x.startswith("attempt 2 "))
    assert starts == [f"attempt 2 rank {r} start {STALL_AT}" for r in range(2)], text[-40:]
    holds = sorted(x for x in text if " node holds " in x)  # the whole step on both nodes
    assert holds == [f"rank {r} node holds {' '.join(STEP_FILES)}" for r in range(2)], holds
    for node, kept in ((0, 2), (1, 1)):  # what each node wrote itself was kept, not fetched again
        said = [x for x in text if x.startswith(f"[gtrain] node {node} attempt 2: resume from")]
        assert said, text[-40:]
        doc = json.loads(said[0].split(" (", 1)[1].rstrip(")"))
        assert doc["name"] == f"global_step{STALL_AT}" and (doc["files"], doc["kept"]) == (3 - kept, kept), doc
    # the rule: node 0's manifest names every rank's file, from the world size DeepSpeed's model states record
    st = Store(seed.store, f"{SEED}/{RUN_ID}")
    try:
        steps = {c.name: c for c in st.checkpoints() if c.name.startswith("global_step")}
    finally:
        st.close()
    assert sorted(steps) == [f"global_step{s}" for s in range(EVERY, STEPS + 1, EVERY)]
    step = steps[f"global_step{STALL_AT}"]
    assert step.manifests[0]["requires"] == [f"global_step{STALL_AT}/{f}" for f in STEP_FILES], step.manifests[0]
    assert "requires" not in step.manifests[1] and step.lacks == ("zero", []) and step.complete
    # the final weights equal an uninterrupted run's, bit for bit
    got, want = torch.load(seed.signals / "final-2.pt"), _reference(tmp_path)
    assert got["step"] == want["step"] == STEPS
    assert sorted(got["model"]) == sorted(want["model"])
    for k, v in want["model"].items():
        assert torch.equal(got["model"][k], v), k


def test_relaunch_on_another_world_size_resumes_through_a_universal_checkpoint(seed: Seed, seaweedfs: Weed,
                                                                             tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert seed.res.status == "succeeded", seed.text[-30:]
    _env(monkeypatch, seaweedfs, seed.home)
    final = tmp_path / "final-1.pt"
    more = STEPS + EVERY
    spec = _spec(tmp_path, SEED, seed.store, 1, f"zero_train.py {more} {EVERY}", FULL_DIR=str(tmp_path),
                 FINAL=str(final))
    assert dn.run_key(spec) == f"{SEED}/{RUN_ID}"
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    text = [x.text for x in lines]
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    assert f"rank 0 resumes from global_step{STEPS} saved by 2 rank(s), world 1 via its universal checkpoint" \
        in text, text[-40:]
    assert f"attempt 1 rank 0 start {STEPS}" in text, text[-40:]
    loaded, saved = torch.load(tmp_path / f"loaded-step-{STEPS}.pt"), torch.load(seed.signals / f"full-step-{STEPS}.pt")
    assert sorted(loaded) == sorted(saved)
    for k, v in saved.items():
        assert torch.equal(loaded[k], v), k
    assert torch.load(final)["step"] == more
    # its step, written by one node now (the previous ones by two), is whole: the model states name 1 rank
    st = Store(seed.store, f"{SEED}/{RUN_ID}")
    try:
        new = next(c for c in st.checkpoints() if c.name == f"global_step{more}")
    finally:
        st.close()
    assert sorted(new.manifests) == [0] and new.expected == {0, 1} and new.complete, new.to_dict()
    assert new.manifests[0]["requires"] == [f"global_step{more}/{f}" for f in STEP_FILES[:2]]
