"""Benchmark ``gtrain sync`` (not a test) against the tools a user would pick instead, on real servers.

* S3, on ONE SeaweedFS server (``weed mini``, Go, SigV4 checked): the ``gtrain sync`` command (on obstore, the
  compiled engine, and ``gtrain-wire``: ``GTRAIN_SYNC_ENGINE=wire``, the stdlib client) vs ``s5cmd sync``,
  ``rclone sync`` (16 transfers, 16 checkers) and ``aws s3 sync`` (awscli, if found), each a new process, on
  the same data in one run: 1,000 files of 1-8 KiB + one 200 MiB file. Phases: upload, no-change re-sync
  (best of 3), download; then the 200 MiB file alone (upload, download); then the restore of a sharded
  checkpoint (16 files of 8 MiB): gtrain's is the node's own restore (``python -m gtrain.checkpoints.node
  restore``, from the checkpoint store's layout), the rivals sync the same files down. Each tool has a bucket of
  its own. ``--rounds`` rounds (default 3), the tools taking turns in a rotating order, each round on a fresh
  prefix and into a fresh folder; a tool's figure is its best round (all rounds are in the JSON). A new weed
  is warmed up first with an upload nobody is timed on (its first writes cost it seconds of CPU), and gtrain is
  byte-compiled first, as pip installs it. ``weed``'s CPU seconds per phase are recorded: where it is near the
  wall time, the server is the limit; so is each tool's own CPU (user + system of the process and its
  children), also given per GiB downloaded.
* GCS on fake-gcs-server and Azure Blob on Azurite: gtrain alone (no fast rival runs there), against the
  emulator's own CPU cost per phase; on Azure both engines (obstore, the default, and ``wire``).

Prints a table with each tool's time and the ratio best-of(s5cmd, rclone) / gtrain (> 1: gtrain is faster)
and writes bench/results/sync.json. The load average before and after is recorded: run it when the
machine is quiet.

    .venv/bin/python bench/bench_sync.py [--small 1000] [--large-mib 200] [--rounds 3] [--shards 16]
                                         [--shard-mib 8] [--aws PATH] [--skip gcs,az]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.azurite import start_azurite  # noqa: E402
from tests.fixtures.gcs_emulator import fake_gcs_server_binary  # noqa: E402
from tests.fixtures.seaweedfs import start_weed  # noqa: E402
from tests.services import free_port, stop, wait_http  # noqa: E402

MiB = 1024 * 1024
TOOLS = ("gtrain", "gtrain-wire", "s5cmd", "rclone", "awscli")


def cpu_s(pid: int) -> float:
    """user+system CPU seconds of a process and its reaped children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def make_data(root: Path, small: int, large_mib: int) -> None:
    for i in range(small):
        p = root / "all" / "small" / f"{i // 100:02d}" / f"f{i:04d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(1024 + (i * 37) % 7168))  # 1-8 KiB
    big = root / "big" / "ckpt.pt"
    big.parent.mkdir(parents=True)
    with open(big, "wb") as f:
        for _ in range(large_mib):
            f.write(os.urandom(MiB))
    (root / "all" / "ckpt.pt").hardlink_to(big)


