"""`status` from heartbeats against `status` asking every node (issue 38, item 3; docs/scale.md, "Status from
heartbeats"): N real sshd hosts in network namespaces (tests/fixtures/sshd.py), the ssh provider, a 1-process
sleeping job on every node. For each N, one job is read twice: with the nodes' heartbeats (once node 0's
``nodes.json`` has heard every node), then with node 0's beat process killed (the job goes on; `status` finds
no live aggregator and asks every host, as before item 3, after one read of ``nodes.json``). Each time
``gtrain status NAME --json`` runs ``--repeat`` times as a new CLI process: its wall time, and its SSH
connections and sessions (``GTRAIN_SSH_STATS``). The medians and the ranges go to
``bench/results/status_beats.json`` and a markdown table to stdout. Needs root, iproute2 and OpenSSH (sshd).

    python bench/bench_status_beats.py --nodes 16,48 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

SLEEPER = "import time\ntime.sleep(900)\n"


def _gt(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def _status(env: dict[str, str], name: str, stats: Path) -> dict[str, Any]:
    stats.unlink(missing_ok=True)
    t0 = time.perf_counter()
    p = _gt(env, "status", name, "--json")
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"status failed: {p.stdout[-800:]}{p.stderr[-800:]}")
    doc = json.loads(p.stdout)
    row = doc[0] if isinstance(doc, list) else doc
    s = json.loads(stats.read_text()) if stats.exists() else {}
    return {"wall_s": wall, "connects": s.get("connects"), "sessions": s.get("channels"),
            "nodes": [n["status"] for n in row["nodes"]],
            "heard": sum(1 for n in row["nodes"] if (n.get("heartbeat") or {}).get("word") == "running"),
            "job": row["jobs"][-1]["status"] if row.get("jobs") else None}


def _measure(env: dict[str, str], name: str, n: int, beat: bool, repeat: int, stats: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while True:  # every node's job running; with beats, every node heard by node 0; without, none
        got = _status(env, name, stats)
        if got["job"] == "running" and got["heard"] == (n if beat else 0):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"N={n} beats={beat}: not settled after 180 s: {got}")
        time.sleep(1)
    runs = [_status(env, name, stats) for _ in range(repeat)]
    walls = [r["wall_s"] for r in runs]
    out = {"n": n, "beats": beat, "runs": repeat, "wall_median_s": round(statistics.median(walls), 3),
           "wall_min_s": round(min(walls), 3), "wall_max_s": round(max(walls), 3),
           "connects": sorted({r["connects"] for r in runs}), "sessions": sorted({r["sessions"] for r in runs}),
           "all_running": all(r["nodes"] == ["running"] * n for r in runs), "load_1m": round(os.getloadavg()[0], 1)}
    print(f"  N={n} beats={beat}: {out}", flush=True)
    return out


def round_n(n: int, tmp: Path, repeat: int) -> list[dict[str, Any]]:
    from tests.fixtures.sshd import SSHHosts

    hosts = SSHHosts(n)
    hosts.start()
    name = f"sb{n}"
    home = tmp / f"home-{n}"
    stats = tmp / f"stats-{n}.json"
    env = {**os.environ, "GTRAIN_HOME": str(home), "NO_COLOR": "1", "GTRAIN_SSH_STATS": str(stats)}
    try:
        work = tmp / f"work-{n}"
        work.mkdir()
        (work / "sleeper.py").write_text(SLEEPER)
        section = {"user": hosts[0].user, "identity_file": hosts.identity_file, "python": sys.executable,
                   "check_torch": False, "hosts": [f"{h.address}:{h.port}" for h in hosts],
                   "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts}}
        spec = tmp / f"{name}.yaml"
        spec.write_text(json.dumps({"name": name, "provider": "ssh", "num_nodes": n, "ssh": section, "job": {
            "workdir": str(work), "run": "sleeper.py", "launcher": "python", "nproc_per_node": 1}}))
        p = _gt(env, "up", str(spec), "--yes")
        if p.returncode != 0:
            raise SystemExit(f"up failed: {p.stdout[-800:]}{p.stderr[-800:]}")
        try:
            p = _gt(env, "launch", str(spec))
            if p.returncode != 0:
                raise SystemExit(f"launch failed: {p.stdout[-800:]}{p.stderr[-800:]}")
            rows = [_measure(env, name, n, True, repeat, stats)]
            # the path without heartbeats (as before item 3, plus one read of nodes.json that finds no live
            # aggregator): node 0's beat process killed, the job goes on
            doc = json.loads(_gt(env, "status", name, "--json").stdout)
            job = (doc[0] if isinstance(doc, list) else doc)["jobs"][-1]["id"]
            k = subprocess.run(hosts[0].in_host("sh", "-c", f"kill -KILL $(cat ~/gtrain/{name}/jobs/{job}/beat.pid)"),
                               capture_output=True, text=True, check=False)
            if k.returncode != 0:
                raise SystemExit(f"could not stop node 0's aggregator: {k.stderr}")
            rows.append(_measure(env, name, n, False, repeat, stats))
            return rows
        finally:
            _gt(env, "cancel", name)
            _gt(env, "down", name, "--yes")
    finally:
        hosts.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="16,48", help="netns host counts, comma-separated (up to 64)")
    ap.add_argument("--repeat", type=int, default=5, help="`status` runs per mode")
    ap.add_argument("--out", default=str(HERE / "results" / "status_beats.json"))
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gtrain-statusbeats-") as t:
        for n in (int(x) for x in a.nodes.split(",")):
            print(f"N={n}", flush=True)
            rows += round_n(n, Path(t), a.repeat)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    print("\n| N | heartbeats | `status` wall (median, min-max) | SSH connections / sessions |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {'on' if r['beats'] else 'off (node 0 aggregator killed)'} | {r['wall_median_s']:.2f} s "
              f"({r['wall_min_s']:.2f}-{r['wall_max_s']:.2f}) | {'/'.join(map(str, r['connects']))} / "
              f"{'/'.join(map(str, r['sessions']))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
