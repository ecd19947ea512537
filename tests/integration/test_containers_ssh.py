"""job.image on the ssh provider: two real sshd hosts (network namespaces), each with its own dockerd
(tests/fixtures/docker.py ``ssh_docker_hosts``); the ssh node runs the docker CLI itself, pulls the image from the
test registry with basic auth, and runs its launcher in one container. 2 nodes x 2 processes of real
torchrun/gloo across the hosts' network. aws/gcp nodes take this same node-script path over ssh.

As in test_containers_local.py, the host's /usr, python and venv are bind-mounted read-only into a marker-only
image (job.container.mounts): a rank that prints the marker ran inside the container.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.jobs.backend import LogLine
from gtrain.remote import ssh as sshmod
from tests.fixtures.docker import SSHDocker

JOBS = Path(__file__).parent / "jobs"
PYROOT = Path(os.path.realpath(sys.executable)).parents[1]
MOUNTS = [{"host": p, "path": p, "read_only": True} for p in sorted({"/usr", str(PYROOT), sys.prefix})]


@pytest.fixture(autouse=True)
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    monkeypatch.setenv("REG_PASSWORD", "")


def spec_for(tmp_path: Path, env: SSHDocker, name: str, run: str = "image_probe.py", **extra: object) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "image_probe.py").write_text((JOBS / "image_probe.py").read_text())
    hosts = [h.ssh for h in env.hosts]
    section = {"user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
               "hosts": [f"{h.address}:{h.port}" for h in hosts]}
    job = {"workdir": str(work), "run": run, "nproc_per_node": 2, "python": sys.executable, "checkpoint_dir": "ckpt",
           "env": {"OMP_NUM_THREADS": "1"}, "image": env.image, "container": {"mounts": MOUNTS},
           "image_credentials": {"username": env.registry.user, "password_secret": "REG_PASSWORD"}}
    job.update(extra)  # type: ignore[arg-type]
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps({"name": name, "provider": "ssh", "num_nodes": 2, "ssh": section, "job": job}))
    return p


def leftovers(env: SSHDocker, label: str = "gtrain.cluster") -> list[str]:
    return [c for h in env.hosts for c in h.containers(label)]


def wait_ranks(name: str, job_id: str, marker: str, n: int = 4) -> None:
    deadline = time.time() + 240
    while True:
        lines: list[LogLine] = []
        gtrain.logs(name, job_id=job_id, on_line=lines.append)
        if sum(f"marker={marker}" in ln.text for ln in lines) >= n:
            return
        assert time.time() < deadline, [ln.text for ln in lines][-20:]
        time.sleep(1)


def test_ssh_every_rank_in_the_image_then_cancel_and_down(ssh_docker_hosts: SSHDocker, dockerd, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    env, marker = ssh_docker_hosts, dockerd.marker
    monkeypatch.setenv("REG_PASSWORD", env.registry.password)
    spec = spec_for(tmp_path, env, "sctr")
    gtrain.up(spec)
    try:
        # launch --dry-run prints each node's exact container command, with the node's own paths
        r = subprocess.run([sys.executable, "-m", "gtrain", "launch", str(spec), "--dry-run"], capture_output=True,
                           text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr[-2000:]
        cmds = [ln for ln in r.stdout.splitlines() if ln.startswith("docker run")]
        assert len(cmds) == 2, r.stdout[-3000:]
        for node, c in enumerate(cmds):
            assert f"--name gtrain-sctr--job-id--n{node} " in c and f" {env.image} bash " in c
            assert "--network host" in c and "/gtrain/sctr/" in c  # the node's own root
        assert leftovers(env) == []

        lines: list[LogLine] = []
        job = gtrain.launch(spec)
        final = gtrain.wait("sctr", job_id=job.job_id, on_line=lines.append)
        assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-30:]
        ranks = {(ln.node, ln.rank) for ln in lines if f"marker={marker}" in ln.text}
        assert sorted(r for _n, r in ranks) == [0, 1, 2, 3] and sorted(n for n, _r in ranks) == [0, 0, 1, 1]
        assert all("allreduce=10.0" in ln.text for ln in lines if f"marker={marker}" in ln.text)
        pulled = gtrain.pull("sctr", to=tmp_path / "ck")
        assert pulled.transferred == ["marker.txt"]
        assert (tmp_path / "ck" / "marker.txt").read_text().startswith(marker)
        assert leftovers(env) == []
        # each node pulled the image itself, from the registry, with the credentials
        for h in env.hosts:
            assert env.image in subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                                               env={**os.environ, "DOCKER_HOST": h.docker_host},
                                               capture_output=True, text=True, check=True).stdout

        # a failing rank: the job's exit code, as without an image
        r = subprocess.run([sys.executable, "-m", "gtrain", "launch", str(spec_for(
            tmp_path, env, "sctr", run="image_probe.py --exit-code 7")), "--wait"],
            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert r.returncode == 7, r.stderr[-2000:]
        assert leftovers(env) == []

        # cancel stops and removes both nodes' containers
        job = gtrain.launch(spec_for(tmp_path, env, "sctr", run="image_probe.py --sleep 300"))
        wait_ranks("sctr", job.job_id, marker)
        assert len(leftovers(env, f"gtrain.job={job.job_id}")) == 2
        gtrain.cancel("sctr")
        assert leftovers(env) == []

        # down with a job running, and a container of the cluster no job record knows of: none left after
        job = gtrain.launch(spec_for(tmp_path, env, "sctr", run="image_probe.py --sleep 300"))
        wait_ranks("sctr", job.job_id, marker)
        h = env.hosts[1]
        subprocess.run(["docker", "run", "-d", "--label", "gtrain.cluster=sctr", "-v", "/usr:/usr:ro", env.image,
                        "/usr/bin/sleep", "300"], env={**os.environ, "DOCKER_HOST": h.docker_host}, check=True,
                       capture_output=True)
        assert len(leftovers(env)) == 3
    finally:
        gtrain.down("sctr", yes=True)
    assert leftovers(env) == []


def test_ssh_sigterm_to_gtrain_run_leaves_no_container(ssh_docker_hosts: SSHDocker, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    env = ssh_docker_hosts
    monkeypatch.setenv("REG_PASSWORD", env.registry.password)
    spec = spec_for(tmp_path, env, "sctrsig", run="image_probe.py --sleep 300")
    proc = subprocess.Popen([sys.executable, "-m", "gtrain", "run", str(spec), "--to", str(tmp_path / "out")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ))
    try:
        deadline = time.time() + 240
        while len(leftovers(env, "gtrain.cluster=sctrsig")) < 2:
            assert proc.poll() is None and time.time() < deadline, "the containers never started"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 143, out.decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert leftovers(env) == []
