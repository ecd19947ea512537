"""`launch --dry-run` / `run --dry-run` of a scheduler's spec whose cluster does not exist (issue 40): rendered
offline, with no API server, Slurm login node or Ray cluster reachable -- the Kubernetes manifests, the Slurm
batch script, the Ray job submission -- each with placeholders for what only the live cluster knows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

NOWHERE = "127.0.0.1:9"  # nothing listens there
SPECS = {
    "kubernetes": {"resources": {"accelerators": "H100:8"}, "job": {"image": "nvcr.io/nvidia/pytorch:25.01-py3"}},
    "slurm": {"resources": {"accelerators": "H100:8"}, "slurm": {"login": f"me@{NOWHERE}", "partition": "gpu"}},
    "ray": {"resources": {"accelerators": "A100:8"}, "ray": {"address": f"http://{NOWHERE}"}},
}


def gtrain(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = tmp / "kubeconfig"  # a context whose API server is not there
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://{NOWHERE}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "RAY_ADDRESS": f"http://{NOWHERE}",
           "HTTPS_PROXY": f"http://{NOWHERE}", "HTTP_PROXY": f"http://{NOWHERE}"}
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=env)


def write_spec(tmp: Path, provider: str) -> Path:
    (tmp / "train.py").write_text("print('hi')\n")
    doc = {"name": f"pv-{provider}", "provider": provider, "num_nodes": 2, **SPECS[provider]}
    doc["job"] = {**doc.get("job", {}), "workdir": str(tmp), "run": "train.py", "env": {"LR": "0.1"}}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def objects(stdout: str, name: str) -> str:
    """The text printed under ``# ---- node 0: NAME ----``."""
    head = f"# ---- node 0: {name} ----\n"
    assert head in stdout, stdout[:3000]
    return stdout.split(head, 1)[1].split("\n# ---- node ", 1)[0]


@pytest.mark.parametrize("command", ["launch", "run"])
def test_kubernetes_dry_run_prints_the_manifests_offline(tmp_path: Path, command: str) -> None:
    r = gtrain(tmp_path, command, str(write_spec(tmp_path, "kubernetes")), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("plan\n") and "no cluster pv-kubernetes yet" in r.stdout
    docs = list(yaml.safe_load_all(objects(r.stdout, "objects.yaml")))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"], docs
    job = docs[2]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert docs[1]["spec"]["clusterIP"] == "None"  # headless: pod 0's stable name is the rendezvous
    for node in (0, 1):
        assert f"# ---- node {node}: node-{node}/launch.sh ----" in r.stdout
    assert "export LR=0.1" in r.stdout and "<job-id>" in r.stdout
    assert json.loads(gtrain(tmp_path, "status", "--json").stdout) == {"clusters": []}


def test_slurm_dry_run_prints_the_batch_script_offline(tmp_path: Path) -> None:
    r = gtrain(tmp_path, "launch", str(write_spec(tmp_path, "slurm")), "--dry-run")
    assert r.returncode == 0, r.stderr
    batch = objects(r.stdout, "batch.sh")
    assert batch.startswith("#!") and "#SBATCH --nodes=2" in batch and "#SBATCH --partition=gpu" in batch
    assert "#SBATCH --gpus-per-node=8" in batch and "#SBATCH --output=<root>/jobs/<job-id>/batch.log" in batch
    for node in (0, 1):
        assert f"# ---- node {node}: node-{node}/launch.sh ----" in r.stdout
    assert "export LR=0.1" in r.stdout
    doc = json.loads(gtrain(tmp_path, "run", str(tmp_path / "spec.yaml"), "--dry-run", "--json").stdout)
    assert "#SBATCH --nodes=2" in doc["scripts"]["0"]["batch.sh"]


def test_ray_dry_run_prints_the_job_submission_offline(tmp_path: Path) -> None:
    r = gtrain(tmp_path, "launch", str(write_spec(tmp_path, "ray")), "--dry-run")
    assert r.returncode == 0, r.stderr
    body = json.loads(objects(r.stdout, "ray-job.json"))
    assert body["entrypoint"].endswith("_gtrain/driver.py") and body["submission_id"] == "<job-id>"
    assert body["driver"]["num_nodes"] == 2 and body["driver"]["bundle"]["GPU"] == 8
    assert body["runtime_env"]["working_dir"].startswith("gcs://_ray_pkg_")
    for node in (0, 1):
        assert f"# ---- node {node}: launch.sh ----" in r.stdout
    assert "export LR=0.1" in r.stdout


@pytest.mark.parametrize("provider", ["kubernetes", "slurm", "ray"])
def test_a_scheduler_gets_job_gpus_per_node_and_packs_itself(tmp_path: Path, provider: str) -> None:
    """Issue 39: `job.gpus_per_node: 2` of 8 on two nodes is mapped to the scheduler's request (it packs jobs on
    its nodes itself), where gtrain's own queue would refuse a multi-node packed job."""
    path = write_spec(tmp_path, provider)
    doc = yaml.safe_load(path.read_text())
    doc["job"]["gpus_per_node"] = 2
    path.write_text(yaml.safe_dump(doc))
    r = gtrain(tmp_path, "launch", str(path), "--dry-run")
    assert r.returncode == 0, r.stderr
    if provider == "kubernetes":
        pod = list(yaml.safe_load_all(objects(r.stdout, "objects.yaml")))[2]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    elif provider == "slurm":
        batch = objects(r.stdout, "batch.sh")
        assert "#SBATCH --gpus-per-node=2" in batch and "--gpus-per-node=8" not in batch
    else:
        assert json.loads(objects(r.stdout, "ray-job.json"))["driver"]["bundle"]["GPU"] == 2
    assert "--nproc-per-node=2" in r.stdout or "NPROC_PER_NODE=2" in r.stdout or "nproc_per_node 2" in r.stdout \
        or "--nproc_per_node=2" in r.stdout, r.stdout[-3000:]
    doc["job"]["gpus_per_node"] = 9  # more than a node has: refused everywhere, nothing made
    path.write_text(yaml.safe_dump(doc))
    r = gtrain(tmp_path, "launch", str(path), "--dry-run")
    assert r.returncode == 2 and "job.gpus_per_node: 9 but a node has 8" in r.stderr, r.stderr
