"""Every launcher for real on the local provider (2 nodes), and Accelerate on the ssh provider's sshd hosts:
the rank/exit contract (a failing rank's code is the job's, one log per rank), a real Accelerate training
script (gloo on CPU), a cross-process JAX psum, the python launcher's env."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gtrain
from gtrain.jobs.backend import LogLine

ROOT = Path(__file__).resolve().parents[2]
PROBE = '''import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
        "GTRAIN_NODE_RANK", "TF_CONFIG", "JAX_PROCESS_ID", "JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print("probe " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
print(f"probe stderr rank {rank}", file=sys.stderr, flush=True)
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if code:  # the failing rank ends only after every other rank has ended 0: no peer is stopped mid-way
    import tempfile, time
    d = os.path.join(tempfile.gettempdir(), "gtrain-probe-" + os.environ["GTRAIN_JOB_ID"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f".{rank}"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(d, f".{rank}"), os.path.join(d, str(rank)))
    if rank == world - 1:
        def ended(r):
            if not os.path.exists(os.path.join(d, str(r))):
                return False
            pid = int(open(os.path.join(d, str(r))).read())
            try:
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
            except OSError:
                return True
        deadline = time.time() + 120
        while not all(ended(r) for r in range(world - 1)) and time.time() < deadline:
            time.sleep(0.05)
        sys.exit(code)
'''
HAVE = {m: importlib.util.find_spec(m) is not None for m in ("accelerate", "deepspeed", "jax")}


def _need(module: str) -> None:
    if not HAVE.get(module, True):
        pytest.skip(f"{module} is not installed (pip install {module})")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("launchers-home")


@pytest.fixture
def gtrain_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # one home (one cluster) for the module
    monkeypatch.setenv("GTRAIN_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lwork")
    (d / "probe.py").write_text(PROBE)
    for ex in ("accelerate", "jax"):
        shutil.copytree(ROOT / "examples" / ex, d / ex)
    return d


def spec(work: Path, launcher: str, run: str, nproc: int | None = 2, **job: object) -> Path:
    body = {"workdir": str(work), "run": run, "launcher": launcher, "env": {"OMP_NUM_THREADS": "1"}, **job}
    if nproc:
        body["nproc_per_node"] = nproc
    p = work / f"lt-{launcher}.yaml"
    p.write_text(json.dumps({"name": "lt", "provider": "local", "num_nodes": 2, "job": body}))
    return p


@pytest.fixture(scope="module")
def cluster(home: Path, work: Path) -> Iterator[str]:
    os.environ["GTRAIN_HOME"] = str(home)
    assert gtrain.up(spec(work, "python", "probe.py")).created
    yield "lt"
    os.environ["GTRAIN_HOME"] = str(home)
    gtrain.down("lt")


def run(path: Path) -> tuple[gtrain.Job, list[LogLine]]:  # type: ignore[name-defined]
    job = gtrain.launch(path, cluster="lt")
    lines: list[LogLine] = []
    final = gtrain.wait("lt", job_id=job.job_id, on_line=lines.append)
    return final, lines


def probes(lines: list[LogLine]) -> dict[int, dict[str, str]]:
    return {int(json.loads(ln.text[6:])["RANK"]): {**json.loads(ln.text[6:]), "node": ln.node, "log_rank": ln.rank}
            for ln in lines if ln.text.startswith("probe {")}


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate", "deepspeed", "jax", "tensorflow", "python"])
def test_rank_exit_contract(cluster: str, work: Path, gtrain_home: Path, launcher: str) -> None:
    """The last rank exits 3: the job fails with 3, every rank logged to its own file and wrote its exit.
    deepspeed runs with or without DeepSpeed installed: without it (or without --no_ssh) the node falls back to
    torchrun, and the contract must hold on that path too."""
    if launcher != "deepspeed":
        _need(launcher)
    nproc = 1 if launcher == "jax" else 2
    final, lines = run(spec(work, launcher, "probe.py 3", nproc=None if launcher == "jax" else 2,
                            **({"jax": {"initialize": False}} if launcher == "jax" else {})))
    world = 2 * nproc
    assert (final.status, final.exit_code) == ("failed", 3), [ln.text for ln in lines][-20:]
    got = probes(lines)
    assert sorted(got) == list(range(world)), [ln.text for ln in lines][-20:]
    assert all(p["log_rank"] == r and p["WORLD_SIZE"] == str(world) for r, p in got.items())
    assert {r for ln in lines if ln.text.startswith("probe stderr rank") for r in [ln.rank]} == set(range(world))
    for k in range(2):
        logs = gtrain_home / "clusters" / "lt" / f"node-{k}" / "jobs" / final.id / "logs"
        for r in (r for r, p in got.items() if p["node"] == k):
            assert (logs / f"rank-{r}.log").is_file()
            assert (logs / f"rank-{r}.exit").read_text().split()[0] == ("3" if r == world - 1 else "0")
    if launcher in ("python", "jax", "tensorflow"):  # gtrain's spawner: RANK = node_rank * nproc + local_rank
        for r, p in got.items():
            assert (p["NODE_RANK"], p["LOCAL_RANK"], p["GTRAIN_NODE_RANK"]) == (str(r // nproc), str(r % nproc),
                                                                                str(r // nproc))
            assert p["LOCAL_WORLD_SIZE"] == str(nproc) and p["MASTER_ADDR"] == "127.0.0.1"
    if launcher == "tensorflow":
        tf = json.loads(got[1]["TF_CONFIG"])
        port = int(got[0]["MASTER_PORT"])
        assert tf["task"] == {"type": "worker", "index": 1}
        assert tf["cluster"]["worker"] == [f"127.0.0.1:{port + r}" for r in range(world)]
    if launcher == "jax":
        assert [got[r]["JAX_PROCESS_ID"] for r in range(2)] == ["0", "1"] and got[0]["JAX_NUM_PROCESSES"] == "2"
    if launcher == "deepspeed":  # which path ran is said in the node's own output
        fell_back = any("has no --no_ssh: starting the ranks with torchrun" in ln.text for ln in lines)
        assert fell_back == (not HAVE["deepspeed"]), [ln.text for ln in lines if ln.rank is None][-10:]


def test_python_launcher_two_by_two_succeeds(cluster: str, work: Path, gtrain_home: Path) -> None:
    final, lines = run(spec(work, "python", "probe.py"))
    assert (final.status, final.exit_code) == ("succeeded", 0)
    got = probes(lines)
    assert sorted(got) == [0, 1, 2, 3] and [got[r]["node"] for r in range(4)] == [0, 0, 1, 1]


def test_accelerate_trains_two_by_two(cluster: str, work: Path, gtrain_home: Path) -> None:
    _need("accelerate")
    final, lines = run(spec(work / "accelerate", "accelerate", "train.py --steps 5",
                            accelerate={"config_file": "accelerate.yaml"}))
    out = [ln for ln in lines if ln.text.startswith("accelerate rank")]
    assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-20:]
    assert sorted(ln.rank for ln in out) == [0, 1, 2, 3]  # type: ignore[type-var]
    assert all("/4 world 4 type MULTI_CPU" in ln.text for ln in out)
    # static rendezvous with --machine_rank: global ranks 0, 1 on node 0
    assert sorted((ln.node, ln.rank) for ln in out) == [(0, 0), (0, 1), (1, 2), (1, 3)]  # type: ignore[type-var]


def test_accelerate_without_a_config_file_on_cpu_nodes_trains_one_model(cluster: str, work: Path,
                                                                        gtrain_home: Path) -> None:
    """No config file and no GPU: every rank is one MULTI_CPU job (with --multi_gpu alone, Accelerate reports
    DistributedType.NO on every rank: four separate models)."""
    _need("accelerate")
    (work / "accprobe.py").write_text(  # a user's script: Accelerator() as it comes, no cpu=True
        "from accelerate import Accelerator\nacc = Accelerator()\n"
        "print(f'accprobe {acc.process_index}/{acc.num_processes} {acc.distributed_type.value}', flush=True)\n")
    final, lines = run(spec(work, "accelerate", "accprobe.py"))
    out = [ln.text for ln in lines if ln.text.startswith("accprobe ")]
    assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-20:]
    assert sorted(out) == [f"accprobe {r}/4 MULTI_CPU" for r in range(4)], out


def test_jax_psum_across_two_nodes(cluster: str, work: Path, gtrain_home: Path) -> None:
    _need("jax")
    final, lines = run(spec(work / "jax", "jax", "train.py --steps 3", nproc=None))
    out = sorted(ln.text for ln in lines if ln.text.startswith("jax process") and "psum" in ln.text)
    assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-20:]
    assert [t.split(" devices")[0] for t in out] == ["jax process 0 of 2", "jax process 1 of 2"]
    assert all(t.endswith("psum 3.0") for t in out)  # (0 + 1) + (1 + 1) from both processes


def test_accelerate_on_ssh_hosts(ssh_hosts, tmp_path: Path, gtrain_home: Path) -> None:  # type: ignore[no-untyped-def]
    _need("accelerate")
    from gtrain.remote import ssh as sshmod

    sshmod.close_all()
    hosts = [ssh_hosts[0], ssh_hosts[1]]
    w = tmp_path / "w"
    shutil.copytree(ROOT / "examples" / "accelerate", w)
    section = {"user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
               "hosts": [f"{h.address}:{h.port}" for h in hosts],
               "host_keys": {f"{hosts[0].address}:{hosts[0].port}": hosts[0].host_key_line}}
    job = {"workdir": str(w), "run": "train.py --steps 5", "launcher": "accelerate", "nproc_per_node": 2,
           "env": {"OMP_NUM_THREADS": "1"}}
    p = tmp_path / "acc.yaml"
    p.write_text(json.dumps({"name": "lacc", "provider": "ssh", "num_nodes": 2, "ssh": section, "job": job}))
    gtrain.up(p)
    try:
        launched = gtrain.launch(p)
        lines: list[LogLine] = []
        final = gtrain.wait("lacc", job_id=launched.job_id, on_line=lines.append)
        assert (final.status, final.exit_code) == ("succeeded", 0), [ln.text for ln in lines][-20:]
        out = [ln for ln in lines if ln.text.startswith("accelerate rank")]
        assert sorted(ln.rank for ln in out) == [0, 1, 2, 3]  # type: ignore[type-var]
        assert sorted(ln.node for ln in out) == [0, 0, 1, 1]
    finally:
        gtrain.down("lacc")
