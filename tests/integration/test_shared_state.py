"""The shared state (GTRAIN_STATE=s3://...) on a real S3 server: SeaweedFS (``weed mini``), which honours S3's
conditional writes (If-None-Match: * and If-Match answer 412 PreconditionFailed, checked in
test_seaweedfs_refuses_writes_on_a_stale_version). Two gtrain processes with their own GTRAIN_HOME and one
GTRAIN_STATE stand for two machines (a laptop and a CI runner)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import GtrainError
from gtrain.sync.condput import Conflict, S3Cond
from gtrain.sync.model import RemoteURL

HERE = Path(__file__).parent
SECRET = "tok-9f8e7d6c5b4a"
JOB = """import os, sys, time
os.makedirs(os.environ["GTRAIN_CHECKPOINT_DIR"], exist_ok=True)
for i in range(5):
    print(f"step {i} rank {os.environ['RANK']}", flush=True)
    time.sleep(0.2)
with open(os.path.join(os.environ["GTRAIN_CHECKPOINT_DIR"], f"rank{os.environ['RANK']}.txt"), "w") as f:
    f.write("done")
"""


def bucket(env: dict[str, str]) -> str:
    """A fresh bucket on the server (state persists for the whole session)."""
    from gtrain.sync.s3wire import S3Wire

    name = f"state-{uuid.uuid4().hex[:12]}"
    wire = S3Wire()
    wire.request("PUT", name)
    wire.close()
    return name


@pytest.fixture
def shared(weed_env: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    b = bucket(weed_env.env())
    url = f"s3://{b}/team"
    monkeypatch.setenv("GTRAIN_STATE", url)
    env = {**os.environ, "GTRAIN_STATE": url, "NO_COLOR": "1"}
    return {"bucket": b, "url": url, "a": {**env, "GTRAIN_HOME": str(tmp_path / "a")},
            "b": {**env, "GTRAIN_HOME": str(tmp_path / "b")}}


def gt(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


def all_objects(b: str) -> dict[str, bytes]:
    store = S3Cond(RemoteURL("s3", b, ""))
    out = {}
    for key in store.list(""):
        got = store.get(key)
        assert got is not None
        out[key] = got.data
    store.close()
    return out


def test_seaweedfs_refuses_writes_on_a_stale_version(shared: dict[str, Any]) -> None:
    store = S3Cond(RemoteURL("s3", shared["bucket"], "probe"))
    v1 = store.put("k.json", b"1", absent=True)
    with pytest.raises(Conflict):
        store.put("k.json", b"2", absent=True)
    v2 = store.put("k.json", b"3", match=v1)
    with pytest.raises(Conflict):
        store.put("k.json", b"4", match=v1)
    assert store.get("k.json") == type(store.get("k.json"))(b"3", v2)
    assert store.list("") == {"k.json": v2}
    store.close()


def test_ci_flow_up_and_launch_on_a_follow_pull_down_on_b(shared: dict[str, Any], tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(JOB)
    spec = tmp_path / "ci.yaml"
    spec.write_text(json.dumps({"name": "ci", "provider": "local", "num_nodes": 2, "job": {
        "workdir": str(work), "run": "train.py", "nproc_per_node": 1, "python": sys.executable,
        "launcher": "python", "checkpoint_dir": "ckpt", "secrets": ["TOKEN"]}}))
    a, b = shared["a"], shared["b"]
    a_ci = {**a, "TOKEN": SECRET, "GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": "42", "GITHUB_REPOSITORY": "o/r",
            "GITHUB_SERVER_URL": "https://github.com"}
    up = gt(a_ci, "up", str(spec))
    assert up.returncode == 0, up.stderr
    launch = gt(a_ci, "launch", str(spec))
    assert launch.returncode == 0, launch.stderr
    # machine B: nothing in its home; it follows the job to its end, pulls, tears down
    assert not Path(b["GTRAIN_HOME"]).exists()
    st = gt(b, "status", "ci")
    assert st.returncode == 0, st.stderr
    assert "started by https://github.com/o/r/actions/runs/42" in st.stdout
    logs = gt(b, "logs", "ci", "-f")
    assert logs.returncode == 0, logs.stderr
    assert "step 4 rank 0" in logs.stdout and "step 4 rank 1" in logs.stdout
    dest = tmp_path / "pulled"
    pull = gt(b, "pull", "ci", "--to", str(dest))
    assert pull.returncode == 0, pull.stderr
    assert sorted(p.name for p in dest.rglob("*.txt")) == ["rank0.txt", "rank1.txt"]
    down = gt(b, "down", "ci", "--yes")
    assert down.returncode == 0, down.stderr
    assert "total" in down.stdout.lower() and "node" in down.stdout.lower(), down.stdout  # the cost report
    # machine A sees it gone; its own cache follows the shared state
    st = gt(a, "status", "ci")
    assert st.returncode == 2 and "was torn down" in st.stderr, st.stderr
    # the run archive travelled both ways: B had A's `up` and `launch` events, A now has B's `down` and logs
    runs_a = next((Path(a["GTRAIN_HOME"]) / "runs").iterdir())
    kinds = [json.loads(ln)["kind"] for ln in (runs_a / "events.jsonl").read_text().splitlines()]
    assert kinds[:2] == ["up", "launch"] and kinds[-1] == "down", kinds
    assert "step 4 rank 1" in "".join(p.read_text() for p in runs_a.glob("jobs/*/logs/node-*.log"))
    listed = gt(a, "status", "--json")
    assert json.loads(listed.stdout)["clusters"] == []
    cost = gt(a, "cost", "--json")
    assert cost.returncode == 0, cost.stderr
    # secrets never reach the store; the job's record keeps the name only
    objs = all_objects(shared["bucket"])
    assert any(k.startswith("team/clusters/ci-") for k in objs)
    assert not [k for k, v in objs.items() if SECRET.encode() in v]
    doc = json.loads(next(v for k, v in objs.items() if k.startswith("team/clusters/")))
    assert doc["cluster"]["status"] == "terminated"
    assert json.loads(doc["jobs"][0]["info_json"])["secret_names"] == ["TOKEN"]


def test_two_machines_race_up_and_launch(shared: dict[str, Any], tmp_path: Path) -> None:
    """20 trials of `up` of one name and 20 of `launch` on one cluster, A and B at the same instant: exactly one
    wins each, the other is refused (exit 2) at once."""
    from gtrain.sharedstate import open_store

    store = open_store(tmp_path / "c")
    store.create_cluster(name="shared", provider="local", num_nodes=1, spec={"name": "shared"})
    store.close()
    trials, gap = 40, 0.15
    start = time.time() + 2.5  # both interpreters are up by then
    procs = [subprocess.Popen([sys.executable, str(HERE / "state_racer.py"), str(start), str(trials), str(gap), "0.02"],
                              env={**env, "PYTHONPATH": str(HERE.parent.parent)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for env in (shared["a"], shared["b"])]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    res = [[json.loads(line) for line in o[0].splitlines()] for o in outs]
    for n in range(trials):
        a, b = res[0][n], res[1][n]
        assert [a["won"], b["won"]].count(True) == 1, (a, b)
        loser = b if a["won"] else a
        assert loser["exit"] == 2 and loser["took"] < 2.0, loser
    names = json.loads(gt(shared["a"], "status", "--json").stdout)["clusters"]
    assert sorted(c["name"] for c in names) == sorted(["shared", *(f"race-{n}" for n in range(0, trials, 2))])
    shared_jobs = json.loads(gt(shared["a"], "status", "shared", "--json").stdout)["jobs"]
    assert len(shared_jobs) == trials // 2  # one job per launch trial, never two


HOLDER = """import sys, time
from gtrain.locks import cluster_lock
from gtrain.state import gtrain_home
with cluster_lock(gtrain_home(), "held", "launch"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_killed_holder_frees_its_lease_after_expiry_and_break_lock_warns(
        shared: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from gtrain import locks

    monkeypatch.setenv("GTRAIN_LEASE_S", "2")
    env = {**shared["a"], "GTRAIN_LEASE_S": "2"}

    def holder() -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        return p

    p = holder()
    time.sleep(2.5)  # past one expiry: the holder's renewals keep it
    with pytest.raises(GtrainError) as e, locks.cluster_lock(tmp_path / "b", "held", "launch"):
        pass
    assert e.value.exit_code == 2 and "lease until" in str(e.value)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.stdout is not None
    p.stdout.close()
    killed = time.monotonic()
    while True:
        try:
            with locks.cluster_lock(tmp_path / "b", "held", "launch"):
                break
        except GtrainError:
            assert time.monotonic() - killed < 6, "the killed holder's lease never ran out"
            time.sleep(0.2)
    assert time.monotonic() - killed > 0.5  # it was not free at once: it ran out
    p = holder()
    try:
        locks.BREAK_LOCK = True
        with locks.cluster_lock(tmp_path / "b", "held", "down"):
            pass
        assert "--break-lock: taking cluster 'held'" in capsys.readouterr().err
    finally:
        p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()


def test_status_of_20_clusters_is_fast_and_imports_no_sdk(shared: dict[str, Any], tmp_path: Path) -> None:
    from gtrain.sharedstate import open_store

    store = open_store(tmp_path / "a")
    for n in range(20):
        c = store.create_cluster(name=f"s{n}", provider="local", num_nodes=2, spec={"name": f"s{n}"})
        store.upsert_node(c.id, 0, status="up", address="127.0.0.1")
        store.create_job(c.id, f"s{n}-job", {"run": "x.py"})
    store.close()
    # the modules the path imports are loaded first (an installed gtrain has their bytecode; a fresh checkout
    # compiles them on first use): what is timed is the cold cache's LIST + 20 GETs, then the warm one's LIST
    probe = ("import sys, time, io, contextlib\nfrom gtrain.cli.fast import handle\n"
             "import gtrain.api, gtrain.runs.cluster, gtrain.cli.views, gtrain.sharedstate.store\n"
             "import gtrain.sync.objstore, gtrain.sync.condput, gtrain.sync.s3wire\n"
             "for _ in range(2):\n t = time.perf_counter()\n buf = io.StringIO()\n"
             " with contextlib.redirect_stdout(buf): handle(['status', '--json'])\n"
             " print(time.perf_counter() - t, len(__import__('json').loads(buf.getvalue())['clusters']))\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'boto3', 'botocore', 'google', 'azure', "
             "'paramiko', 'torch', 'typer', 'obstore'}))\n")
    r = subprocess.run([sys.executable, "-c", probe], env=shared["b"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    cold, warm = (line.split() for line in lines[:2])
    assert cold[1] == warm[1] == "20"
    assert float(cold[0]) <= 0.5 and float(warm[0]) <= 0.5, lines
    assert lines[2] == "[]"


def test_a_bad_state_url_is_one_message(shared: dict[str, Any]) -> None:
    r = gt({**shared["b"], "GTRAIN_STATE": "ftp://team/state"}, "status")
    assert r.returncode == 2 and "GTRAIN_STATE" in r.stderr and "Traceback" not in r.stderr, r.stderr
    home = Path(shared["b"]["GTRAIN_HOME"])
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("state: s3://BAD_bucket/x\n")
    env = {k: v for k, v in shared["b"].items() if k != "GTRAIN_STATE"}
    r = gt(env, "status")
    assert r.returncode == 2 and "config.yaml" in r.stderr and "not a valid S3 bucket" in r.stderr, r.stderr


QJOB = """import os, pathlib, time
if os.environ["LABEL"] == "blocker":
    while not pathlib.Path(os.environ["RELEASE"]).exists():
        time.sleep(0.05)
with open(os.environ["QUEUE_LOG"], "a") as f:
    f.write(os.environ["LABEL"] + "\\n")
print("ran", os.environ["LABEL"], flush=True)
"""


def test_a_queue_filled_on_a_is_followed_and_cancelled_from_b(shared: dict[str, Any], tmp_path: Path) -> None:
    """Issue 39: machine A queues jobs on a 1-node cluster; machine B, with nothing in its home but the shared
    state, lists the same queue, cancels a waiting job, follows a waiting one to its end."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(QJOB)
    log, release = tmp_path / "order.log", tmp_path / "release"
    spec = tmp_path / "sq.yaml"
    spec.write_text(json.dumps({"name": "sq", "provider": "local", "num_nodes": 1, "job": {
        "workdir": str(work), "run": "job.py", "launcher": "python", "python": sys.executable,
        "env": {"QUEUE_LOG": str(log), "RELEASE": str(release), "LABEL": "unset"}}}))
    a, b = shared["a"], shared["b"]
    assert gt(a, "up", str(spec)).returncode == 0
    try:
        ids = {}
        for label, prio in (("blocker", 0), ("low", 1), ("high", 9), ("doomed", 5)):
            r = gt(a, "launch", str(spec), "--queue", "--priority", str(prio), "--env", f"LABEL={label}", "--json")
            assert r.returncode == 0, r.stderr
            ids[label] = json.loads(r.stdout)["job_id"]
        assert not Path(b["GTRAIN_HOME"]).exists()
        r = gt(b, "queue", "sq", "--json")
        assert r.returncode == 0, r.stderr
        docs = json.loads(r.stdout)["jobs"]
        assert [d["job_id"] for d in docs if d["state"] == "waiting"] == [ids[k] for k in ("high", "doomed", "low")]
        assert [d["state"] for d in docs if d["job_id"] == ids["blocker"]] == ["running"]
        r = gt(b, "cancel", "sq", "--job", ids["doomed"], "--json")
        assert r.returncode == 0, r.stderr
        follower = subprocess.Popen([sys.executable, "-m", "gtrain", "logs", "sq", "--job", ids["low"], "-f"],
                                    env=b, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL)
        release.touch()
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert "ran low" in out
        assert log.read_text().split() == ["blocker", "high", "low"]
        r = gt(a, "queue", "sq", "--json")  # A sees what B did
        states = {d["job_id"]: d["state"] for d in json.loads(r.stdout)["jobs"]}
        assert states[ids["doomed"]] == "cancelled" and states[ids["low"]] == "succeeded", states
    finally:
        gt(a, "down", "sq", "--yes")
