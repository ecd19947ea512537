"""Sharded checkpoints outlive their machines (issue 36): a real FSDP2 + torch.distributed.checkpoint trainer
(tests/integration/jobs/fsdp_dcp_train.py) on 2 local nodes x 2 processes, its store on SeaweedFS. Each node
writes its ranks' shards of ``step-N/`` (``__0_0``/``__1_0`` and DCP's ``.metadata`` on node 0, ``__2_0``/``__3_0``
on node 1). Node 1 is killed once step STALL_AT is whole in the store (``.metadata`` and every shard it names);
the recovery restores the step on every node (what a node already holds, same sha256, is kept), every rank
resumes with ``dcp.load``, and the run ends with the weights of an uninterrupted run, bit for bit. Both runs here
restore with ``GTRAIN_CHECKPOINT_RESTORE=subset`` (what each node's ranks read, by DCP's metadata); the whole-step
restore (the default) is tested on ssh hosts (test_durable_ssh.py) and across shapes (test_durable_reshard.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gtrain
from gtrain.jobs.backend import LogLine
from tests.fixtures.seaweedfs import Weed
from tests.integration.durable_nodes import run_key
from tests.integration.test_durable_local import fast, kill_node_when_checkpointed  # noqa: F401 - a fixture

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY, STALL_AT = 6, 2, 4
SHARDS = [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]


def _reference(tmp_path: Path, nproc: int = 4, **env_: str) -> dict[str, object]:
    """The same trainer, uninterrupted, ``nproc`` processes on one machine (torchrun, no gtrain)."""
    ckpt = tmp_path / "ref"
    ckpt.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GTRAIN_")}
    env.update(GTRAIN_CHECKPOINT_DIR=str(ckpt), OMP_NUM_THREADS="1", **env_)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(JOBS / "fsdp_dcp_train.py"), str(STEPS), str(EVERY)]
    for _ in range(2):  # once more if torchrun's own start failed (seen once under a concurrent CI run's load)
        done = subprocess.run(cmd, env=env, timeout=300, capture_output=True, text=True)
        if done.returncode == 0:
            break
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    import torch

    return torch.load(ckpt / "final.pt")  # type: ignore[no-any-return]


def test_fsdp2_dcp_run_loses_a_node_and_resumes_on_what_its_ranks_read(weed_env: Weed, weed_bucket: str,
                                                                       gtrain_home: Path, tmp_path: Path,
                                                                       fast: None) -> None:  # noqa: F811
    import torch


    store = f"s3://{weed_bucket}/runs"
    work, signals = tmp_path / "work", tmp_path / "signals"
    work.mkdir()
    signals.mkdir()
    shutil.copy(JOBS / "fsdp_dcp_train.py", work / "fsdp_dcp_train.py")
    name = "fsdpdcp"
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "local", "num_nodes": 2,
        "job": {"workdir": str(work), "run": f"fsdp_dcp_train.py {STEPS} {EVERY} {STALL_AT}", "nproc_per_node": 2,
                "checkpoint_dir": "ckpt", "checkpoint_store": store,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3, "restore": "subset"},
                "env": {"OMP_NUM_THREADS": "1", "SIGNALS": str(signals)}},
        "policies": {"recovery": {"max_restarts": 1, "backoff_s": 0}}}))
    killer = kill_node_when_checkpointed(gtrain_home, name, store, f"step-{STALL_AT}", key=run_key(spec))
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    killer.join(timeout=1)
    text = [x.text for x in lines]
    assert (gtrain_home / "killed").exists(), ("node 1 was never killed", text[-30:])
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    assert len(res.recoveries) == 1 and res.recoveries[0]["lost"] == [1], res.recoveries
    starts = sorted(x for x in text if x.startswith("attempt 2 "))
    assert starts == [f"attempt 2 rank {r} start {STALL_AT}" for r in range(4)], text[-40:]

    # each node got what its ranks read by DCP's .metadata: DCP's save dedup put AdamW's replicated state (its
    # `step` scalars, param_groups) in the files of ranks 1-3, which every rank reads; rank 0's file holds its
    # shards alone. Node 0 (ranks 0-1) needs every file (whole); node 1 (ranks 2-3) all but __0_0. What a node
    # held already (its own shards, same sha256) was kept.
    holds = sorted(x for x in text if " node holds " in x)
    need = {0: SHARDS, 1: [s for s in SHARDS if s != "__0_0.distcp"]}
    assert holds == [f"rank {r} node holds {' '.join(need[r // 2])}" for r in range(4)], holds
    own = {0: 3, 1: 2}  # node 0: .metadata, __0_0, __1_0; node 1: __2_0, __3_0
    for node, n in own.items():
        said = [x for x in text if x.startswith(f"[gtrain] node {node} attempt 2: resume from")]
        assert said, text[-40:]
        doc = json.loads(said[0].split(" (", 1)[1].rstrip(")"))
        assert doc["name"] == f"step-{STALL_AT}" and (doc["files"], doc["kept"]) == (len(need[node]) - n, n), doc
        assert doc["mode"] == ("whole", "subset")[node], doc

    # the final weights (pulled from the store) equal an uninterrupted run's, bit for bit
    got, want = torch.load(tmp_path / "out" / "final.pt"), _reference(tmp_path)
    assert got["step"] == want["step"] == STEPS
    assert sorted(got["model"]) == sorted(want["model"])  # type: ignore[call-overload]
    for k, v in want["model"].items():  # type: ignore[attr-defined]
        assert torch.equal(got["model"][k], v), k
    assert sorted(p.name for p in (tmp_path / "out" / f"step-{STEPS}").iterdir()) == SHARDS


def test_dcp_without_a_coordinator_per_rank_metadata_is_whole_and_resumes(weed_env: Weed, weed_bucket: str,
                                                                          gtrain_home: Path, tmp_path: Path,
                                                                          fast: None) -> None:  # noqa: F811
    """``dcp.save(..., use_collectives=False)`` (torch 2.13): no ``.metadata``; each rank writes ``__R.metadata``
    (its pieces, each tensor's global size) beside ``__R_0.distcp``. 2 local nodes x 1 process, node 1 killed once
    step STALL_AT is whole by that rule; both nodes resume from it (each rank reads its own ``__R.metadata``, and
    the subset restore gives each node that and the file it names, no more) and end bit for bit with an
    uninterrupted run."""
    import torch

    from gtrain.checkpoints.sharded import rank_chunks
    from gtrain.checkpoints.store import Checkpoint, Store

    store = f"s3://{weed_bucket}/runs"
    work, signals = tmp_path / "work", tmp_path / "signals"
    work.mkdir()
    signals.mkdir()
    shutil.copy(JOBS / "fsdp_dcp_train.py", work / "fsdp_dcp_train.py")
    name = "dcplocal"
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "local", "num_nodes": 2,
        "job": {"workdir": str(work), "run": f"fsdp_dcp_train.py {STEPS} {EVERY} {STALL_AT}", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "checkpoint_store": store,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3, "restore": "subset"},
                "env": {"OMP_NUM_THREADS": "1", "SIGNALS": str(signals), "DCP_RANK_LOCAL": "1"}},
        "policies": {"recovery": {"max_restarts": 1, "backoff_s": 0}}}))
    key = run_key(spec)
    killer = kill_node_when_checkpointed(gtrain_home, name, store, f"step-{STALL_AT}", key=key)
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    killer.join(timeout=1)
    text = [x.text for x in lines]
    assert (gtrain_home / "killed").exists(), ("node 1 was never killed", text[-30:])
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    assert len(res.recoveries) == 1 and res.recoveries[0]["lost"] == [1], res.recoveries
    starts = sorted(x for x in text if x.startswith("attempt 2 "))
    assert starts == [f"attempt 2 rank {r} start {STALL_AT}" for r in range(2)], text[-40:]
    holds = sorted(x for x in text if " node holds " in x)
    assert holds == [f"rank {r} node holds __{r}.metadata __{r}_0.distcp" for r in range(2)], holds
    for node in (0, 1):
        said = [x for x in text if x.startswith(f"[gtrain] node {node} attempt 2: resume from")]
        doc = json.loads(said[0].split(" (", 1)[1].rstrip(")"))
        assert doc["mode"] == "subset" and (doc["files"], doc["kept"]) == (0, 2), doc

    # the rule, on the manifests DCP's real files gave: each node's ranks' pieces; without node 1's part, the
    # step is not whole (rank 1's pieces of every sharded tensor are missing)
    st = Store(store, key)
    try:
        step = next(c for c in st.checkpoints() if c.name == f"step-{STALL_AT}")
    finally:
        st.close()
    assert step.complete and step.lacks == ("dcp", [])
    assert [sorted(m["dcp_ranks"]) for _n, m in sorted(step.manifests.items())] == [["0"], ["1"]]
    chunks = rank_chunks(step.manifests[0], step.manifests[0]["dcp_ranks"]["0"])  # names and sizes once a node
    assert chunks is not None and "chunks" not in step.manifests[0]["dcp_ranks"]["0"]
    assert chunks["model.0.weight"] == [[64, 16], [[[0, 0], [32, 16]]]], chunks["model.0.weight"]
    half = Checkpoint(step.name, manifests={0: step.manifests[0]}, writers={0})
    assert half.lacks == ("dcp", [f"step-{STALL_AT}/__1.metadata"]) and not half.complete

    got, want = torch.load(tmp_path / "out" / "final.pt"), _reference(tmp_path, 2, DCP_RANK_LOCAL="1")
    assert got["step"] == want["step"] == STEPS
    for k, v in want["model"].items():  # type: ignore[attr-defined]
        assert torch.equal(got["model"][k], v), k
