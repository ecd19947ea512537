"""A run whose cloud cannot replace a lost node moves, as a whole, to the next ``resources.any_of`` candidate.

Candidates: ``fake`` (tests/fake_provider.py, a plug-in provider whose instances are directories, with a
capacity switch) then ``local``. A 2-node durable job checkpoints to SeaweedFS (S3); once a checkpoint is in
the store, node 1's instance is deleted with its processes (the provider reports it missing) and the fake
region has no capacity left: recovery cannot re-provision it there, so every node of the fake candidate is
deleted and the cluster is made again on ``local``, under the same cluster and job id; the nodes restore from
the store and the run ends with the weights of an uninterrupted run. The move is in `status`, the cost report
(each cloud's part) and the report's timeline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.checkpoints.store import Store
from gtrain.jobs.backend import LogLine
from gtrain.remote.nodeside import job_pids
from tests.fake_provider import installed, tagged
from tests.integration.durable_nodes import run_key

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY = 12, 3


def lose_node1_when_checkpointed(cloud: Path, store: str, key: str, after: str) -> threading.Thread:
    """Once checkpoint ``after`` is complete in the store: the fake region runs out of capacity, and node 1's
    instance goes with its processes."""
    def run() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            node1 = [d for d, t in tagged() if t["rank"] == 1]
            jobs = list((node1[0] / "root" / "jobs").glob("*/pid")) if node1 else []
            if jobs:
                job_dir = jobs[0].parent
                st = Store(store, key)  # the run's folder: <cluster>/<run_id>
                names = [c.name for c in st.checkpoints() if c.complete]
                st.close()
                if after in names:
                    (cloud / "capacity").write_text("0")
                    pids = set(job_pids(job_dir.name, str(job_dir)))
                    os.killpg(int(jobs[0].read_text()), signal.SIGKILL)
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    shutil.rmtree(node1[0])
                    (cloud / "lost").write_text(str(time.time()))
                    return
            time.sleep(0.2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_no_capacity_to_replace_a_lost_node_moves_the_run_to_the_next_candidate(
        weed_bucket: str, gtrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    for k, v in {"GTRAIN_CHECKPOINT_POLL_S": "0.3", "GTRAIN_WATCH_POLL_S": "1", "GTRAIN_IMDS_ENDPOINT": "",
                 "GTRAIN_GCE_METADATA_ENDPOINT": "", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(k, v)
    store = f"s3://{weed_bucket}/runs"
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOBS / "durable_train.py", work / "durable_train.py")
    spec: dict[str, Any] = {
        "name": "mover", "num_nodes": 2, "fake": {},
        "resources": {"any_of": [{"provider": "fake"}, {"provider": "local"}], "order": "listed"},
        "job": {"workdir": str(work), "run": f"durable_train.py {STEPS} {EVERY} 0.6", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "checkpoint_store": store, "env": {"OMP_NUM_THREADS": "1"}},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0}}}
    f = tmp_path / "mover.yaml"
    f.write_text(json.dumps(spec))
    cloud = tmp_path / "cloud"
    with installed(cloud):
        killer = lose_node1_when_checkpointed(cloud, store, run_key(f), "step-0003.pt")
        lines: list[LogLine] = []
        res = gtrain.run(f, to=tmp_path / "out", on_line=lines.append, keep=True)
        killer.join(timeout=1)
        try:
            assert (cloud / "lost").exists(), "node 1 was never lost"
            assert res.status == "succeeded" and res.exit_code == 0, (res, [x.text for x in lines][-30:])
            assert len(res.recoveries) == 1, res.recoveries
            rec = res.recoveries[0]
            assert rec["lost"] == [1] and rec["moved_to"] == "local" and rec["reprovision"] == [0, 1], rec
            assert tagged() == []  # nothing left on the candidate it moved away from
            from tests.integration.jobs.durable_train import reference

            final = torch.load(tmp_path / "out" / "final.pt")
            assert final["step"] == STEPS and final["w"].tolist() == reference(STEPS, 2)
            starts = [x.text for x in lines if x.text.startswith("attempt 2 start")]
            assert len(starts) == 2 and int(starts[0].split()[3]) >= EVERY, starts
            st = gtrain.status("mover")[0]
            assert st["provider"] == "local" and st["status"] == "up"
            moves = st["placement"]["moves"]
            assert [(m["from_provider"], m["to_provider"]) for m in moves] == [("fake", "local")]
            assert moves[0]["cost_usd"] > 0  # the fake cloud's part ($0.50/h, 60 s minimum per node)
            assert [c["outcome"] for c in st["placement"]["candidates"]] == ["lost", "landed"]
        finally:
            down = gtrain.down("mover", yes=True)
        cost = down.cost.to_dict()
        assert cost["provider"] == "local" and cost["placement"]["moves"][0]["to_provider"] == "local"
        # every node interval of the fake part is kept and priced (its 60 s minimum), the local part free
        assert cost["total_usd"] == pytest.approx(moves[0]["cost_usd"])
        events = (gtrain_home / "runs" / down.cost.cluster_id / "events.jsonl").read_text()
        assert '"kind":"move"' in events and '"kind":"placement"' in events
        import subprocess
        import sys

        text = subprocess.run([sys.executable, "-m", "gtrain", "cost"], capture_output=True, text=True, timeout=120,
                              check=False).stdout
        assert "fake→local" in text and "mover: moved from #1 fake to #2 local" in text, text
