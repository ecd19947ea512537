"""Benchmark (not a test) a sharded step's way through the checkpoint store: one node's upload of its part and
the whole-step restore, against the plain tools a user would run instead, on ONE SeaweedFS server.

The step is real ``torch.distributed.checkpoint`` output (``dcp.save`` in a child process, ``thread_count`` =
``--files``: ``--files`` data files ``__0_I.distcp`` of ``--mib`` MiB in all, random values, and ``.metadata``).
Phases, each tool a new process as on a node, ``os.sync()`` before each:

* upload: gtrain's node-side uploader (``python -m gtrain.checkpoints.node flush``: the final pass of the node's
  agent, which reads ``.metadata`` and writes the manifest) vs ``s5cmd cp`` and ``aws s3 cp --recursive`` of
  the same folder, each into a prefix of its own (deleted after the round: the server's disk stays small);
* restore: gtrain's node restore (``python -m gtrain.checkpoints.node restore``: the newest complete step, every
  file checked by sha256, into an empty folder) vs ``s5cmd cp`` / ``aws s3 cp --recursive`` of the same
  objects into an empty folder.

* the restore of ONE node of a 2-node step (``--two-mib``, default ``--mib``: ``dcp.save`` by 2 processes over
  gloo, each tensor a ``DTensor`` sharded over both ranks, ``--files`` data files in all and ``.metadata``; node 0
  uploads ``.metadata`` and rank 0's files, node 1 rank 1's, both with gtrain's uploader): node 1's restore into an
  empty folder, the whole step (the default) vs ``GTRAIN_CHECKPOINT_RESTORE=subset`` (DCP's metadata and the
  files it assigns to rank 1: half the step), the two in alternating order, ``--rounds`` each.
  ``--two-node-only`` measures this alone.

``--rounds`` rounds (default 3), the tools in a rotating order; a tool's figure is its median round (all rounds
in the JSON), in MB/s (10^6 bytes) of the step's bytes over wall seconds, with the tool's own CPU seconds and the
server's (``weed``: where its CPU is near the wall time, the server is the limit). Writes
bench/results/sharded.json.

    .venv/bin/python bench/bench_sharded.py [--mib 2048] [--files 8] [--rounds 3] [--aws PATH] [--two-mib N]
        [--two-node-only] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.seaweedfs import start_weed  # noqa: E402
from tests.services import stop  # noqa: E402

MiB = 1024 * 1024
STEP = "step-100"
_DCP = """import sys, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemWriter
mib, files = int(sys.argv[2]), int(sys.argv[3])
g = torch.Generator().manual_seed(0)
sd = {f"layer{i}": torch.rand(mib * 2**20 // files // 4, generator=g) for i in range(files)}
dcp.save(sd, storage_writer=FileSystemWriter(sys.argv[1], thread_count=files), no_dist=True)
"""

_DCP2 = """import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
mib, files = int(sys.argv[2]), int(sys.argv[3])
g = torch.Generator().manual_seed(rank)
n = mib * 2**20 // files // 4 // world
sd = {f"layer{i}": DTensor.from_local(torch.rand(n, generator=g), mesh, [Shard(0)], run_check=False)
      for i in range(files)}
dcp.save(sd, storage_writer=FileSystemWriter(sys.argv[1], thread_count=max(1, files // world)))
dist.destroy_process_group()
"""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str], env: dict[str, str], server: int, out: list[str] | None = None) -> dict[str, float]:
    os.sync()
    r0, s0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_s(server), time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_s(server)
    if p.returncode != 0 or '"error"' in p.stdout:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    if out is not None:
        out.append(p.stdout)
    return {"wall_s": wall, "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "server_cpu_s": s1 - s0}


def two_node(work: Path, env: dict[str, str], server: int, mib: int, files: int, rounds: int) -> dict[str, Any]:
    """Node 1's restore of a step 2 ranks wrote (one per node): the whole step vs the subset its rank reads."""
    step = work / "two" / STEP
    (work / "dcp2.py").write_text(_DCP2)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    str(work / "dcp2.py"), str(step), str(mib), str(files)], env={**env, "OMP_NUM_THREADS": "1"},
                   check=True, capture_output=True)
    total = sum(p.stat().st_size for p in step.iterdir())
    node = [sys.executable, "-m", "gtrain.checkpoints.node"]
    for k in (0, 1):  # each node's part: node 0 .metadata and rank 0's files, node 1 rank 1's
        part = work / f"two-node-{k}" / STEP
        part.mkdir(parents=True)
        for p in step.iterdir():
            if (p.name == ".metadata" and k == 0) or p.name.startswith(f"__{k}_"):
                shutil.copy2(p, part / p.name)
        job = work / f"two-job-{k}"
        job.mkdir()
        subprocess.run([*node, "flush", "s3://bench/two", "bench", str(k), str(part.parent), str(job), "1", "0"],
                       env=env, check=True, capture_output=True)
    shutil.rmtree(work / "two")
    subset = {"GTRAIN_CHECKPOINT_RESTORE": "subset", "GTRAIN_NUM_NODES": "2", "GTRAIN_NPROC_PER_NODE": "1"}
    modes: dict[str, dict[str, str]] = {"whole": {}, "subset": subset}
    got: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in (list(modes) if r % 2 == 0 else list(reversed(modes))):
            dest, job = work / f"two-down-{mode}-{r}", work / f"two-rjob-{mode}-{r}"
            dest.mkdir()
            job.mkdir()
            said: list[str] = []
            run = timed([*node, "restore", "s3://bench/two", "bench", "1", str(dest), str(job)],
                        {**env, **modes[mode]}, server, said)
            doc = json.loads(said[-1])
            assert doc["mode"] == mode, doc
            run.update(bytes=int(doc["bytes"]), files=int(doc["files"]), why=doc["why"])
            got[mode].append(run)
            print(f"2-node step, node 1, round {r + 1} {mode}: {run['wall_s']:.2f}s, {doc['files']} files, "
                  f"{doc['bytes'] / 1e6:.0f} MB ({doc['why']})", flush=True)
            shutil.rmtree(dest)
    summary: dict[str, dict[str, Any]] = {}
    for mode, runs in got.items():
        med = statistics.median(x["wall_s"] for x in runs)
        summary[mode] = {"median_s": round(med, 3), "bytes": runs[0]["bytes"], "files": runs[0]["files"],
                         "mb_s": round(runs[0]["bytes"] / 1e6 / med, 1),
                         "cpu_s": round(statistics.median(x["cpu_s"] for x in runs), 2), "why": runs[0]["why"]}
    return {"step_bytes": total, "rounds": got, "summary": summary}


def _print_two(two: dict[str, Any]) -> None:
    print(f"\n2-node step ({two['step_bytes'] / 1e6:.0f} MB), node 1's restore: {'mode':7} {'median s':>9} "
          f"{'MB':>7} {'MB/s':>8} {'CPU s':>6}")
    for mode, f in two["summary"].items():
        print(f"{'':46}{mode:7} {f['median_s']:9.2f} {f['bytes'] / 1e6:7.0f} {f['mb_s']:8.1f} {f['cpu_s']:6.2f}")


def commands(tool: str, endpoint: str, aws: str | None) -> tuple[Any, Any] | None:
    """(upload(src_dir, url), download(url, dest_dir)) argv makers of ``tool``; None: not installed."""
    node = [sys.executable, "-m", "gtrain.checkpoints.node"]
    if tool == "gtrain":  # url: s3://bucket/prefix (the store); the key "bench" is the run's folder
        return (lambda ckpt, url, job: [*node, "flush", url, "bench", "0", ckpt, job, "1", "0"],
                lambda url, dest, job: [*node, "restore", url, "bench", "0", dest, job])
    if tool == "s5cmd":
        venv = Path(sys.executable).parent / "s5cmd"
        exe = str(venv) if venv.exists() else shutil.which("s5cmd")
        if not exe:
            return None
        return (lambda ckpt, url, _j: [exe, "--endpoint-url", endpoint, "cp", f"{ckpt}/{STEP}/", f"{url}/{STEP}/"],
                lambda url, dest, _j: [exe, "--endpoint-url", endpoint, "cp", f"{url}/*", f"{dest}/"])
    if tool == "awscli" and aws:
        return (lambda ckpt, url, _j: [aws, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url",
                                       endpoint, f"{ckpt}/{STEP}", f"{url}/{STEP}"],
                lambda url, dest, _j: [aws, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url",
                                       endpoint, url, dest])
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=2048, help="the step's size (MiB)")
    ap.add_argument("--files", type=int, default=8, help="its data files (DCP's thread_count)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--aws", default=shutil.which("aws"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sharded.json")
    ap.add_argument("--two-mib", type=int, default=0, help="the 2-node step's size (MiB; default: --mib)")
    ap.add_argument("--two-node-only", action="store_true", help="only the 2-node step's restore, whole vs subset")
    args = ap.parse_args()
    import boto3

    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-sharded-"))
    weed = start_weed(work / "weed")
    env = {**os.environ, **weed.env()}
    try:
        if args.two_node_only:
            boto3.client("s3", endpoint_url=weed.endpoint, aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket="bench")
            two = two_node(work, env, weed.proc.pid, args.two_mib or args.mib, args.files, args.rounds)
            _print_two(two)
            only = {"two_node": two, "machine": {"cpus": os.cpu_count(), "load_after": os.getloadavg()}}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(only, indent=2) + "\n")
            print(f"results: {args.out}")
            return 0
        ckpt = work / "ckpt"
        ckpt.mkdir()
        subprocess.run([sys.executable, "-c", _DCP, str(ckpt / STEP), str(args.mib), str(args.files)], env=env,
                       check=True)
        nbytes = sum(p.stat().st_size for p in (ckpt / STEP).iterdir())
        s3 = boto3.client("s3", endpoint_url=weed.endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        tools = [t for t in ("gtrain", "s5cmd", "awscli") if commands(t, weed.endpoint, args.aws)]
        print(f"step: {len(list((ckpt / STEP).iterdir()))} files, {nbytes / 1e6:.0f} MB; tools: {tools}; "
              f"load {os.getloadavg()}", flush=True)
        # the restore's source: one upload by gtrain's uploader, in the store's layout (manifest and all)
        (work / "job-src").mkdir()
        subprocess.run(commands("gtrain", weed.endpoint, None)[0](str(ckpt), "s3://bench/src",  # type: ignore[index]
                                                                   str(work / "job-src")), env=env, check=True,
                       capture_output=True)
        src = "s3://bench/src/bench/node-0/" + STEP
        rounds: dict[str, dict[str, list[dict[str, float]]]] = {t: {"upload": [], "restore": []} for t in tools}
        for r in range(args.rounds):
            for tool in tools[r % len(tools):] + tools[:r % len(tools)]:
                up, down = commands(tool, weed.endpoint, args.aws)  # type: ignore[misc]
                job = work / f"job-{tool}-{r}"
                job.mkdir()
                prefix = f"up-{tool}-{r}"
                rounds[tool]["upload"].append(timed(up(str(ckpt), f"s3://bench/{prefix}", str(job)), env,
                                                    weed.proc.pid))
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=prefix):
                    if keys := [{"Key": o["Key"]} for o in page.get("Contents", [])]:
                        s3.delete_objects(Bucket="bench", Delete={"Objects": keys})
                dest = work / f"down-{tool}-{r}"
                dest.mkdir()
                if tool == "gtrain":
                    rounds[tool]["restore"].append(timed(down("s3://bench/src", str(dest), str(job)), env,
                                                         weed.proc.pid))
                    got = dest / STEP
                else:
                    rounds[tool]["restore"].append(timed(down(src, str(dest), str(job)), env, weed.proc.pid))
                    got = dest
                size = sum(p.stat().st_size for p in got.iterdir() if p.is_file())
                assert size == nbytes, (tool, sorted(p.name for p in got.iterdir()))
                shutil.rmtree(dest)
                print(f"round {r + 1} {tool}: upload {rounds[tool]['upload'][-1]['wall_s']:.2f}s, restore "
                      f"{rounds[tool]['restore'][-1]['wall_s']:.2f}s", flush=True)
        summary: dict[str, dict[str, dict[str, float]]] = {}
        for tool in tools:
            summary[tool] = {}
            for phase in ("upload", "restore"):
                walls = [x["wall_s"] for x in rounds[tool][phase]]
                med = statistics.median(walls)
                summary[tool][phase] = {"median_s": round(med, 3), "mb_s": round(nbytes / 1e6 / med, 1),
                                        "cpu_s": round(statistics.median(x["cpu_s"] for x in rounds[tool][phase]), 2),
                                        "server_cpu_s": round(statistics.median(x["server_cpu_s"]
                                                                                for x in rounds[tool][phase]), 2)}
        print(f"\n{'tool':8} {'phase':8} {'median s':>9} {'MB/s':>8} {'tool CPU s':>11} {'weed CPU s':>11}")
        for tool, phases in summary.items():
            for phase, f in phases.items():
                print(f"{tool:8} {phase:8} {f['median_s']:9.2f} {f['mb_s']:8.1f} {f['cpu_s']:11.2f} "
                      f"{f['server_cpu_s']:11.2f}")
        shutil.rmtree(ckpt)  # the disk the 2-node step needs
        two = two_node(work, env, weed.proc.pid, args.two_mib or args.mib, args.files, args.rounds)
        _print_two(two)
        doc = {"bytes": nbytes, "files": args.files, "rounds": rounds, "summary": summary, "two_node": two,
               "machine": {"cpus": os.cpu_count(), "load_after": os.getloadavg()}}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"results: {args.out}")
    finally:
        stop(weed.proc)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
