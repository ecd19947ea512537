"""Elastic runs on the local provider (issue 37): ``num_nodes: {min: 2, max: 3}``, a real FSDP2 + DCP trainer under
torchrun's c10d rendezvous, its store on moto's S3. Node 2 is killed (SIGKILL of every process of its job) once a
checkpoint is whole in the store: node 0's and node 1's torchrun agents are never restarted -- they re-rendezvous
at world size 2 and go on from the newest checkpoint, resharded by ``dcp.load`` -- gtrain starts node 2's part
alone, it joins, and the run ends at world size 3 with every step done."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import gtrain
from gtrain.checkpoints.store import Store
from gtrain.jobs.backend import LogLine
from gtrain.remote.nodeside import job_pids
from tests.integration.durable_nodes import run_key
from tests.integration.test_durable_local import bucket, fast  # noqa: F401 - a fixture

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY, SLEEP = 70, 5, 0.4
BOOT_S = 12  # the replacement's 'boot'
LINE = re.compile(r"rank (\d+) (?:step|start) (\d+) world (\d+) agent (-?\d+) t ([\d.]+)")


def _kill_node_when(home: Path, cluster: str, node: int, store: str, key: str, after: str) -> threading.Thread:
    def run() -> None:
        jobs = home / "clusters" / cluster / f"node-{node}" / "jobs"
        deadline = time.time() + 240
        while time.time() < deadline:
            found = list(jobs.glob("*/pid")) if jobs.is_dir() else []
            if found:
                st = Store(store, key)
                done = [c.name for c in st.checkpoints() if c.complete]
                st.close()
                if after in done:
                    job_dir = found[0].parent
                    pids = set(job_pids(job_dir.name, str(job_dir)))
                    os.killpg(int(found[0].read_text()), signal.SIGKILL)
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    (home / "killed").write_text(repr(time.time()))
                    return
            time.sleep(0.2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_elastic_run_loses_node_2_and_the_survivors_keep_training(moto_server: str, gtrain_home: Path,
                                                                  tmp_path: Path, fast: None) -> None:  # noqa: F811
    import torch

    store = bucket(moto_server, "elastic-local")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOBS / "elastic_dcp_train.py", work / "elastic_dcp_train.py")
    name = "elastic"
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "local", "num_nodes": {"min": 2, "max": 3},
        "job": {"workdir": str(work), "run": f"elastic_dcp_train.py {STEPS} {EVERY} {SLEEP}", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "checkpoint_store": store,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3}, "env": {"OMP_NUM_THREADS": "1"},
                # the replacement takes a while to come up, as a cloud VM does: the survivors train meanwhile
                "setup": f"[ ! -e {gtrain_home / 'killed'} ] || sleep {BOOT_S}"},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0}}}))
    killer = _kill_node_when(gtrain_home, name, 2, store, run_key(spec), "step-10")
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    killer.join(timeout=1)
    text = [x.text for x in lines]
    assert (gtrain_home / "killed").exists(), ("node 2 was never killed", text[-30:])
    killed_at = float((gtrain_home / "killed").read_text())
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-40:])
    assert len(res.recoveries) == 1, res.recoveries
    rec = res.recoveries[0]
    assert rec["elastic"] and rec["lost"] == [2] and rec["attempt"] == 1, rec  # no new attempt: nothing restarted

    seen = [(x.node, *map(float, m.groups())) for x in lines if (m := LINE.search(x.text))]
    # node 0's torchrun agent is the same process before and after the loss
    agents0 = {int(a) for node, _r, _s, _w, a, _t in seen if node == 0}
    assert len(agents0) == 1 and -1 not in agents0, agents0
    agents1 = {int(a) for node, _r, _s, _w, a, _t in seen if node == 1}
    assert len(agents1) == 1, agents1
    # the survivors trained at world size 2 after the loss, within seconds of it
    shrunk = sorted(t for _n, _r, _s, w, _a, t in seen if w == 2 and t > killed_at)
    assert shrunk, text[-60:]
    assert shrunk[0] - killed_at < 30, shrunk[0] - killed_at
    # ... and the run ends at world size 3 with every step done
    last = [w for _n, _r, s, w, _a, _t in seen if s == STEPS]
    assert last and set(last) == {3.0}, last
    final = torch.load(tmp_path / "out" / "final.pt")
    assert final["step"] == STEPS and final["world"] == 3
    print(f"node loss -> training again at world size 2: {shrunk[0] - killed_at:.1f}s; "
          f"loss -> node 2 rejoined: {rec['seconds']:.1f}s")
