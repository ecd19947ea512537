"""provider: kubernetes against tests/fixtures/fake_kube.py (an API server at the wire whose kubelet runs each
pod as real processes): `gtrain run` of a 2-pod x 2-process torchrun job, a failing rank's exit code, `down`
mid-run leaving no labelled object, an evicted pod as PREEMPTED, pending reasons, the API's errors at `up`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.fake_kube import FakeKube, FakeNode

JOBS = Path(__file__).parent / "jobs"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    root = Path(tempfile.mkdtemp(prefix="gtrain-kube-"))
    k = FakeKube(root, nodes=[FakeNode(f"gpu-{i}", dict(H100), {"nvidia.com/gpu": "8"}) for i in range(2)]).start()
    try:
        yield k
    finally:
        k.stop()
        shutil.rmtree(root, ignore_errors=True)


def cli(kube: FakeKube, tmp: Path, *args: str, timeout: float = 300, token: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    cfg = kube.kubeconfig(tmp / "kubeconfig", token)
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**os.environ, "KUBECONFIG": str(cfg),
                                                         "PYTHONPATH": str(Path(__file__).parents[2])}, cwd=cwd)


def spec(tmp: Path, name: str, run: str, gpus: int = 8, **kube: Any) -> str:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "slurm_train.py", work / "slurm_train.py")
    doc = {"name": name, "provider": "kubernetes", "num_nodes": 2, "resources": {"accelerators": f"H100:{gpus}"},
           "kubernetes": {"shm_gb": 0, **kube},
           "job": {"image": "nvcr.io/nvidia/pytorch:25.01-py3", "workdir": str(work), "run": run,
                   "nproc_per_node": 2, "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}}}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


#: the store's endpoint and region reach the pods as job.env; its credentials as job.secrets (a Secret)
STORE_SECRETS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]


def with_store(path: str, moto: str, bucket: str, **job: Any) -> str:
    import boto3

    boto3.client("s3").create_bucket(Bucket=bucket)
    doc = yaml.safe_load(Path(path).read_text())
    doc["job"].update(checkpoint_store=f"s3://{bucket}/runs", checkpoint_dir="ckpt", secrets=STORE_SECRETS,
                      checkpoint_tuning={"settle_s": 1, "poll_s": 0.3}, **job)
    doc["job"]["env"].update(AWS_ENDPOINT_URL=moto, AWS_DEFAULT_REGION="us-east-1")
    Path(path).write_text(yaml.safe_dump(doc))
    return path


def test_run_two_pods_four_ranks(kube: FakeKube, tmp_path: Path, moto_server: str) -> None:
    """2 pods x 2 processes: every rank's lines, checkpoints through the store (the pods' tool, credentials from
    a Secret), pulled from the store, exit 0."""
    import json

    path = with_store(spec(tmp_path, "k8s-run", "slurm_train.py --steps 3"), moto_server, "k8s-run-ckpt")
    res = cli(kube, tmp_path, "run", path, "--no-report", "--to", str(tmp_path / "out"))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "total: $0.0000" in out and "could not" not in out, out[-3000:]
    for r in range(4):  # every rank's lines, from the pods' logs
        assert f"slurm rank {r}/4" in out, out[-4000:]
        assert f"slurm rank {r} step 3 sum 10.0" in out, out[-4000:]
    assert "created as Indexed Job" in out and "each pod probes a write" in out
    assert "final flush" in out and "uploaded state.json" in out, out[-4000:]  # the pods' tool, in their logs
    assert json.loads((tmp_path / "out" / "state.json").read_text())["step"] == 3  # from the store
    assert kube.labelled("gtrain.dev/cluster") == []  # down deleted every object of the cluster
    posted = [p for m, p in kube.requests if m == "POST"]
    assert any(p.endswith("/jobs") for p in posted) and any(p.endswith("/services") for p in posted)
    job = next(o for (p, _, _), o in kube.deleted.items() if p == "jobs")
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert all({"name": s, "valueFrom": {"secretKeyRef": {"name": job["metadata"]["name"], "key": s}}} in env
               for s in STORE_SECRETS) and not any(e["name"] in STORE_SECRETS and "value" in e for e in env)


def test_failing_rank_exit_code_comes_out(kube: FakeKube, tmp_path: Path) -> None:
    here = tmp_path / "cwd"
    here.mkdir()
    res = cli(kube, tmp_path, "run", spec(tmp_path, "k8s-fail", "slurm_train.py --steps 1 --exit-code 7"),
              "--no-report", cwd=here)
    assert res.returncode == 7, (res.stdout + res.stderr)[-4000:]
    assert "nothing to pull" in res.stdout + res.stderr
    assert list(here.iterdir()) == [], "run without --to made a folder though the pods' disks are gone"
    assert kube.labelled("gtrain.dev/cluster") == []


def wait_for(what: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("timed out")


def follow_until(kube: FakeKube, tmp: Path, name: str, text: str, timeout: float = 60) -> str:
    """`gtrain logs NAME -f` until a line says ``text`` (then stopped): what it printed."""
    cfg = kube.kubeconfig(tmp / "kubeconfig")
    proc = subprocess.Popen([sys.executable, "-m", "gtrain", "logs", name, "-f"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "KUBECONFIG": str(cfg)})
    said = ""
    deadline = time.monotonic() + timeout
    try:
        assert proc.stdout is not None
        while time.monotonic() < deadline and text not in said:
            line = proc.stdout.readline()
            if not line:
                break
            said += line
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return said


def running_pods(kube: FakeKube) -> list[dict[str, Any]]:
    pods = kube.select("pods")
    return pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else []


def test_evicted_pod_recovers_from_the_store_same_weights(kube: FakeKube, tmp_path: Path, moto_server: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Pod 1 evicted mid-run (DisruptionTarget) -> PREEMPTED -> policies.recovery relaunches the Job (attempt 2),
    every pod restores the newest checkpoint from the store, and the final weights (pulled from the store) equal
    an uninterrupted run's; `run`'s down leaves no object."""
    import threading

    import torch

    import gtrain
    from gtrain.checkpoints.store import Store
    from gtrain.jobs.backend import LogLine
    from tests.integration.durable_nodes import run_key
    from tests.integration.jobs.durable_train import reference

    steps, every = 8, 2
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOBS / "durable_train.py", work / "durable_train.py")
    path = with_store(spec(tmp_path, "k8s-evict", f"durable_train.py {steps} {every} 0.5"), moto_server,
                      "k8s-evict-ckpt", nproc_per_node=1)
    doc = yaml.safe_load(Path(path).read_text())
    doc["policies"] = {"recovery": {"max_restarts": 2, "backoff_s": 0}}
    Path(path).write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    key = run_key(Path(path))
    evicted: list[str] = []

    def evict_when_checkpointed() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not evicted:
            st = Store(doc["job"]["checkpoint_store"], key)
            done = [c.name for c in st.checkpoints() if c.complete]
            st.close()
            pods = [p for p in kube.select("pods") if p["status"].get("phase") == "Running"
                    and p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"]
            if "step-0002.pt" in done and pods:
                kube.evict("default", pods[0]["metadata"]["name"])
                evicted.append(pods[0]["metadata"]["name"])
            time.sleep(0.2)

    killer = threading.Thread(target=evict_when_checkpointed, daemon=True)
    killer.start()
    lines: list[LogLine] = []
    res = gtrain.run(path, to=tmp_path / "out", on_line=lines.append)
    killer.join(timeout=1)
    said = [x.text for x in lines]
    assert evicted, "no pod was evicted"
    assert res.status == "succeeded" and res.exit_code == 0, (res, said[-30:])
    assert len(res.recoveries) == 1 and res.recoveries[0]["kind"] == "preemption", res.recoveries
    assert res.recoveries[0]["lost"] == [1] and res.recoveries[0]["attempt"] == 2
    assert "EvictionByEvictionAPI" in res.recoveries[0]["detail"], res.recoveries
    final = torch.load(tmp_path / "out" / "final.pt")
    assert final["step"] == steps and final["w"].tolist() == reference(steps, 2)
    starts = [t for t in said if t.startswith("attempt 2 start")]  # both pods of attempt 2 resumed alike
    assert len(starts) == 2 and len({t.split(" resume ")[0] for t in starts}) == 1, starts
    assert int(starts[0].split()[3]) >= every, starts
    assert kube.labelled("gtrain.dev/cluster") == [] and kube.select("pods") == []


def test_down_mid_run_leaves_no_object(kube: FakeKube, tmp_path: Path) -> None:
    path = spec(tmp_path, "k8s-down", "slurm_train.py --steps 600 --step-s 0.1")
    assert cli(kube, tmp_path, "up", path).returncode == 0
    assert cli(kube, tmp_path, "launch", path).returncode == 0
    wait_for(lambda: running_pods(kube))
    procs = [r.proc for r in kube.runs.values()]
    down = cli(kube, tmp_path, "down", "k8s-down", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert kube.labelled("gtrain.dev/cluster") == []
    assert all(p.poll() is not None for p in procs)  # the pods' processes are gone, not only their objects


def test_pending_reasons_unschedulable_and_kueue(kube: FakeKube, tmp_path: Path) -> None:
    big = spec(tmp_path, "k8s-big", "slurm_train.py --steps 1", gpus=16)
    up = cli(kube, tmp_path, "up", big)
    assert up.returncode == 0 and "cannot fit now: 0 of 2 node(s) have 16" in up.stdout + up.stderr, up.stderr
    assert cli(kube, tmp_path, "launch", big).returncode == 0
    said = follow_until(kube, tmp_path, "k8s-big", "Insufficient nvidia.com/gpu")
    assert "is Pending (Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu" in said, said
    assert "pending" in cli(kube, tmp_path, "status", "k8s-big").stdout
    assert cli(kube, tmp_path, "down", "k8s-big", "--yes").returncode == 0

    queued = spec(tmp_path, "k8s-q", "slurm_train.py --steps 1", queue="team-a")
    assert cli(kube, tmp_path, "up", queued).returncode == 0
    assert cli(kube, tmp_path, "launch", queued).returncode == 0
    job = wait_for(lambda: kube.select("jobs"))[0]
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    said = follow_until(kube, tmp_path, "k8s-q", "waiting for admission")
    assert "suspended: waiting for admission (Kueue)" in said and kube.select("pods") == [], said
    kube.admit("default", job["metadata"]["name"])
    wait_for(lambda: any(p["status"].get("phase") == "Succeeded" for p in kube.select("pods")))
    assert cli(kube, tmp_path, "down", "k8s-q", "--yes").returncode == 0


@pytest.mark.parametrize(("case", "field"), [
    ("token", "kubernetes.context"), ("namespace", "kubernetes.namespace"), ("rbac", "create jobs"),
    ("image", "job.image"), ("shm", "kubernetes.shm_gb")])
def test_up_refuses_with_exit_2_and_creates_nothing(kube: FakeKube, tmp_path: Path, case: str, field: str) -> None:
    path = spec(tmp_path, "k8s-bad", "slurm_train.py", **({"namespace": "nope"} if case == "namespace" else
                                                          {"shm_gb": -1} if case == "shm" else {}))
    if case == "image":
        doc = yaml.safe_load(Path(path).read_text())
        del doc["job"]["image"]
        Path(path).write_text(yaml.safe_dump(doc))
    if case == "rbac":
        kube.denied.add(("create", "jobs"))
    res = cli(kube, tmp_path, "up", path, token="not-the-token" if case == "token" else None)
    assert res.returncode == 2, res.stdout + res.stderr
    assert field in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert kube.objects == {}


def test_dry_run_prints_the_objects_and_a_big_workdir_is_refused(kube: FakeKube, tmp_path: Path) -> None:
    path = spec(tmp_path, "k8s-dry", "slurm_train.py", profile="coreweave")
    kube.nodes.append(FakeNode("cw-0", {"gpu.nvidia.com/class": "H100_NVLINK_80GB"}, {"nvidia.com/gpu": "8"}))
    assert cli(kube, tmp_path, "up", path).returncode == 0
    res = cli(kube, tmp_path, "launch", path, "--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
    docs = list(yaml.safe_load_all(res.stdout.split("---- node 0: objects.yaml ----", 1)[1].split("# ----")[0]))
    cm, svc, job = docs
    assert (cm["kind"], svc["kind"], job["kind"]) == ("ConfigMap", "Service", "Job")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    js = job["spec"]
    assert (js["completionMode"], js["completions"], js["parallelism"]) == ("Indexed", 2, 2)
    pod = js["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"] == job["metadata"]["name"]
    assert pod["nodeSelector"] == {"gpu.nvidia.com/class": "H100_NVLINK_80GB"}
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "8", "rdma/ib": "1"}
    assert pod["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert all(o["metadata"]["labels"]["gtrain.dev/cluster"].startswith("k8s-dry-") for o in docs)
    name = job["metadata"]["name"]
    assert f"--rdzv_endpoint='{name}-0.{name}:" in res.stdout  # pod 0's stable name, through the Service
    posted = [p for m, p in kube.requests if m == "POST"]
    assert len(posted) == 8 and all(p.endswith("/selfsubjectaccessreviews") for p in posted[:7])  # + the anchor
    assert [o["kind"] for o in kube.objects.values()] == ["ConfigMap"]  # up made its anchor, nothing holding GPUs
    doc = yaml.safe_load(Path(path).read_text())
    doc["job"]["checkpoint_store"] = "s3://k8s-dry/runs"  # the tool's own ConfigMap, mounted; a probe per pod
    Path(path).write_text(yaml.safe_dump(doc))
    dur = cli(kube, tmp_path, "launch", path, "--dry-run")
    assert dur.returncode == 0, dur.stdout + dur.stderr
    objs = list(yaml.safe_load_all(dur.stdout.split("---- node 0: objects.yaml ----", 1)[1].split("# ----")[0]))
    assert [o["kind"] for o in objs] == ["ConfigMap", "ConfigMap", "Service", "Job"]
    tool = objs[1]
    assert tool["metadata"]["name"] == f"{name}-ckpt" and list(tool["binaryData"]) == ["gtrain-ckpt.pyz"]
    pod = objs[3]["spec"]["template"]["spec"]
    assert {"name": "ckpt", "configMap": {"name": f"{name}-ckpt"}} in pod["volumes"]
    assert {"name": "GTRAIN_ATTEMPT", "value": "1"} in pod["containers"][0]["env"]
    assert "---- node 1: node-1/ckpt-probe.sh ----" in dur.stdout and "gtrain-ckpt.pyz probe s3://k8s-dry/runs" \
        in dur.stdout, dur.stdout[-3000:]
    assert [o["kind"] for o in kube.objects.values()] == ["ConfigMap"]  # a dry run made nothing
    (tmp_path / "work" / "blob.bin").write_bytes(os.urandom(800 * 1024))
    big = cli(kube, tmp_path, "launch", path, "--dry-run")
    assert big.returncode == 2 and "job.workdir" in big.stderr and "700 KiB" in big.stderr, big.stderr


def test_api_errors_409_and_422_are_said_with_the_field(kube: FakeKube, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from lightkube import codecs

    from gtrain.errors import ConfigError
    from gtrain.providers.kubernetes.api import call, client

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig")))
    c = client(None, "default")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}, "data": {}}
    call(c.create, "create ConfigMap x", "default", codecs.from_dict(cm))
    with pytest.raises(ConfigError) as e:
        call(c.create, "create ConfigMap x", "default", codecs.from_dict(cm))
    assert "409 AlreadyExists" in e.value.message and e.value.exit_code == 2
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default"},
           "spec": {"completionMode": "Indexed", "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    with pytest.raises(ConfigError) as e:
        call(c.create, "create Job j", "default", codecs.from_dict(job))
    assert "spec.completions: Required value" in e.value.message and "422 Invalid" in e.value.message
    assert ("jobs", "default", "j") not in kube.objects


def test_exec_runs_in_the_pods_and_secrets_stay_in_a_secret(kube: FakeKube, tmp_path: Path) -> None:
    """`gtrain exec` runs in each pod over pods/exec (the websocket channels); job.secrets reach the ranks from a
    Secret (secretKeyRef) and no other stored object holds the value, plain or base64."""
    import base64
    import io
    import tarfile

    secret = "s3cr3t-" + os.urandom(6).hex()
    path = spec(tmp_path, "k8s-exec", "slurm_train.py --steps 600 --step-s 0.1")
    doc = yaml.safe_load(Path(path).read_text())
    doc["job"]["secrets"] = ["K8S_TEST_TOKEN"]
    Path(path).write_text(yaml.safe_dump(doc))
    os.environ["K8S_TEST_TOKEN"] = secret
    try:
        assert cli(kube, tmp_path, "up", path).returncode == 0
        res = cli(kube, tmp_path, "launch", path)
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        del os.environ["K8S_TEST_TOKEN"]
    wait_for(lambda: running_pods(kube))
    ex = cli(kube, tmp_path, "exec", "k8s-exec", "--", 'echo "host=$(hostname) rank=$GTRAIN_NODE_RANK '
             'tok=${K8S_TEST_TOKEN:0:7}"; cat /gtrain/jobs/node-$GTRAIN_NODE_RANK/command >/dev/null && exit 3')
    out = ex.stdout + ex.stderr
    assert ex.returncode == 3, out  # the command's own exit code, from the error channel's Status
    name = kube.select("jobs")[0]["metadata"]["name"]
    for k in range(2):
        assert f"host={name}-{k} rank={k} tok=s3cr3t-" in out, out
    one = cli(kube, tmp_path, "exec", "k8s-exec", "--node", "1", "--", "cat >/dev/null; echo ok")
    assert one.returncode == 0 and "ok" in one.stdout, one.stdout + one.stderr
    said, rc = ssh_in_a_terminal(kube, tmp_path, "k8s-exec", b"echo tty=$(tty) rank=$JOB_COMPLETION_INDEX; stty size; "
                                 b"exit 5\n")
    assert rc == 5 and "tty=/dev/pts/" in said and "rank=1" in said and "33 101" in said, said
    plain = cli(kube, tmp_path, "ssh", "k8s-exec", "--", "echo plain-$JOB_COMPLETION_INDEX; exit 4")
    assert plain.returncode == 4 and "plain-0" in plain.stdout, plain.stdout + plain.stderr

    sec = kube.select("secrets")
    assert [s["metadata"]["name"] for s in sec] == [name]
    assert base64.b64decode(sec[0]["data"]["K8S_TEST_TOKEN"]).decode() == secret
    marks = (secret, base64.b64encode(secret.encode()).decode())
    with kube.lock:
        others = {k: o for k, o in kube.objects.items() if k[0] != "secrets"}
        text = yaml.safe_dump(others)
    assert not any(m in text for m in marks)
    cm = next(o for (p, _, _), o in others.items() if p == "configmaps" and "bundle.tgz" in (o.get("binaryData") or {}))
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(cm["binaryData"]["bundle.tgz"]))) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m)
            assert f is None or secret.encode() not in f.read(), m.name
    env = kube.select("jobs")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "K8S_TEST_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "K8S_TEST_TOKEN"}}} in env
    assert cli(kube, tmp_path, "down", "k8s-exec", "--yes").returncode == 0
    assert kube.labelled("gtrain.dev/cluster") == []


