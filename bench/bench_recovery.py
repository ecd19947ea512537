"""Benchmark durable runs (not a test), on a local moto server:

1. recovery: a 2-node local job (tests/integration/jobs/durable_train.py) checkpointing to moto's S3; every
   process of node 1 is SIGKILLed after its first checkpoint; time from the kill to the first training step
   again, split into detection (kill -> the watcher has recorded the loss), provisioning (-> the relaunch
   begins; nothing to make for a killed local node), restore (the nodes' own figure, from their log) and
   restart (the rest: workdir sync, torchrun start-up, rendezvous, up to the first step);
2. restore of a ``--mib`` (default 1024) MiB checkpoint from the store (``Store.restore``, what each node does
   before the script starts) vs ``gtrain sync`` of the same file from the same server; target ratio >= 0.8.

    .venv/bin/python bench/bench_recovery.py [--mib 1024] [--no-recovery]

Writes bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_sync import start  # noqa: E402
from tests.services import free_port, stop  # noqa: E402


def restore_vs_sync(work: Path, mib: int) -> dict[str, Any]:
    import boto3

    from gtrain.checkpoints.store import Store
    from gtrain.sync.objstore import sync

    boto3.client("s3").create_bucket(Bucket="bench-restore")
    src = work / "src"
    src.mkdir()
    with open(src / "big.pt", "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1024 * 1024))
    st = Store("s3://bench-restore/runs", "job")
    t0 = time.monotonic()
    st.upload(0, src, "big.pt", ["big.pt"])
    up_s = time.monotonic() - t0
    sync(str(src), "s3://bench-restore/plain")
    t0 = time.monotonic()
    st.restore(st.newest_complete(), work / "restored")  # type: ignore[arg-type]
    restore_s = time.monotonic() - t0
    st.close()
    t0 = time.monotonic()
    sync("s3://bench-restore/plain", str(work / "synced"))
    sync_s = time.monotonic() - t0
    return {"mib": mib, "upload_s": round(up_s, 3), "restore_s": round(restore_s, 3), "sync_s": round(sync_s, 3),
            "ratio": round(sync_s / restore_s, 3), "target": 0.8, "ok": sync_s / restore_s >= 0.8}


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
    ap.add_argument("--no-recovery", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-recovery-"))
    port = free_port()
    moto = start([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                 f"http://127.0.0.1:{port}/moto-api/data.json", work / "moto.log")
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    out: dict[str, Any] = {}
    try:
        if not args.no_recovery:
            out["recovery"] = recovery(work)
            print(json.dumps({k: v for k, v in out["recovery"].items() if k != "recovery"}), flush=True)
        out["restore"] = restore_vs_sync(work, args.mib)
        print(json.dumps(out["restore"]), flush=True)
    finally:
        stop(moto)
        shutil.rmtree(work, ignore_errors=True)
    res = ROOT / "bench" / "results"
    res.mkdir(exist_ok=True)
    (res / "recovery.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
