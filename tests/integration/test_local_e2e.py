"""Real torchrun DDP through gtrain on the local provider: 2 nodes x 2 processes, gloo over 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gtrain
from gtrain.errors import JobConflict
from gtrain.events import Reporter
from gtrain.jobs.backend import LogLine

JOBS = Path(__file__).parent / "jobs"
INJECT = '"; rm -rf ~ #'
QUOTES = "it's $HOME `id` \"q\""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-home")


@pytest.fixture
def gtrain_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # overrides the per-test home
    monkeypatch.setenv("GTRAIN_HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    return home


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("work")
    shutil.copy(JOBS / "probe.py", d / "probe.py")
    return d


def write_spec(workdir: Path, name: str, run: str, **extra: object) -> Path:
    job = {"workdir": str(workdir), "run": run, "nproc_per_node": 2,
           "env": {"INJECT": INJECT, "QUOTES": QUOTES, "OMP_NUM_THREADS": "1"}, "checkpoint_dir": "ckpt"}
    job.update(extra)  # type: ignore[arg-type]
    p = workdir / f"{name}.yaml"
    p.write_text(json.dumps({"name": name, "provider": "local", "num_nodes": 2, "job": job}))
    return p


@pytest.fixture(scope="module")
def cluster(home: Path, workdir: Path) -> Iterator[Path]:
    os.environ["GTRAIN_HOME"] = str(home)
    spec = write_spec(workdir, "e2e", "probe.py --arg 'a b;c'", secrets=["TOKEN"])
    res = gtrain.up(spec)
    assert res.created
    yield spec
    os.environ["GTRAIN_HOME"] = str(home)
    gtrain.down("e2e")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def test_two_node_job_succeeds_env_logs_and_pull(cluster: Path, gtrain_home: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", "s3cr3t-$(id);x")
    job = gtrain.launch(cluster)
    lines: list[LogLine] = []
    final = gtrain.wait("e2e", job_id=job.job_id, on_line=lines.append)
    assert (final.status, final.exit_code) == ("succeeded", 0)
    hello = {(ln.node, ln.rank) for ln in lines if ln.text.startswith("hello from rank")}
    # static rendezvous: node K holds global ranks 2K and 2K+1
    assert sorted(hello) == [(0, 0), (0, 1), (1, 2), (1, 3)]

    # env values arrive byte for byte, secrets from stdin, the contract is complete
    pulled = gtrain.pull("e2e", to=tmp_path / "ck")
    assert sorted(pulled.transferred) == ["env.json", "sub/model.bin"]
    env = json.loads((tmp_path / "ck" / "env.json").read_text())
    assert env["INJECT"] == INJECT and env["QUOTES"] == QUOTES and env["arg"] == "a b;c"
    assert env["TOKEN"] == "s3cr3t-$(id);x"
    assert env["GTRAIN_NUM_NODES"] == "2" and env["GTRAIN_NODE_IPS"] == "127.0.0.1,127.0.0.1"
    assert env["GTRAIN_JOB_ID"] == job.job_id and env["WORLD_SIZE"] == "4"
    assert env["GTRAIN_CHECKPOINT_DIR"].endswith("/workdir/ckpt")

    # the secret's value is nowhere on disk: not in state, not in rendered scripts, not in logs
    for p in gtrain_home.rglob("*"):
        if p.is_file() and p.name != "env.json":
            assert b"s3cr3t" not in p.read_bytes(), p

    # logs afterwards, from a fresh process: all 4 ranks, prefixed, filtered by node/rank, tail
    out = cli("logs", "e2e").stdout
    for node, rank in hello:
        assert f"[node {node} rank {rank}] hello from rank {rank}/4" in out
    node3 = next(n for n, r in hello if r == 3)
    only = cli("logs", "e2e", "--node", str(node3), "--rank", "3").stdout.strip().splitlines()
    assert only and all(ln.startswith(f"[node {node3} rank 3] ") for ln in only)
    assert len(cli("logs", "e2e", "--rank", "0", "--tail", "1").stdout.strip().splitlines()) == 1

    # re-pull moves nothing; a damaged local file is re-fetched; an interrupted pull resumes
    again = gtrain.pull("e2e", to=tmp_path / "ck")
    assert again.transferred == [] and sorted(again.skipped) == ["env.json", "sub/model.bin"]
    model = tmp_path / "ck" / "sub" / "model.bin"
    data = model.read_bytes()
    model.write_bytes(b"x" * len(data))
    assert gtrain.pull("e2e", to=tmp_path / "ck").transferred == ["sub/model.bin"]
    assert model.read_bytes() == data
    model.unlink()
    part = tmp_path / "ck" / ".gtrain-partial" / "sub" / "model.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[: len(data) // 2])
    res = gtrain.pull("e2e", to=tmp_path / "ck")
    assert res.resumed == ["sub/model.bin"] and res.bytes == len(data) - len(data) // 2
    assert model.read_bytes() == data and not (tmp_path / "ck" / ".gtrain-partial").exists()


def test_failing_job_exit_code_comes_back(cluster: Path, gtrain_home: Path, workdir: Path) -> None:
    spec = write_spec(workdir, "e2e", "probe.py --exit-code 7")
    r = cli("launch", str(spec), "--wait")
    assert r.returncode == 7, r.stderr[-2000:]
    assert "rank 3] rank 3 exiting with 7" in r.stdout
    st = json.loads(cli("status", "e2e", "--json").stdout)
    assert (st["jobs"][-1]["status"], st["jobs"][-1]["exit_code"]) == ("failed", 7)


def test_running_job_refuses_second_launch_force_cancels(cluster: Path, gtrain_home: Path, workdir: Path) -> None:
    spec = write_spec(workdir, "e2e", "probe.py --sleep 120")
    first = gtrain.launch(spec)
    r = cli("launch", str(spec))
    assert r.returncode == 2 and "still" in r.stderr and "--force" in r.stderr
    with pytest.raises(JobConflict):
        gtrain.launch(spec)
    t0 = time.monotonic()
    second = gtrain.launch(write_spec(workdir, "e2e", "probe.py"), force=True)
    assert time.monotonic() - t0 < 60
    st = {j["id"]: j for j in gtrain.status("e2e")[0]["jobs"]}
    assert st[first.job_id]["status"] == "cancelled"
    assert gtrain.wait("e2e", job_id=second.job_id).status == "succeeded"


def test_node_dies_mid_job_reported_failed_and_rest_stopped(cluster: Path, gtrain_home: Path,
                                                            workdir: Path) -> None:
    job = gtrain.launch(write_spec(workdir, "e2e", "probe.py --sleep 120"))
    node1 = gtrain_home / "clusters" / "e2e" / "node-1" / "jobs" / job.job_id
    deadline = time.monotonic() + 60
    while len(list((node1 / "logs").glob("rank-*.log"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = int((node1 / "pid").read_text())
    os.killpg(pid, 9)  # the whole node's job, launcher included, as if the machine vanished
    t0 = time.monotonic()
    final = gtrain.wait("e2e", job_id=job.job_id)
    assert final.status == "failed" and final.exit_code != 0
    assert time.monotonic() - t0 < 60  # node 0 was stopped, not left hanging in a collective
    assert final.info["nodes"][0]["state"] in ("cancelled", "failed")
    # torchrun starts workers in sessions of their own: the dead node's orphaned ranks must not live on
    from gtrain.remote.nodeside import job_pids

    deadline = time.monotonic() + 30
    while job_pids(job.job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_pids(job.job_id) == []


def test_run_one_command_then_down_twice(workdir: Path, gtrain_home: Path, tmp_path: Path) -> None:
    spec = write_spec(workdir, "oneshot", "probe.py")
    r = cli("run", str(spec), "--to", str(tmp_path / "out"), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0
    assert sorted(doc["pulled"]["transferred"]) == ["env.json", "sub/model.bin"]
    assert doc["down"]["already_down"] is False and len(doc["down"]["cost"]["lines"]) == 2
    assert not (gtrain_home / "clusters" / "oneshot").exists()
    r2 = cli("down", "oneshot")
    assert r2.returncode == 0 and "already down" in r2.stdout


def test_quickstart_example_trains_checkpoints_and_resumes(gtrain_home: Path, repo_root: Path, tmp_path: Path) -> None:
    """The README's main job: loss falls, every node checkpoints, a second launch resumes."""
    from gtrain.spec import load_spec

    spec = load_spec(repo_root / "examples" / "quickstart" / "spec.yaml", name="qs-test")
    assert spec.job is not None
    gtrain.up(spec)
    try:
        lines: list[LogLine] = []
        first = gtrain.launch(spec.model_copy(update={"job": spec.job.model_copy(
            update={"run": "train.py --steps 20 --ckpt-every 10"})}))
        assert gtrain.wait("qs-test", job_id=first.job_id, on_line=lines.append).exit_code == 0
        losses = [float(ln.text.split()[-1]) for ln in lines if "loss" in ln.text]
        assert len(losses) >= 4 and losses[-1] < losses[0]
        lines.clear()
        second = gtrain.launch(spec.model_copy(update={"job": spec.job.model_copy(
            update={"run": "train.py --steps 30 --ckpt-every 10"})}))
        assert gtrain.wait("qs-test", job_id=second.job_id, on_line=lines.append).exit_code == 0
        assert any("resumed from step-000020.pt at step 20" in ln.text for ln in lines)
        pulled = gtrain.pull("qs-test", to=tmp_path / "qs")
        assert {"step-000010.pt", "step-000020.pt", "step-000030.pt"} <= set(pulled.transferred)
    finally:
        gtrain.down("qs-test")


