"""`launch --queue` on a 1-node local cluster: jobs wait in the queue its node keeps and run one after another
in priority order, started by the node's waiters with no gtrain running; a waiting job cancelled; `logs -f` of a
waiting job waits for its start; `gtrain queue --json` lists them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gtrain

JOB = '''import os, pathlib, time
label = os.environ["LABEL"]
if label == "blocker":
    while not pathlib.Path(os.environ["RELEASE"]).exists():
        time.sleep(0.05)
with open(os.environ["QUEUE_LOG"], "a") as f:
    f.write(f"{label} {os.environ.get('QTOKEN') == 't0k'}\\n")
time.sleep(0.2)
print("ran", label, flush=True)
'''


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, "QTOKEN": "t0k"})


def queue_doc(name: str) -> list[dict[str, object]]:
    r = cli("queue", name, "--json")
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout)["jobs"])


def test_five_queued_jobs_run_in_priority_order_and_a_cancelled_one_never(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    log, release = tmp_path / "order.log", tmp_path / "release"
    spec = tmp_path / "q.yaml"
    spec.write_text(json.dumps({"name": "q", "provider": "local", "num_nodes": 1, "job": {
        "workdir": str(work), "run": "job.py", "launcher": "python", "secrets": ["QTOKEN"],
        "env": {"QUEUE_LOG": str(log), "RELEASE": str(release), "LABEL": "unset"}}}))
    gtrain.up(spec)
    try:
        ids: dict[str, str] = {}
        for label, prio in (("blocker", 0), ("low", 1), ("high", 9), ("mid", 5), ("doomed", 7), ("mid2", 5)):
            r = cli("launch", str(spec), "--queue", "--priority", str(prio), "--env", f"LABEL={label}", "--json")
            assert r.returncode == 0, r.stderr  # each CLI is gone before the next launch
            doc = json.loads(r.stdout)
            assert doc["status"] == "queued"
            ids[label] = doc["job_id"]
        r = cli("launch", str(spec), "--env", "LABEL=plain")  # no --queue on a busy cluster: refused as before
        assert r.returncode == 2, r.stderr
        waiting = [d["job_id"] for d in queue_doc("q") if d["state"] == "waiting"]
        assert waiting == [ids[k] for k in ("high", "doomed", "mid", "mid2", "low")]
        r = cli("cancel", "q", "--job", ids["doomed"], "--json")
        assert r.returncode == 0, r.stderr
        follower = subprocess.Popen([sys.executable, "-m", "gtrain", "logs", "q", "--job", ids["low"], "-f"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL)
        release.touch()
        deadline = time.time() + 40
        while time.time() < deadline:
            docs = queue_doc("q")
            if all(d["state"] not in ("waiting", "running") for d in docs):
                break
            time.sleep(0.5)
        states = {d["job_id"]: d["state"] for d in docs}
        assert states[ids["doomed"]] == "cancelled"
        assert all(states[ids[k]] == "succeeded" for k in ("blocker", "low", "high", "mid", "mid2")), states
        assert log.read_text().split("\n")[:-1] == [f"{k} True" for k in ("blocker", "high", "mid", "mid2", "low")]
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert "ran low" in out
        r = cli("status", "q", "--json")  # `queue` brought this machine's records up to date from the nodes
        assert r.returncode == 0, r.stderr
        status = {j["id"]: j["status"] for j in json.loads(r.stdout)["jobs"]}
        assert [status[ids[k]] for k in ("blocker", "high", "mid", "mid2", "low", "doomed")] == \
            ["succeeded"] * 5 + ["cancelled"]
    finally:
        gtrain.down("q")
