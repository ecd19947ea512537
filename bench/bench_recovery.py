"""Benchmark durable runs (not a test), on a local moto server:

1. recovery: a 2-node local job (tests/integration/jobs/durable_train.py) checkpointing to moto's S3; every
   process of node 1 is SIGKILLed after its first checkpoint; time from the kill to the first training step
   again, split into detection (kill -> the watcher has recorded the loss), provisioning (-> the relaunch
   begins; nothing to make for a killed local node), restore (the nodes' own figure, from their log) and
   restart (the rest: workdir sync, torchrun start-up, rendezvous, up to the first step);
2. restore of a ``--mib`` (default 1024) MiB checkpoint from the store (``Store.restore``, what each node does
   before the script starts) vs ``gtrain sync`` of the same file from the same server (SeaweedFS, as
   bench_sync.py; ``--server moto`` for moto), ``--rounds`` times in alternating order (the first download
   of a round pays for a cold server cache); the ratio is of the medians (and of the best), target >= 0.8;
   the same for a sharded checkpoint (``--shards`` files of ``--shard-mib`` MiB, each below the multipart
   threshold, so each one stream: what matters there is how many files go at once).

    .venv/bin/python bench/bench_recovery.py [--mib 1024] [--rounds 3] [--shards 16 --shard-mib 16]
                                             [--server weed|moto] [--no-recovery]

Writes bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.services import free_port, stop, wait_http  # noqa: E402


def restore_vs_sync(work: Path, name: str, files: dict[str, int], rounds: int) -> dict[str, Any]:
    """Restore of checkpoint ``name`` (``files``: name -> MiB; a fresh Store, as a node's ``ckpt restore``
    makes one) vs `gtrain sync` down of the same bytes; ``rounds`` rounds, the order alternating."""
    import statistics

    import boto3

    from gtrain.checkpoints.store import Store
    from gtrain.sync.objstore import sync

    bucket = f"bench-restore-{name}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    src = work / f"src-{name}"
    (src / name).mkdir(parents=True)
    for fname, mib in files.items():
        with open(src / name / fname, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1024 * 1024))
    st = Store(f"s3://{bucket}/runs", "job")
    t0 = time.monotonic()
    st.upload(0, src, name, [f"{name}/{f}" for f in files])
    up_s = time.monotonic() - t0
    st.close()
    sync(str(src / name), f"s3://{bucket}/plain")

    def restore(dest: Path) -> None:
        store = Store(f"s3://{bucket}/runs", "job")
        try:
            store.restore(store.newest_complete(), dest)  # type: ignore[arg-type]
        finally:
            store.close()

    runs: dict[str, list[float]] = {"restore": [], "sync": []}
    for i in range(rounds):
        order = ["restore", "sync"] if i % 2 == 0 else ["sync", "restore"]
        for what in order:
            dest = work / f"{what}-{name}-{i}"
            t0 = time.monotonic()
            if what == "restore":
                restore(dest)
            else:
                sync(f"s3://{bucket}/plain", str(dest))
            runs[what].append(round(time.monotonic() - t0, 3))
            shutil.rmtree(dest)
    shutil.rmtree(src)
    mib = sum(files.values())
    med = {k: statistics.median(v) for k, v in runs.items()}
    best = {k: min(v) for k, v in runs.items()}
    ratio = med["sync"] / med["restore"]
    return {"checkpoint": name, "files": len(files), "mib": mib, "rounds": rounds, "upload_s": round(up_s, 3),
            "restore_s": runs["restore"], "sync_s": runs["sync"], "ratio_median": round(ratio, 3),
            "ratio_best": round(best["sync"] / best["restore"], 3), "target": 0.8, "ok": ratio >= 0.8,
            "restore_mib_s": round(mib / med["restore"], 1), "sync_mib_s": round(mib / med["sync"], 1)}


def start_moto(work: Path) -> tuple[Any, dict[str, str]]:
    port = free_port()
    log = work / "moto.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p",
                                 str(port)], stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/moto-api/data.json", proc, log)
    return proc, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                  "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def recovery(work: Path) -> dict[str, Any]:
    import boto3

    import gtrain
    from tests.integration.test_durable_local import kill_node_when_checkpointed, spec_file

    boto3.client("s3").create_bucket(Bucket="bench-recovery")
    store = "s3://bench-recovery/runs"
    os.environ.update({"GTRAIN_HOME": str(work / "home"), "GTRAIN_CHECKPOINT_POLL_S": "0.3",
                       "GTRAIN_WATCH_POLL_S": "1", "GTRAIN_IMDS_ENDPOINT": "", "GTRAIN_GCE_METADATA_ENDPOINT": "",
                       "OMP_NUM_THREADS": "1"})
    spec = spec_file(work, "benchrec", store, "durable_train.py 12 3 0.5")
    killer = kill_node_when_checkpointed(work / "home", "benchrec", store, "step-0003.pt")
    seen: list[tuple[float, str]] = []
    lock = threading.Lock()

    def on_line(line: Any) -> None:
        with lock:
            seen.append((time.time(), line.text))

    res = gtrain.run(spec, to=work / "out", on_line=on_line)
    killer.join(timeout=1)
    killed = float((work / "home" / "killed").read_text())
    rec = res.recoveries[0]
    first = next(t for t, text in seen if t > rec["ended_at"] - 60 and text.startswith("computed step")
                 and t > killed and any(x.startswith("attempt 2") for _t, x in seen if _t <= t))
    # each node prints its restore ("[gtrain] node K attempt 2: resume from '...' ({json})"): the slowest counts
    restore_s = max((float(json.loads(text[text.index("({") + 1:text.rindex(")")])["seconds"])
                     for _t, text in seen if "attempt 2: resume from" in text), default=0.0)
    detection = rec["detected_at"] - killed
    provisioning = rec["provision_s"]
    total = first - killed
    return {"status": res.status, "total_s": round(total, 3), "detection_s": round(detection, 3),
            "provisioning_s": round(provisioning, 3), "restore_s": round(restore_s, 3),
            "restart_s": round(total - detection - provisioning - restore_s, 3), "recovery": rec}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shards", type=int, default=16, help="also a checkpoint of this many files (0: not)")
    ap.add_argument("--shard-mib", type=int, default=16)
    ap.add_argument("--server", choices=["weed", "moto"], default="weed",
                    help="the S3 server of the restore-vs-sync part (the recovery part always uses moto)")
    ap.add_argument("--no-recovery", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-recovery-"))
    out: dict[str, Any] = {}
    try:
        if not args.no_recovery:
            moto, env = start_moto(work)
            os.environ.update(env)
            try:
                out["recovery"] = recovery(work)
            finally:
                stop(moto)
            print(json.dumps({k: v for k, v in out["recovery"].items() if k != "recovery"}), flush=True)
        if args.server == "moto":
            server, env = start_moto(work)
        else:
            from tests.fixtures.seaweedfs import start_weed

            weed = start_weed(work / "weed")
            server, env = weed.proc, weed.env()
        os.environ.update(env)
        try:
            out["restore"] = {"server": args.server,
                              **restore_vs_sync(work, "big.pt", {"big.pt": args.mib}, args.rounds)}
            print(json.dumps(out["restore"]), flush=True)
            if args.shards:  # a sharded checkpoint: many files under the multipart threshold, one stream each
                shards = {f"shard-{k:02d}.pt": args.shard_mib for k in range(args.shards)}
                out["restore_sharded"] = {"server": args.server,
                                          **restore_vs_sync(work, "step-sharded", shards, args.rounds)}
                print(json.dumps(out["restore_sharded"]), flush=True)
        finally:
            stop(server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = ROOT / "bench" / "results"
    res.mkdir(exist_ok=True)
    (res / "recovery.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
