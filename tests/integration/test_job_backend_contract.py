"""The job-backend contract: ONE set of tests, run on every job backend that exists, on every provider that
hands one out -- local (directories), ssh (the session's sshd hosts), aws (moto instances whose SSH is relayed
to sshd hosts), gcp (the fake Compute Engine, relayed the same way), lambda (the
fake Lambda Cloud API, relayed the same way) and ``fake`` (a provider that lives in a
test module and plugs in through the ``gtrain.providers`` entry point).

Every step goes through the public seams: ``gtrain.up/launch/wait/down`` and the cluster's
:class:`~gtrain.jobs.backend.JobBackend` (``dryrun``, ``submit``, ``describe``, ``log_iter``, ``cancel``).
The job is a real 2-node x 2-process torchrun launch (tests/integration/jobs/contract.py); nothing is mocked.
``ray`` runs on a real Ray cluster (tests/fixtures/ray.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.context import Context
from gtrain.jobs.backend import JobBackend, JobRequest, JobState, LogLine, NodeEnded
from gtrain.spec import parse_spec
from gtrain.state import Job as JobRecord
from tests.fixtures.sshd import cloud_login

JOBS = Path(__file__).parent / "jobs"
RELAY = Path(__file__).parent / "node_relay.py"
BACKENDS = ["local", "ssh", "aws", "gcp", "lambda", "azure", "fake", "slurm", "kubernetes", "ray"]


def _job(work: Path) -> dict[str, Any]:
    return {"workdir": str(work), "run": "contract.py", "nproc_per_node": 2, "python": sys.executable,
            "env": {"OMP_NUM_THREADS": "1"}}


def _relay_hosts(hosts: Any, d: Path) -> list[Any]:
    picked = [hosts[2], hosts[3]] if len(hosts) >= 4 else [hosts[0], hosts[1]]
    d.mkdir(parents=True, exist_ok=True)
    auth = Path(picked[0].identity_file).parent / "authorized_keys"
    (d / "hosts.json").write_text(json.dumps({"hosts": [[h.address, h.port] for h in picked],
                                              "authorized_keys": str(auth)}))
    return picked


def spec_for(provider: str, request: pytest.FixtureRequest, tmp: Path, work: Path) -> dict[str, Any]:
    name = f"jb-{provider}"
    base: dict[str, Any] = {"name": name, "provider": provider, "num_nodes": 2, "job": _job(work)}
    if provider in ("local", "fake"):
        return base
    if provider == "slurm":  # a real slurmctld + 2 slurmd (tests/fixtures/slurm.py); the nodes share one disk
        c = request.getfixturevalue("slurm_cluster")
        base["slurm"] = {"partition": c.partition, "shared_dir": str(c.shared), "conf": c.conf}
        return base
    if provider == "kubernetes":  # tests/fixtures/fake_kube.py: an API server whose kubelet runs real pods
        kube = request.getfixturevalue("fake_kube_server")
        os.environ["KUBECONFIG"] = str(kube.kubeconfig(tmp / "kubeconfig"))
        base["job"]["image"] = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
        base["kubernetes"] = {"shm_gb": 0}
        return base
    if provider == "ray":  # tests/fixtures/ray.py: a real Ray cluster (head + 2 workers offering fake_gpu)
        ray = request.getfixturevalue("ray_cluster")
        base["resources"] = {"accelerators": "A100:2"}
        base["ray"] = {"address": ray.address, "gpu_resource": "fake_gpu", "driver_python": sys.executable,
                       "root": str(tmp / "ray-nodes")}
        return base
    if provider == "ssh":
        hosts = request.getfixturevalue("ssh_hosts")
        picked = [hosts[0], hosts[1]]
        base["ssh"] = {"user": picked[0].user, "identity_file": picked[0].identity_file, "python": sys.executable,
                       "hosts": [f"{h.address}:{h.port}" for h in picked],
                       "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in picked}}
        return base
    hosts = request.getfixturevalue("ssh_hosts")
    relay = tmp / f"relay-{provider}"
    picked = _relay_hosts(hosts, relay)
    if provider == "azure":  # the fake ARM (tests/fixtures/fake_arm.py), VMs relayed to the sshd hosts
        from tests.fixtures.fake_arm import arm_env

        fake_arm = request.getfixturevalue("fake_arm_server")
        fake_arm.reset()
        os.environ.update(arm_env(fake_arm))  # until the module's cluster is down (removed there)
        base["resources"] = {"accelerators": "T4:1", "region": "eastus", "disk_gb": 64}
        base["azure"] = {"ssh_user": cloud_login(picked[0].user),
                         "ssh_proxy_command": f"{sys.executable} {RELAY} azure {relay} %h",
                         "ssh_timeout_s": 60, "poll_s": 0.2}
        return base
    section = {"ssh_user": picked[0].user,
               "ssh_proxy_command": f"{sys.executable} {RELAY} {provider} {relay} %h",
               "ssh_timeout_s": 60, "poll_s": 0.2}
    if provider == "aws":
        request.getfixturevalue("moto_server")
        base["resources"] = {"accelerators": "T4:1", "region": "us-east-1", "disk_gb": 50}
        base["aws"] = {**section, "host_key_wait_s": 0}
    elif provider == "lambda":  # tests/fixtures/fake_lambda.py; %h is the instance's IP, which the relay looks up
        request.getfixturevalue("fake_lambda_server")
        base["resources"] = {"accelerators": "A10:1", "region": "us-east-1"}
        base["lambda"] = section
    else:
        fake = request.getfixturevalue("fake_gce_server")
        from tests.fixtures.fake_gce import GOOGLE_TOKEN, service_account_file

        # Google credentials the fake takes (a service account key whose token_uri is the fake's), and the token
        # the node relay asks it with (as the fake_gce fixture sets); the cluster fixture removes them at its end
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(service_account_file(f"{fake.endpoint}/token", tmp))
        os.environ["GTRAIN_TEST_GOOGLE_TOKEN"] = GOOGLE_TOKEN
        from tests.integration.node_relay import assign

        def guest_agent(iname: str) -> list[dict[str, str]]:
            addr, port = assign("gcp", relay, iname)
            host = next(h for h in picked if (h.address, h.port) == (addr, port))
            kt, b64 = host.host_key_line.split()[:2]
            return [{"namespace": "hostkeys", "key": kt, "value": b64}]

        fake.guest_attributes = guest_agent
        base["resources"] = {"accelerators": "T4:1", "region": "us-central1", "disk_gb": 50}
        base["gcp"] = section
    return base


@pytest.fixture(scope="module")
def fake_kube_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.fixtures.fake_kube import FakeKube, FakeNode

    kube = FakeKube(tmp_path_factory.mktemp("kube"), nodes=[FakeNode(f"n{i}", {}, {}) for i in range(2)]).start()
    yield kube
    kube.stop()
    os.environ.pop("KUBECONFIG", None)


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from gtrain.remote import ssh as sshmod
    from tests.fake_provider import installed

    provider = request.param
    tmp = tmp_path_factory.mktemp(f"jb-{provider}")
    home, work = tmp / "home", tmp / "work"
    work.mkdir()
    shutil.copy(JOBS / "contract.py", work / "contract.py")
    old = os.environ.get("GTRAIN_HOME")
    os.environ["GTRAIN_HOME"] = str(home)
    sshmod.close_all()
    with installed(tmp / "fake-cloud"):
        spec = spec_for(provider, request, tmp, work)
        res = gtrain.up(parse_spec(spec))
        assert res.created
        try:
            yield {"spec": spec, "name": spec["name"], "home": home, "work": work}
        finally:
            os.environ["GTRAIN_HOME"] = str(home)
            gtrain.down(spec["name"])
            sshmod.close_all()
            if provider == "gcp":
                os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
                os.environ.pop("GTRAIN_TEST_GOOGLE_TOKEN", None)
            if provider == "azure":
                from tests.fixtures.fake_arm import arm_env

                for k in arm_env(request.getfixturevalue("fake_arm_server")):
                    os.environ.pop(k, None)
            if old is None:
                os.environ.pop("GTRAIN_HOME", None)
            else:
                os.environ["GTRAIN_HOME"] = old


@pytest.fixture
def gtrain_home(cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Path:  # the module's home
    monkeypatch.setenv("GTRAIN_HOME", str(cluster["home"]))
    return Path(cluster["home"])


def with_backend(name: str, fn: Callable[[Context, JobBackend], Any]) -> Any:
    ctx = Context()
    try:
        return fn(ctx, ctx.backend(ctx.cluster(name)))
    finally:
        ctx.store.close()


def launch(cluster: dict[str, Any], run: str) -> str:
    spec = parse_spec({**cluster["spec"], "job": {**cluster["spec"]["job"], "run": run}})
    return gtrain.launch(spec).job_id


def job_record(job_id: str) -> JobRecord:
    ctx = Context()
    try:
        return ctx.store.get_job(job_id)
    finally:
        ctx.store.close()


def wait_state(name: str, job_id: str, want: Callable[[JobState], bool], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        desc = with_backend(name, lambda _c, b: b.describe(job_record(job_id)))
        if want(desc.state):
            return desc
        assert time.monotonic() < deadline, f"job {job_id} stayed {desc.state}"
        time.sleep(0.3)


def processes_of(name: str, job_id: str) -> list[str]:
    """Every process on every node whose environment names the job (anything left running)."""
    def on_nodes(ctx: Context, b: JobBackend) -> list[str]:
        out: list[str] = []
        if b.name in ("kubernetes", "ray"):  # no runners (pods, Ray nodes: processes of this machine): its /proc
            import subprocess

            got = subprocess.run(f"grep -las 'GTRAIN_JOB_ID={job_id}' /proc/[0-9]*/environ || true", shell=True,
                                 capture_output=True, text=True)
            return [f"local:{p}" for p in got.stdout.split() if p]
        for r in ctx.runners(ctx.cluster(name)):
            res = r.run(f"grep -las 'GTRAIN_JOB_ID={job_id}' /proc/[0-9]*/environ || true", check=False)
            out += [f"{r.label}:{p}" for p in res.stdout.split() if p]
        return out

    return list(with_backend(name, on_nodes))


# ---------------------------------------------------------------------------------------------- the contract


def test_dryrun_is_the_plan_submit_runs(cluster: dict[str, Any], gtrain_home: Path) -> None:
    spec = parse_spec(cluster["spec"])

    def plan(ctx: Context, b: JobBackend) -> Any:
        return b.dryrun(JobRequest(ctx.cluster(cluster["name"]), spec, "<job-id>", str(cluster["work"])))

    p = plan_ = with_backend(cluster["name"], plan)
    assert sorted(p.files) == [0, 1]  # one set of scripts per node
    text = plan_.render()
    assert "# ---- node 0:" in text and "# ---- node 1:" in text and "contract.py" in text
    # the dry run touched nothing that runs: no job recorded
    assert not gtrain.status(cluster["name"])[0]["jobs"]
    dry = gtrain.launch(spec, dry_run=True)
    assert dry.status == "dry-run" and dry.scripts == p.files


def test_submit_describe_and_logs_of_every_rank(cluster: dict[str, Any], gtrain_home: Path) -> None:
    job_id = launch(cluster, "contract.py --sleep 1")
    seen = wait_state(cluster["name"], job_id, lambda s: s is not JobState.UNKNOWN)
    assert seen.state in (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED)
    final = gtrain.wait(cluster["name"], job_id=job_id)
    assert (final.status, final.exit_code) == ("succeeded", 0), final.info
    desc = with_backend(cluster["name"], lambda _c, b: b.describe(job_record(job_id)))
    assert desc.state is JobState.SUCCEEDED and desc.exit_code == 0
    assert [n.node for n in desc.nodes] == [0, 1] and all(n.state is JobState.SUCCEEDED for n in desc.nodes)
    ranks = sorted(r.rank for n in desc.nodes for r in n.ranks)
    assert ranks == [0, 1, 2, 3] and all(r.exit_code == 0 for n in desc.nodes for r in n.ranks)

    def logs(ctx: Context, b: JobBackend) -> dict[int, list[Any]]:
        rec = job_record(job_id)
        return {i: list(b.log_iter(rec, i, follow=True)) for i in (0, 1)}

    items = with_backend(cluster["name"], logs)
    lines = [x for v in items.values() for x in v if isinstance(x, LogLine)]
    hello = sorted(x.rank for x in lines if x.text.startswith("contract hello rank"))
    assert hello == [0, 1, 2, 3], [x.text for x in lines][-20:]
    assert sorted(x.rank for x in lines if x.text.startswith("contract stderr rank")) == [0, 1, 2, 3]
    for i, v in items.items():  # a followed stream ends with the node's end, in the node's state
        assert isinstance(v[-1], NodeEnded) and v[-1].node == i and v[-1].state is JobState.SUCCEEDED
    one = with_backend(cluster["name"], lambda _c, b: list(b.log_iter(job_record(job_id), 1, 3)))
    assert {x.rank for x in one if isinstance(x, LogLine)} <= {3}
    tail = with_backend(cluster["name"], lambda _c, b: list(b.log_iter(job_record(job_id), 0, tail=1)))
    assert 1 <= len([x for x in tail if isinstance(x, LogLine)]) <= 3  # the last line of each of its files


def test_a_failing_rank_fails_the_job_with_its_exit_code(cluster: dict[str, Any], gtrain_home: Path) -> None:
    job_id = launch(cluster, "contract.py --exit-code 7")
    final = gtrain.wait(cluster["name"], job_id=job_id)
    assert (final.status, final.exit_code) == ("failed", 7), final.info
    desc = with_backend(cluster["name"], lambda _c, b: b.describe(job_record(job_id)))
    assert desc.state is JobState.FAILED and desc.exit_code == 7
    assert [r.exit_code for n in desc.nodes for r in n.ranks if r.rank == 3] == [7]
    assert processes_of(cluster["name"], job_id) == []


def test_cancel_leaves_nothing_running(cluster: dict[str, Any], gtrain_home: Path) -> None:
    job_id = launch(cluster, "contract.py --sleep 120")
    wait_state(cluster["name"], job_id, lambda s: s is JobState.RUNNING)
    deadline = time.monotonic() + 60
    while len(processes_of(cluster["name"], job_id)) < 4:  # the ranks have started (their env names the job)
        assert time.monotonic() < deadline, processes_of(cluster["name"], job_id)
        time.sleep(0.3)
    t0 = time.monotonic()
    with_backend(cluster["name"], lambda _c, b: b.cancel(job_record(job_id), grace_s=5))
    assert time.monotonic() - t0 < 30
    desc = with_backend(cluster["name"], lambda _c, b: b.describe(job_record(job_id)))
    assert desc.state is JobState.CANCELLED, desc
    assert processes_of(cluster["name"], job_id) == []
    # idempotent: a second cancel of a cancelled job changes nothing and does not fail
    with_backend(cluster["name"], lambda _c, b: b.cancel(job_record(job_id), grace_s=1))
    assert with_backend(cluster["name"], lambda _c, b: b.describe(job_record(job_id))).state is JobState.CANCELLED