def test_job_data_downloaded_on_every_node_from_s3(moto_server: str, gtrain_home: Path, tmp_path: Path,
                                                   workdir: Path) -> None:
    """job.data: each node fetches s3://… itself (gtrain's sync engine shipped as a zip), before setup."""
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="gtrain-data")
    for i in range(5):
        s3.put_object(Bucket="gtrain-data", Key=f"ds/part-{i}.txt", Body=f"row {i}\n".encode())
    spec = write_spec(workdir, "withdata", "probe.py", data=[{"src": "s3://gtrain-data/ds", "dst": "data"}],
                      setup="test $(ls data | wc -l) = 5 && cat data/part-3.txt",
                      secrets=["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
    raw = json.loads(spec.read_text())
    raw["job"]["env"]["AWS_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL"]
    spec.write_text(json.dumps(raw))
    gtrain.up(spec)
    try:
        lines: list[str] = []

        class Rep(Reporter):
            def line(self, node: int, rank: int | None, text: str) -> None:
                lines.append(f"{node}:{text}")

            def node(self, rank: int, msg: str) -> None:
                lines.append(f"{rank}:{msg}")

        job = gtrain.launch(spec, report=Rep())
        assert gtrain.wait("withdata", job_id=job.job_id).status == "succeeded"
        assert sorted(ln for ln in lines if ln.endswith("row 3")) == ["0:row 3", "1:row 3"]
        assert sum("5 downloaded" in ln for ln in lines) == 2
        for k in (0, 1):
            got = gtrain_home / "clusters" / "withdata" / f"node-{k}" / "workdir" / "data"
            assert sorted(p.name for p in got.iterdir()) == [f"part-{i}.txt" for i in range(5)]
        # a re-launch downloads nothing new; the secret never reached the rendered script
        lines.clear()
        job2 = gtrain.launch(spec, report=Rep())
        assert gtrain.wait("withdata", job_id=job2.job_id).status == "succeeded"
        assert sum("0 downloaded, 5 unchanged" in ln for ln in lines) == 2
        secret = os.environ["AWS_SECRET_ACCESS_KEY"].encode()
        for p in (gtrain_home / "clusters" / "withdata").rglob("*.sh"):
            assert secret not in p.read_bytes()
    finally:
        gtrain.down("withdata")


def test_job_data_bad_bucket_fails_launch_clearly(moto_server: str, gtrain_home: Path, workdir: Path) -> None:
    spec = write_spec(workdir, "nodata", "probe.py", data=[{"src": "s3://no-such-bucket-x/ds", "dst": "data"}],
                      secrets=["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
    raw = json.loads(spec.read_text())
    raw["job"]["env"]["AWS_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL"]
    spec.write_text(json.dumps(raw))
    gtrain.up(spec)
    try:
        r = cli("launch", str(spec))
        assert r.returncode == 1 and "no-such-bucket-x" in r.stderr and "job.data" in r.stderr, r.stderr
        assert json.loads(cli("status", "nodata", "--json").stdout)["jobs"][-1]["status"] == "failed"
    finally:
        gtrain.down("nodata")