def run(cmd: list[str], env: dict[str, str]) -> float:
    """Run ``cmd``; returns its CPU seconds (user + system, itself and what it waited for)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def s3_commands(tool: str, endpoint: str, aws: str | None) -> Callable[[str, str], list[str]] | None:
    """How ``tool`` syncs a to b (one side local, the other s3://bucket/prefix)."""
    venv_bin = Path(sys.executable).parent
    if tool in ("gtrain", "gtrain-wire"):  # gtrain-wire: GTRAIN_SYNC_ENGINE=wire, the stdlib client
        return lambda a, b: [sys.executable, "-m", "gtrain", "sync", a, b, "--json"]
    if tool == "s5cmd":
        exe = venv_bin / "s5cmd" if (venv_bin / "s5cmd").exists() else shutil.which("s5cmd")
        if not exe:
            return None
        return lambda a, b: [str(exe), "--endpoint-url", endpoint, "sync",
                             (a.rstrip("/") + "/*") if a.startswith("s3://") else a.rstrip("/") + "/",
                             b.rstrip("/") + "/"]
    if tool == "rclone":
        exe = venv_bin / "rclone" if (venv_bin / "rclone").exists() else shutil.which("rclone")
        if not exe:
            return None

        def rc(p: str) -> str:
            return "weed:" + p.removeprefix("s3://") if p.startswith("s3://") else p

        return lambda a, b: [str(exe), "sync", rc(a), rc(b), "--transfers", "16", "--checkers", "16", "-q"]
    if tool == "awscli" and aws:
        return lambda a, b: [aws, "s3", "sync", a, b, "--only-show-errors"]
    return None


PHASES = ("upload", "noop_resync", "download", "big_upload", "big_download", "restore")


def make_checkpoint(root: Path, shards: int, shard_mib: int) -> None:
    """A sharded checkpoint: ``shards`` files of ``shard_mib`` MiB in one step folder."""
    step = root / "ckpt" / "step-100"
    step.mkdir(parents=True)
    for k in range(shards):
        with open(step / f"shard-{k:02d}.pt", "wb") as f:
            for _ in range(shard_mib):
                f.write(os.urandom(MiB))


def restore_command(store_url: str, dest: Path) -> list[str]:
    """What a node runs before the script starts: the checkpoint shipper's ``restore`` of the newest step."""
    return [sys.executable, "-m", "gtrain.checkpoints.node", "restore", store_url, "bench", "0", str(dest),
            str(dest.parent)]  # the job folder (it gets ckpt-restored.json): the download phases made it


def bench_s3(data: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every tool, every phase, ``args.rounds`` rounds; in each round the tools go in turn (the order rotating),
    each with a fresh prefix and a fresh destination. A tool's figure per phase is its best round."""
    from gtrain.checkpoints.store import Store

    weed = start_weed(work / "weed")
    try:
        env = {**os.environ, **weed.env(), "GTRAIN_HOME": str(work / "gtrain-home")}
        env.pop("AWS_SESSION_TOKEN", None)
        renv = {**env, "RCLONE_CONFIG_WEED_TYPE": "s3", "RCLONE_CONFIG_WEED_PROVIDER": "Other",
                "RCLONE_CONFIG_WEED_ENDPOINT": weed.endpoint, "RCLONE_CONFIG_WEED_ACCESS_KEY_ID": "testing",
                "RCLONE_CONFIG_WEED_SECRET_ACCESS_KEY": "testing", "RCLONE_CONFIG_WEED_REGION": "us-east-1"}
        renv.pop("AWS_CA_BUNDLE", None)  # rclone fails on this machine's bundle (see the issue)
        import boto3

        s3 = boto3.client("s3", endpoint_url=weed.endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        # the checkpoint every tool restores: written once by gtrain's store (what the shipper writes), and the
        # same files as plain objects for the rivals
        s3.create_bucket(Bucket="bench-ckpt")
        for k, v in weed.env().items():
            os.environ[k] = v
        st = Store("s3://bench-ckpt/runs", "bench")
        st.upload(0, data / "ckpt", "step-100", [f"step-100/{p.name}" for p in (data / "ckpt" / "step-100").iterdir()])
        st.close()
        # a new weed spends seconds of CPU on its first writes (volume growth, caches): a warm-up upload that no
        # tool is timed on (the first tool paid ~2.5x weed CPU for the same upload before it)
        s3.create_bucket(Bucket="bench-warmup")
        warm = s3_commands("s5cmd", weed.endpoint, None) or s3_commands("gtrain", weed.endpoint, None)
        assert warm is not None
        run(warm(str(data / "all"), "s3://bench-warmup/all"), env)
        run(warm(str(data / "ckpt" / "step-100"), "s3://bench-ckpt/plain"), env)
        tools = {t: c for t in TOOLS if (c := s3_commands(t, weed.endpoint, args.aws)) is not None
                 and t in (args.tools or TOOLS)}
        for t in TOOLS:
            if t not in tools:
                print(f"  {t}: not found, skipped", flush=True)
        out: dict[str, Any] = {"server": "seaweedfs (weed mini)", "rounds": args.rounds,
                               "tools": {t: None for t in TOOLS}}
        runs: dict[str, dict[str, list[tuple[float, float, float]]]] = {t: {p: [] for p in PHASES} for t in tools}
        for t in tools:
            s3.create_bucket(Bucket=f"bench-{t}".replace("-wire", "wire"))
        for rnd in range(args.rounds):
            order = list(tools)[rnd % len(tools):] + list(tools)[:rnd % len(tools)]
            for tool in order:
                cmd, bucket = tools[tool], f"bench-{tool}".replace("-wire", "wire")
                tenv = (renv if tool == "rclone" else {**env, "GTRAIN_SYNC_ENGINE": "wire"} if tool == "gtrain-wire"
                        else env)

                def phase(name: str, argv: list[str], times: int = 1) -> None:
                    for _ in range(times):
                        os.sync()  # what the phase before wrote is on disk: no tool pays for another's writeback
                        c0, t0 = cpu_s(weed.proc.pid), time.monotonic()
                        own = run(argv, tenv)  # noqa: B023 - called at once
                        runs[tool][name].append((time.monotonic() - t0, own, cpu_s(weed.proc.pid) - c0))  # noqa: B023

                pre, down = f"s3://{bucket}/r{rnd}", work / f"down-{tool}-{rnd}"
                phase("upload", cmd(str(data / "all"), f"{pre}/all"))
                phase("noop_resync", cmd(str(data / "all"), f"{pre}/all"), times=3)
                phase("download", cmd(f"{pre}/all", str(down / "all")))
                phase("big_upload", cmd(str(data / "big"), f"{pre}/big"))
                phase("big_download", cmd(f"{pre}/big", str(down / "big")))
                if tool.startswith("gtrain"):  # the node's restore (gtrain's own store layout)
                    phase("restore", restore_command("s3://bench-ckpt/runs", down / "ckpt"))
                else:
                    phase("restore", cmd("s3://bench-ckpt/plain", str(down / "ckpt")))
                shutil.rmtree(down)
            print(f"  round {rnd + 1}/{args.rounds} done", flush=True)
        down_bytes = {"download": sum(p.stat().st_size for p in (data / "all").rglob("*") if p.is_file()),
                      "big_download": (data / "big" / "ckpt.pt").stat().st_size,
                      "restore": sum(p.stat().st_size for p in (data / "ckpt").rglob("*") if p.is_file())}
        for tool, per in runs.items():
            res: dict[str, Any] = {"wall_s": {}, "cpu_s": {}, "weed_cpu_s": {}, "all_wall_s": {}}
            for name, rs in per.items():
                best = min(rs)
                res["wall_s"][name], res["cpu_s"][name], res["weed_cpu_s"][name] = (round(x, 3) for x in best)
                res["all_wall_s"][name] = [round(r[0], 3) for r in rs]
            res["cpu_s_per_gib"] = {p: round(res["cpu_s"][p] / (down_bytes[p] / 2**30), 2) for p in down_bytes}
            out["tools"][tool] = res
            print(f"  {tool}: {res['wall_s']}", flush=True)
        return out
    finally:
        stop(weed.proc)


def gtrain_phases(url: str, data: Path, work: Path, env: dict[str, str], server_pid: int) -> dict[str, Any]:
    res: dict[str, Any] = {"wall_s": {}, "server_cpu_s": {}}
    res["cpu_s"] = {}
    for name, a, b in (("upload", str(data / "all"), url), ("noop_resync", str(data / "all"), url),
                       ("download", url, str(work / "down"))):
        c0, t0 = cpu_s(server_pid), time.monotonic()
        res["cpu_s"][name] = round(run([sys.executable, "-m", "gtrain", "sync", a, b, "--json"], env), 3)
        res["wall_s"][name] = round(time.monotonic() - t0, 3)
        res["server_cpu_s"][name] = round(cpu_s(server_pid) - c0, 3)
    shutil.rmtree(work / "down")
    return res


def bench_gcs(data: Path, work: Path) -> dict[str, Any]:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    (work / "fgcs").mkdir()
    log = work / "fgcs" / "log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([fake_gcs_server_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                 "-backend", "memory", "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}",
                                 "-log-level", "warn"], stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"{endpoint}/storage/v1/b", proc, log)
        env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "bench",
               "GTRAIN_HOME": str(work / "gtrain-home-gcs")}
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = endpoint
        storage.Client(project="bench", credentials=AnonymousCredentials()).create_bucket("bench-gcs")
        return {"server": "fake-gcs-server", **gtrain_phases("gs://bench-gcs/all", data, work, env, proc.pid)}
    finally:
        stop(proc)


