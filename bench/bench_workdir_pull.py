"""Benchmark: the workdir pushed to each node vs one bundle the nodes pull (issue 38, item 2). Not a test.

    .venv/bin/python bench/bench_workdir_pull.py [--nodes 2,4,8] [--mb 50] [--store] [--uplink-mbit 200]

Real sshd hosts in network namespaces on one bridge (tests/fixtures/sshd.py), gtrain's own
``gtrain.jobs.workdir.ship_workdir`` as ``launch`` calls it. For each N and mode, a first send (empty nodes),
a second one (nothing changed) and a third after one line of one file changed ("edit"). "laptop up" is what
this machine sent into the cluster: the bridge's own ``tx_bytes`` (traffic the host stack sends onto the
bridge; node-to-node traffic is bridged and not counted), SSH control traffic included. With ``--store`` the
store is moto's S3 on the bridge address, so the nodes' downloads from it also leave this machine: its rows
give the store's egress apart ("store out"), and the bundle's upload to the store is on loopback, given from
gtrain's own count ("to store").

What is simulated: every host shares this machine's 2 cores and one kernel; the bridge has no bandwidth
limit unless ``--uplink-mbit`` shapes this machine's egress onto it (tc tbf on the bridge device: what the
host stack sends, so the laptop's uplink, and the store's egress with ``--store``, not node-to-node traffic).
Prints a table, writes bench/results/workdir_pull[-<N>mbit].json; exit 1 when a first pull from node 0 sent
more than 1.1 x the workdir (+1 MB) from this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gtrain.events import Reporter  # noqa: E402
from gtrain.jobs import workdir as wd  # noqa: E402
from gtrain.jobs.templating import NodeContext  # noqa: E402
from gtrain.remote import ssh  # noqa: E402
from gtrain.remote.fanout import parallel  # noqa: E402
from gtrain.remote.ssh.runner import SSHRunner  # noqa: E402
from gtrain.spec import Job  # noqa: E402
from gtrain.sync.workdir import list_workdir  # noqa: E402
from tests.fixtures.sshd import start_ssh_hosts  # noqa: E402


class _Warn(Reporter):
    """Warnings (a node pushed instead of pulling) printed; the rest silent."""

    def warn(self, msg: str) -> None:
        print(f"warning: {msg}", file=sys.stderr, flush=True)


def _cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _tx(bridge: str) -> int:
    return int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text())


def _ctx(i: int, n: int, r: SSHRunner) -> NodeContext:
    return NodeContext(job_id="bench", cluster="bench", node_rank=i, num_nodes=n, node_ips=[], node_addr=r.address,
                       master_addr=r.address, master_port=29500, nproc_per_node=1, job_dir=f"{r.root}/jobs/bench",
                       workdir=f"{r.root}/workdir", checkpoint_dir="ckpt", python=sys.executable, argv=[],
                       env=dict(os.environ.get("BENCH_NODE_ENV") and json.loads(os.environ["BENCH_NODE_ENV"]) or {}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--store", action="store_true")
    ap.add_argument("--uplink-mbit", type=int, default=0,
                    help="shape this machine's traffic into the cluster (the bridge's own egress: a laptop's "
                         "uplink; node-to-node traffic is bridged, not shaped)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.nodes.split(",")]
    home = Path(tempfile.mkdtemp(prefix="gtrain-bench-wd-"))
    os.environ["GTRAIN_HOME"] = str(home / "home")
    work = home / "work"
    (work / "data").mkdir(parents=True)
    for k in range(a.mb // 2):  # 2 MB files of random bytes: nothing compresses
        (work / "data" / f"shard-{k:03d}.bin").write_bytes(os.urandom(2_000_000))
    (work / "train.py").write_text("print('hi')\n")
    files = list_workdir(work)
    rows: list[dict[str, Any]] = []
    with start_ssh_hosts(max(sizes)) as hosts:
        assert hosts.bridge, "needs the netns hosts (root, iproute2)"
        if a.uplink_mbit:
            subprocess.run(["tc", "qdisc", "add", "dev", hosts.bridge, "root", "tbf", "rate", f"{a.uplink_mbit}mbit",
                            "burst", "256kb", "latency", "100ms"], check=True)
        store = ""
        srv = None
        if a.store:
            import boto3
            from moto.server import ThreadedMotoServer

            srv = ThreadedMotoServer(ip_address=f"{hosts.subnet}.1", port=0, verbose=False)
            srv.start()
            host, port = srv.get_host_and_port()
            env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                   "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
            os.environ.update(env)
            os.environ["BENCH_NODE_ENV"] = json.dumps(env)
            boto3.client("s3").create_bucket(Bucket="bench-wd")
            store = "s3://bench-wd/runs"
        runners = [SSHRunner(h.target(), root=f"/tmp/gtrain-bench-wd/{h.name}", address=h.address,
                             python=sys.executable, tofu=True) for h in hosts]
        modes = ["push", "node0"] + (["store"] if store else [])
        for n in sizes:
            for mode in modes:
                os.environ["GTRAIN_WORKDIR_PULL_MIN_NODES"] = "100000" if mode == "push" else "1"
                job = Job(run="train.py", workdir=str(work), checkpoint_store=store if mode == "store" else None)
                rs = runners[:n]
                parallel(lambda r: r.run(f"rm -rf {r.root} && mkdir -p {r.root}/workdir {r.root}/jobs/bench"), rs)
                if srv is not None:  # the store starts empty for each row
                    import boto3

                    s3 = boto3.client("s3")
                    for o in s3.list_objects_v2(Bucket="bench-wd").get("Contents", []):
                        s3.delete_object(Bucket="bench-wd", Key=o["Key"])
                ctxs = [_ctx(i, n, r) for i, r in enumerate(rs)]
                for attempt in ("first", "again", "edit"):
                    if attempt == "edit":  # one line of one file changed: a new bundle
                        with open(work / "train.py", "a") as f:
                            f.write(f"print({n}, {mode!r})\n")
                        files = list_workdir(work)
                    tx0, c0, t0 = _tx(hosts.bridge), _cpu(), time.monotonic()
                    res = wd.ship_workdir(job, rs, ctxs, list(range(n)), work, files, b"", _Warn())
                    wall, cpu, up = time.monotonic() - t0, _cpu() - c0, _tx(hosts.bridge) - tx0
                    assert res.mode == mode and not (res.pushed and mode != "push"), res
                    store_out = len(res.fetched) * res.bundle_bytes if mode == "store" else 0
                    row = {"nodes": n, "mode": mode, "send": attempt, "wall_s": round(wall, 2),
                           "laptop_cpu_s": round(cpu, 2), "laptop_up_mb": round((up - store_out) / 1e6, 1),
                           "to_store_mb": round(res.uploaded_bytes / 1e6, 1) if mode == "store" else 0.0,
                           "store_out_mb": round(store_out / 1e6, 1)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        for r in runners:
            r.close()
        if srv is not None:
            srv.stop()
    ssh.close_all()
    out = HERE / "results" / "workdir_pull.json"
    out.parent.mkdir(exist_ok=True)
    suffix = f"-{a.uplink_mbit}mbit" if a.uplink_mbit else ""
    out = out.with_name(f"workdir_pull{suffix}.json")
    out.write_text(json.dumps({"mb": a.mb, "files": len(files), "uplink_mbit": a.uplink_mbit, "rows": rows},
                              indent=1) + "\n")
    print("\n| N | mode | send | wall | laptop CPU | laptop up | to store | store out |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['mode']} | {r['send']} | {r['wall_s']} s | {r['laptop_cpu_s']} s | "
              f"{r['laptop_up_mb']} MB | {r['to_store_mb']} MB | {r['store_out_mb']} MB |")
    # the point of pulling: what leaves this machine is one bundle (+ SSH), whatever N
    bad = [r for r in rows if r["mode"] == "node0" and r["send"] == "first" and r["laptop_up_mb"] > 1.1 * a.mb + 1]
    if bad:
        print(f"FAILED: pulling sent more than one bundle from this machine: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
