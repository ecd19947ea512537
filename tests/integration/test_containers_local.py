"""job.image on the local provider, on a real dockerd (tests/fixtures/docker.py): 2 nodes x 2 processes of real
torchrun/gloo, every rank inside the node's container.

The test image holds a marker file and nothing else; the host's /usr, python and venv are bind-mounted into it
read-only through job.container.mounts (building an image with python and torch would take minutes here), so a
rank that prints the marker ran in the container, with the host's python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gtrain
from gtrain.errors import GtrainError
from gtrain.jobs.backend import LogLine
from tests.fixtures.docker import Dockerd, Registry

JOBS = Path(__file__).parent / "jobs"
PYROOT = Path(os.path.realpath(sys.executable)).parents[1]  # the interpreter's prefix (pyenv here)
MOUNTS = [{"host": p, "path": p, "read_only": True} for p in sorted({"/usr", str(PYROOT), sys.prefix})]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ctr-home")


@pytest.fixture
def env(home: Path, dockerd: Dockerd, monkeypatch: pytest.MonkeyPatch) -> Dockerd:
    monkeypatch.setenv("GTRAIN_HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    return dockerd


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ctr-work")
    shutil.copy(JOBS / "image_probe.py", d / "image_probe.py")
    return d


def write_spec(workdir: Path, image: str, run: str = "image_probe.py", **extra: object) -> Path:
    job = {"workdir": str(workdir), "run": run, "nproc_per_node": 2, "python": sys.executable,
           "env": {"OMP_NUM_THREADS": "1"}, "checkpoint_dir": "ckpt", "image": image,
           "container": {"mounts": MOUNTS}}
    job.update(extra)  # type: ignore[arg-type]
    p = workdir / "ctr.yaml"
    p.write_text(json.dumps({"name": "ctr", "provider": "local", "num_nodes": 2, "job": job}))
    return p


@pytest.fixture(scope="module")
def cluster(home: Path, workdir: Path, dockerd: Dockerd) -> Iterator[Path]:
    os.environ["GTRAIN_HOME"] = str(home)
    spec = write_spec(workdir, dockerd.image)
    gtrain.up(spec)
    yield spec
    os.environ["GTRAIN_HOME"] = str(home)
    gtrain.down("ctr")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env=dict(os.environ))


def test_every_rank_runs_in_the_image_logs_exit_and_checkpoints(cluster: Path, env: Dockerd, workdir: Path,
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", "ctr-s3cr3t-value")
    spec = write_spec(workdir, env.image, secrets=["TOKEN"])
    job = gtrain.launch(spec)
    lines: list[LogLine] = []
    final = gtrain.wait("ctr", job_id=job.job_id, on_line=lines.append)
    assert (final.status, final.exit_code) == ("succeeded", 0), "\n".join(ln.text for ln in lines)
    ranks = {(ln.node, ln.rank) for ln in lines if f"marker={env.marker}" in ln.text}
    assert sorted(r for _n, r in ranks) == [0, 1, 2, 3] and sorted(n for n, _r in ranks) == [0, 0, 1, 1]
    pulled = gtrain.pull("ctr", to=tmp_path / "ck")
    assert pulled.transferred == ["marker.txt"]
    assert (tmp_path / "ck" / "marker.txt").read_text() == f"{env.marker} ctr-s3cr3t-value"
    assert env.containers() == []  # --rm: nothing left once the job ended
    # the secret went on stdin: nowhere in gtrain's home (state, scripts, logs)
    for p in Path(os.environ["GTRAIN_HOME"]).rglob("*"):
        if p.is_file() and p.name != "marker.txt":  # (the job itself wrote it into its checkpoint)
            assert b"ctr-s3cr3t" not in p.read_bytes(), p


def test_failing_rank_exit_code_as_without_image(cluster: Path, env: Dockerd, workdir: Path) -> None:
    r = cli("launch", str(write_spec(workdir, env.image, run="image_probe.py --exit-code 7")), "--wait")
    assert r.returncode == 7, r.stderr[-2000:]
    assert env.containers() == []


def test_cancel_removes_the_containers(cluster: Path, env: Dockerd, workdir: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TOKEN", "ctr-inspect-s3cr3t")
    job = gtrain.launch(write_spec(workdir, env.image, run="image_probe.py --sleep 300", secrets=["TOKEN"]))
    deadline = time.time() + 240
    while True:  # every rank up inside its container
        lines: list[LogLine] = []
        gtrain.logs("ctr", job_id=job.job_id, on_line=lines.append)
        if sum(f"marker={env.marker}" in ln.text for ln in lines) == 4:
            break
        assert time.time() < deadline, [ln.text for ln in lines]
        time.sleep(1)
    ids = env.containers(f"gtrain.job={job.job_id}")
    assert len(ids) == 2
    # the secret reached the ranks on stdin: not in `docker inspect`, nor in any process's argv
    assert "ctr-inspect-s3cr3t" not in env.docker("inspect", *ids)
    assert "ctr-inspect-s3cr3t" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    gtrain.cancel("ctr")
    assert env.containers() == []


def test_dry_run_prints_each_nodes_container_command(cluster: Path, env: Dockerd, workdir: Path) -> None:
    r = cli("launch", str(write_spec(workdir, env.image)), "--dry-run")
    assert r.returncode == 0, r.stderr
    for node in (0, 1):
        head = f"# ---- node {node}: command ----\n"
        assert head in r.stdout or head in r.stderr
    cmds = [ln for ln in r.stdout.splitlines() if ln.startswith("docker run")]
    assert len(cmds) == 2
    for node, c in enumerate(cmds):
        assert f"--name gtrain-ctr--job-id--n{node} " in c
        for flag in ("--network host", "--ipc host", "--pid host", "--shm-size 16g", "--init", "--rm"):
            assert flag in c
        assert "--gpus" not in c  # the local nodes have no GPUs
        assert f'"${{__gtrain_dev[@]}}" {env.image} bash ' in c and c.endswith("/container.sh'")
    assert "--ulimit memlock=-1" in r.stdout  # launch.sh adds it where the node allows
    assert env.containers() == []


def test_owned_option_refused_exit_2(cluster: Path, env: Dockerd, workdir: Path) -> None:
    spec = write_spec(workdir, env.image, container={"mounts": MOUNTS, "options": ["--network=bridge"]})
    r = cli("launch", str(spec))
    assert r.returncode == 2 and "job.container.options" in r.stderr and "--network=bridge" in r.stderr
    assert "Traceback" not in r.stderr


def test_private_registry_pull_and_wrong_password(cluster: Path, env: Dockerd, registry: Registry,
                                                  workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = {"username": registry.user, "password_secret": "REG_PASSWORD"}
    spec = write_spec(workdir, registry.image, image_credentials=creds)
    monkeypatch.setenv("REG_PASSWORD", "wrong-pw-value-xyz")
    with pytest.raises(GtrainError) as err:
        gtrain.launch(spec)
    msg = err.value.message
    assert registry.image in msg and "node 0" in msg or "node 1" in msg
    assert "unauthorized" in msg.lower() or "401" in msg
    assert env.containers() == [] and registry.image not in env.docker("images", "--format", "{{.Repository}}")
    r = cli("launch", str(spec))
    assert r.returncode == 1 and "wrong-pw-value" not in r.stderr + r.stdout
    for p in Path(os.environ["GTRAIN_HOME"]).rglob("*"):
        if p.is_file():
            assert b"wrong-pw-value" not in p.read_bytes(), p

    monkeypatch.setenv("REG_PASSWORD", registry.password)
    job = gtrain.launch(spec)
    final = gtrain.wait("ctr", job_id=job.job_id)
    assert (final.status, final.exit_code) == ("succeeded", 0)
    assert list((Path(os.environ["GTRAIN_HOME"])).rglob("config.json")) == []
    assert env.containers() == []


def test_sigterm_to_gtrain_run_leaves_no_container(env: Dockerd, workdir: Path, tmp_path: Path) -> None:
    import signal
    import time

    spec = write_spec(workdir, env.image, run="image_probe.py --sleep 300")
    data = json.loads(spec.read_text())
    data["name"] = "ctrsig"
    spec = tmp_path / "ctrsig.yaml"
    spec.write_text(json.dumps(data))
    proc = subprocess.Popen([sys.executable, "-m", "gtrain", "run", str(spec), "--to", str(tmp_path / "out")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ))
    try:
        deadline = time.time() + 240
        while len(env.containers("gtrain.cluster=ctrsig")) < 2:
            assert proc.poll() is None and time.time() < deadline, "the containers never started"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 143, out.decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert env.containers() == []