def bench_az(data: Path, work: Path) -> dict[str, Any]:
    (work / "azurite").mkdir()
    az = start_azurite(work / "azurite")
    try:
        env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": az.connection_string,
               "GTRAIN_HOME": str(work / "gtrain-home-az")}
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = az.connection_string
        from gtrain.sync.azwire import AzureWire

        w = AzureWire()
        w.request("PUT", "bench-az", query={"restype": "container"}, ok=(201,))
        w.close()
        res = {"server": "azurite", **gtrain_phases("az://bench-az/all", data, work, env, az.proc.pid)}
        # the stdlib client on the same server, for the engines side by side (obstore is the default)
        wire = {**env, "GTRAIN_SYNC_ENGINE": "wire", "GTRAIN_HOME": str(work / "gtrain-home-az-wire")}
        res["wire"] = gtrain_phases("az://bench-az/wire", data, work, wire, az.proc.pid)
        return res
    finally:
        stop(az.proc)


def table(s3: dict[str, Any]) -> list[str]:
    phases = PHASES
    lines = [f"{'S3 / SeaweedFS, s':<14}" + "".join(f"{p:>14}" for p in phases)]
    for tool, res in s3["tools"].items():
        if res:
            lines.append(f"{tool:<14}" + "".join(f"{res['wall_s'][p]:>14.3f}" for p in phases))
    for tool, res in s3["tools"].items():
        if res:
            lines.append(f"{tool + ' CPU':<14}" + "".join(f"{res['cpu_s'][p]:>14.3f}" for p in phases))
    for tool, res in s3["tools"].items():
        if res:
            lines.append(f"{tool[:8] + ' weed':<14}" + "".join(f"{res['weed_cpu_s'][p]:>14.3f}" for p in phases))
    down = ("download", "big_download", "restore")
    lines.append(f"{'CPU-s/GiB down':<14}" + "".join(f"{p:>14}" for p in down))
    for tool, res in s3["tools"].items():
        if res:
            lines.append(f"{tool:<14}" + "".join(f"{res['cpu_s_per_gib'][p]:>14.2f}" for p in down))
    lines.append(f"{'ratio (best)':<14}" + "".join(f"{s3['ratio_vs_best_anchor'].get(p, 0):>14.2f}" for p in phases))
    lines.append(f"{'ratio (median)':<14}" + "".join(f"{s3['ratio_median_vs_best_anchor'].get(p, 0):>14.2f}"
                                                      for p in phases))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large-mib", type=int, default=200)
    ap.add_argument("--aws", default=shutil.which("aws"), help="the aws CLI (default: on PATH)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every tool and phase; the best is kept")
    ap.add_argument("--shards", type=int, default=16, help="files of the sharded checkpoint restored")
    ap.add_argument("--shard-mib", type=int, default=8)
    ap.add_argument("--tools", type=lambda v: v.split(","), default=None, help=f"a subset of {','.join(TOOLS)}")
    ap.add_argument("--skip", default="", help="comma-separated: gcs, az")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sync.json")
    args = ap.parse_args()
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-sync-"))
    try:
        make_data(work / "data", args.small, args.large_mib)
        make_checkpoint(work / "data", args.shards, args.shard_mib)
        # gtrain as a user has it installed: byte-compiled (pip compiles at install). Where the environment sets
        # PYTHONDONTWRITEBYTECODE a source checkout would compile every module on every start (~30 ms here).
        import compileall

        compileall.compile_dir(str(ROOT / "gtrain"), quiet=1)
        print(f"data: {args.small} files of 1-8 KiB + one {args.large_mib} MiB file; load {load0}", flush=True)
        print("S3 on SeaweedFS:", flush=True)
        s3 = bench_s3(work / "data", work, args)
        import statistics

        ratios, med_ratios = {}, {}
        for p in s3["tools"]["gtrain"]["wall_s"]:  # best round vs best round; median round vs median round
            rivals = [s3["tools"][t] for t in ("s5cmd", "rclone") if s3["tools"].get(t)]
            if rivals:
                ratios[p] = round(min(r["wall_s"][p] for r in rivals) / s3["tools"]["gtrain"]["wall_s"][p], 2)
                med = [statistics.median(r["all_wall_s"][p]) for r in rivals]
                med_ratios[p] = round(min(med) / statistics.median(s3["tools"]["gtrain"]["all_wall_s"][p]), 2)
        s3["ratio_vs_best_anchor"], s3["ratio_median_vs_best_anchor"] = ratios, med_ratios
        doc: dict[str, Any] = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                           "load_before": load0}, "s3": s3}
        if "gcs" not in args.skip:
            print("GCS on fake-gcs-server:", flush=True)
            doc["gcs"] = bench_gcs(work / "data", work)
            print(f"  {doc['gcs']}", flush=True)
        if "az" not in args.skip:
            print("Azure on Azurite:", flush=True)
            doc["az"] = bench_az(work / "data", work)
            print(f"  {doc['az']}", flush=True)
        doc["machine"]["load_after"] = os.getloadavg()
        print("\n".join(table(s3)))
        print(f"load before {load0}, after {doc['machine']['load_after']}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