def ssh_in_a_terminal(kube: FakeKube, tmp: Path, name: str, typed: bytes) -> tuple[str, int]:
    """`gtrain ssh NAME --node 1` on a terminal of 33 rows x 101 columns, ``typed`` into it: (what it showed,
    its exit code)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
    cfg = kube.kubeconfig(tmp / "kubeconfig")
    proc = subprocess.Popen([sys.executable, "-m", "gtrain", "ssh", name, "--node", "1"], stdin=slave, stdout=slave,
                            stderr=slave, start_new_session=True, env={**os.environ, "KUBECONFIG": str(cfg)})
    os.close(slave)
    os.write(master, typed)
    got = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: gtrain ssh has exited
                    break
                if not chunk:
                    break
                got += chunk
            elif proc.poll() is not None:
                break
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = -1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return got.decode(errors="replace"), rc


def test_gc_finds_objects_no_live_cluster_owns(kube: FakeKube, tmp_path: Path) -> None:
    path = spec(tmp_path, "k8s-gc", "slurm_train.py --steps 600 --step-s 0.1")
    assert cli(kube, tmp_path, "up", path).returncode == 0
    assert cli(kube, tmp_path, "launch", path).returncode == 0
    wait_for(lambda: running_pods(kube))
    listed = cli(kube, tmp_path, "gc", "--provider", "kubernetes", "--json")
    assert listed.returncode == 0 and yaml.safe_load(listed.stdout)["orphans"] == [], listed.stdout + listed.stderr
    home = Path(os.environ["GTRAIN_HOME"])
    shutil.rmtree(home / "state.db", ignore_errors=True)
    for f in home.glob("state.db*"):
        f.unlink()  # local state is gone: the cluster's objects are orphans now
    found = cli(kube, tmp_path, "gc", "--provider", "kubernetes", "--json")
    doc = yaml.safe_load(found.stdout)
    kinds = sorted({o["kind"] for o in doc["orphans"]})
    assert kinds == ["ConfigMap", "Job", "Pod", "Service"] and len(doc["clusters"]) == 1, found.stdout
    assert kube.labelled("gtrain.dev/cluster")  # listing deleted nothing
    procs = [r.proc for r in kube.runs.values()]
    swept = cli(kube, tmp_path, "gc", "--provider", "kubernetes", "--yes", "--json")
    assert swept.returncode == 0 and yaml.safe_load(swept.stdout)["deleted"] is True, swept.stdout + swept.stderr
    assert kube.labelled("gtrain.dev/cluster") == [] and all(p.poll() is not None for p in procs)


def test_launch_wait_honours_the_pending_timeout(kube: FakeKube, tmp_path: Path) -> None:
    big = spec(tmp_path, "k8s-pto", "slurm_train.py --steps 1", gpus=16, pending_timeout_s=4)
    assert cli(kube, tmp_path, "up", big).returncode == 0
    t0 = time.monotonic()
    res = cli(kube, tmp_path, "launch", big, "--wait", timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu" in out, out
    assert "still Pending after 4s (kubernetes.pending_timeout_s)" in out, out
    assert time.monotonic() - t0 < 60
    assert kube.select("jobs") == [] and kube.select("pods") == [] and kube.select("services") == []
    assert "failed" in cli(kube, tmp_path, "status", "k8s-pto").stdout
    assert cli(kube, tmp_path, "down", "k8s-pto", "--yes").returncode == 0
    assert kube.labelled("gtrain.dev/cluster") == []
