"""Benchmark elastic runs (not a test; issue 37): node loss -> training again, before and after, on the local
provider, on ssh hosts (tests/fixtures/sshd.py) and on aws (moto + the sshd hosts playing the instances).

Each run is tests/integration/elastic_nodes.py's: 3 nodes, the FSDP2 + DCP trainer (one rank per node, CPU/gloo,
a checkpoint every 5 steps to moto's S3), node 2 lost once ``step-10`` is whole in the store (ssh and local: every
process of its part SIGKILLed; aws: its spot instance terminated with EC2's reason, its processes, relays and disk
gone). Whatever starts after the loss first "boots" for ``--boot`` seconds (default 20), as a replacement VM
would: the whole-job recovery waits for it, the elastic survivors do not.

- after  = ``num_nodes: {min: 2, max: 3}``: kill -> the first step the survivors print (at world size 2), and
           kill -> the first step at world size 3 again (node 2 rejoined);
- before = a plain ``num_nodes: 3``: kill -> the first step of attempt 2 (every node restarted).

Runs are interleaved (each round runs every configuration once). Medians, min and max are printed.

    .venv/bin/python bench/elastic_recovery.py [--runs 5] [--providers local,ssh,aws] [--modes before,after]
                                               [--boot 20] [--steps 60]

Writes bench/results/elastic_recovery.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.sshd import start_ssh_hosts  # noqa: E402

MODES = {"before": False, "after": True}


def once(work: Path, provider: str, mode: str, i: int, endpoint: str, hosts: list[Any], boot: float,
         steps: int) -> dict[str, Any]:
    from gtrain.remote import ssh as sshmod
    from tests.integration import elastic_nodes as en

    sshmod.close_all()
    tmp = work / f"{provider}-{mode}-{i}"
    tmp.mkdir()
    os.environ["GTRAIN_HOME"] = str(tmp / "home")
    name = f"b{provider[0]}{mode[0]}{i}"  # its own cluster name: its own folder in the store
    t0 = time.time()
    try:
        o = en.drive(tmp, provider, elastic=MODES[mode], endpoint=None if provider == "local" else endpoint,
                     hosts=hosts, name=name, boot=boot, steps=steps)
    except AssertionError as e:
        return {"provider": provider, "mode": mode, "run": i, "ok": False, "error": str(e)[-2000:]}
    t = en.timings(o)
    recs = o.job.info.get("recoveries") or []
    ok = o.job.status == "succeeded" and len(recs) == 1 and t["again_s"] is not None
    out = {"provider": provider, "mode": mode, "run": i, "ok": ok, "status": o.job.status, **t,
           "recovery_s": recs[0].get("seconds") if recs else None, "elastic": bool(recs and recs[0].get("elastic")),
           "wall_s": round(time.time() - t0, 1)}
    if not ok:  # what it is read from is kept: bench/results/elastic_recovery-<provider>-<mode>-<run>/
        out["why"] = o.why()[-3000:]
        keep = ROOT / "bench" / "results" / f"elastic_recovery-{provider}-{mode}-{i}"
        keep.mkdir(parents=True, exist_ok=True)
        for f in ("lines.txt", "notes.txt"):
            if (tmp / f).exists():
                shutil.copy(tmp / f, keep / f)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def stats(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "     -"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--providers", default="local,ssh,aws")
    ap.add_argument("--boot", type=float, default=20.0, help="seconds the replacement takes to come up")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--modes", default="before,after")
    args = ap.parse_args()
    providers = args.providers.split(",")
    os.environ.update({"GTRAIN_CHECKPOINT_POLL_S": "0.3", "GTRAIN_WATCH_POLL_S": "1", "GTRAIN_IMDS_ENDPOINT": "",
                       "GTRAIN_GCE_METADATA_ENDPOINT": "", "OMP_NUM_THREADS": "1", "NO_COLOR": "1",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    import pytest
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log

    from tests.integration.test_elastic_aws_grow import ec2_capacity

    work = Path(tempfile.mkdtemp(prefix="gtrain-bench-elastic-"))
    hosts = start_ssh_hosts(3)
    # one moto, in this process (aws runs act on its state), where the hosts and local nodes both reach it
    srv = ThreadedMotoServer(ip_address=f"{hosts.subnet}.1" if hosts.mode == "netns" else "127.0.0.1", port=0,
                             verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    endpoint = os.environ["AWS_ENDPOINT_URL"] = f"http://{host}:{port}"
    patch = pytest.MonkeyPatch()
    ec2_capacity(patch, {"n": 10**6})  # RunInstances makes MaxCount as EC2 does (moto alone makes MinCount)
    results: list[dict[str, Any]] = []
    started = time.time()
    try:
        for i in range(args.runs):
            for provider in providers:
                for mode in args.modes.split(","):
                    r = once(work, provider, mode, i, endpoint, list(hosts), args.boot, args.steps)
                    results.append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "why"}), flush=True)
                    table(results, providers, args.boot, started, out=False)  # the JSON so far
    finally:
        patch.undo()
        srv.stop()
        hosts.close()
        shutil.rmtree(work, ignore_errors=True)
    table(results, providers, args.boot, started)
    return 0 if all(r["ok"] for r in results) else 1


def table(results: list[dict[str, Any]], providers: list[str], boot: float, started: float, out: bool = True) -> None:
    """Print the medians (with ``out``) and write bench/results/elastic_recovery.json."""
    runs = max((r["run"] + 1 for r in results), default=0)
    if out:
        print(f"\n{runs} run(s) each, replacement boot {boot:.0f} s, {os.cpu_count()} CPU(s), "
              f"{time.time() - started:.0f} s in all; seconds after the kill, median (min-max)")
        print(f"{'provider':9} {'before: training again':>24} {'after: training again':>24} "
              f"{'after: world size 3':>24} {'after: world at first':>22}")
    summary: dict[str, Any] = {}
    for provider in providers:
        got = {m: [r for r in results if r["provider"] == provider and r["mode"] == m and r["ok"]] for m in MODES}
        before = [r["again_s"] for r in got["before"]]
        after = [r["again_s"] for r in got["after"]]
        full = [r["full_s"] for r in got["after"] if r["full_s"] is not None]
        worlds = sorted({r["again_world"] for r in got["after"]})
        summary[provider] = {"before_s": before, "after_s": after, "after_full_s": full, "after_worlds": worlds,
                             "failed": [r for r in results if r["provider"] == provider and not r["ok"]]}
        if out:
            print(f"{provider:9} {stats(before):>24} {stats(after):>24} {stats(full):>24} {str(worlds):>22}")
    res = ROOT / "bench" / "results"
    res.mkdir(exist_ok=True)
    (res / "elastic_recovery.json").write_text(json.dumps({"boot_s": boot, "runs": runs, "cpus": os.cpu_count(),
                                                           "summary": summary, "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
