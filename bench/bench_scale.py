"""Scale bench (issue 38, items 1 and 6): gtrain's commands on N nodes against the plain-OpenSSH floor.

Real part: N real sshd hosts in network namespaces (tests/fixtures/sshd.py; each its own address, hostname,
home and sshd), the ssh provider, a one-line Python job (``launcher: python``, 1 process per node). For each N,
in the same run: the floor -- one plain ``ssh host python3 -c 'print(1)'`` per node, all at once -- then
``gtrain up``, ``launch --wait``, ``status``, ``logs``, ``down``, each a new process of the CLI: wall time,
this machine's CPU (the process and every child it reaped: rsync, ssh; from ``wait4``), its peak RSS, and the
SSH round trips it made (connections and sessions, from ``GTRAIN_SSH_STATS``; rsync's own ssh counted apart).

Simulated part (``--sim N``, e.g. 1000): N "nodes" that are addresses, not machines: ONE sshd in one network
namespace with N addresses on its interface (``10.79.X.Y``), each address a node; a ``Match LocalAddress``
block per address gives each its own ``HOME`` (so its own gtrain root). gtrain's client path is real: it
connects, authenticates, pins and checks a host key, runs the commands and (above the tree threshold) the
relays on each address as on a machine. What is simulated: the machines -- one kernel, one disk, one sshd,
this machine's 2 cores run every "node's" sshd sessions and job; so wall times there say more about that one
box than about a network of 1,000, and this machine's CPU and RSS (the laptop's cost) are the figures to read.

Results: ``bench/results/scale.json``; a markdown table on stdout (pasted into docs/scale.md).
Needs OpenSSH (sshd, ssh, ssh-agent); root and iproute2 for network namespaces (without them the real hosts are
sshd on 127.0.0.1 ports, as tests/fixtures/sshd.py falls back, and the simulated round is skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

JOB = "import os, socket\nprint('hello from node', os.environ.get('GTRAIN_NODE_RANK'), socket.gethostname())\n"
#: the running job: each rank becomes `sleep` (a simulated 1,000 nodes share one box's memory: a sleeping
#: Python per node would hold ~4 GB more; its launcher, launch.sh and the heartbeat sender stay as they are)
SLEEPER = "import os\nos.execvp('sleep', ['sleep', '900'])\n"
COMMANDS = ("up", "launch --wait", "status", "logs", "down")


def box_cpu() -> float:
    """CPU-seconds this whole machine has been busy (user, nice, system, irq, softirq, steal: /proc/stat): its
    delta over a command is the laptop's work plus every node's (sshd, shells, gtrain's node-side programs, the
    job), which on one box share its cores."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / os.sysconf("SC_CLK_TCK")


def _timed(argv: list[str], env: dict[str, str], stats: Path | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run argv; wall, CPU of it and its reaped children (wait4), peak RSS (MiB), its SSH counters, and the
    whole box's CPU over it (``box_cpu_s``: the nodes' share is that less ``cpu_s``)."""
    if stats is not None:
        stats.unlink(missing_ok=True)
    box0 = box_cpu()
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = b""
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    while chunk := p.stdout.read(1 << 16):
        out += chunk
        if time.monotonic() > deadline:
            p.kill()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {"rc": p.returncode, "wall_s": round(wall, 3), "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
                           "box_cpu_s": round(box_cpu() - box0, 2),
                           "peak_rss_mib": round(ru.ru_maxrss / 1024, 1)}
    if stats is not None and stats.exists():
        res["ssh"] = json.loads(stats.read_text())
    if p.returncode != 0:
        res["output_tail"] = out.decode(errors="replace")[-1500:]
    return res


def floor(hosts: list[tuple[str, int, str]], identity: str, known: Path) -> dict[str, Any]:
    """One ``ssh host python3 -c 'print(1)'`` per node, all at once (OpenSSH, no multiplexing)."""
    t0 = time.perf_counter()
    box0 = box_cpu()
    before = os.times()
    procs = [subprocess.Popen(["ssh", "-i", identity, "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
                               "-o", "StrictHostKeyChecking=yes", "-o", "ControlMaster=no", "-p", str(port),
                               "-l", user, addr, "python3 -c 'print(1)'"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
             for addr, port, user in hosts]
    ok = sum(1 for p in procs if p.communicate()[0].strip() == b"1")
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "box_cpu_s": round(box_cpu() - box0, 2), "ok": ok,
            "n": len(hosts)}


def _spec(tmp: Path, name: str, hosts: list[tuple[str, int, str]], identity: str, keys: dict[str, str],
          python: str, run: str = "hello.py") -> Path:
    work = tmp / f"work-{name}"
    work.mkdir(exist_ok=True)
    (work / "hello.py").write_text(JOB)
    (work / "sleeper.py").write_text(SLEEPER)
    section = {"user": hosts[0][2], "identity_file": identity, "python": python, "check_torch": False,
               "hosts": [f"{a}:{p}" for a, p, _u in hosts], "host_keys": keys}
    job = {"workdir": str(work), "run": run, "launcher": "python", "nproc_per_node": 1,
           "env": {"OMP_NUM_THREADS": "1"}}
    p = tmp / f"{name}{'' if run == 'hello.py' else '-' + Path(run).stem}.yaml"
    p.write_text(json.dumps({"name": name, "provider": "ssh", "num_nodes": len(hosts), "ssh": section, "job": job}))
    return p


def run_commands(tmp: Path, name: str, hosts: list[tuple[str, int, str]], identity: str, keys: dict[str, str],
                 python: str, env_extra: dict[str, str] | None = None, timeout: float = 1800,
                 sim: bool = False) -> dict[str, Any]:
    home = tmp / f"home-{name}"
    stats = tmp / f"stats-{name}.json"
    env = {**os.environ, "GTRAIN_HOME": str(home), "NO_COLOR": "1", "GTRAIN_SSH_STATS": str(stats),
           **(env_extra or {})}
    spec = _spec(tmp, name, hosts, identity, keys, python)
    gt = [sys.executable, "-m", "gtrain"]
    out: dict[str, Any] = {}
    argvs = {"up": [*gt, "up", str(spec), "--yes"], "launch --wait": [*gt, "launch", str(spec), "--wait"],
             "status": [*gt, "status", name], "logs": [*gt, "logs", name, "--tail", "1"],
             "down": [*gt, "down", name, "--yes"]}
    n = len(hosts)

    def timed(cmd: str, argv: list[str]) -> dict[str, Any]:
        out[cmd] = _timed(argv, env, stats, timeout)
        if "ssh" in out[cmd]:
            s = out[cmd]["ssh"]
            out[cmd]["per_node"] = {"connects": round(s["connects"] / n, 2), "sessions": round(s["channels"] / n, 2),
                                    "rsync_ssh": round(s.get("external", 0) / n, 2),
                                    "relayed": round(s.get("relayed", 0) / n, 2)}
        print(f"  N={n} {cmd}: {out[cmd]}", flush=True)
        return out[cmd]

    try:
        for cmd in COMMANDS:
            if cmd == "down":
                _running(tmp, name, hosts, identity, keys, python, env, timed, sim)
            timed(cmd, argvs[cmd])
            if cmd == "up":
                if out[cmd]["rc"] != 0:
                    break
                time.sleep(12)  # two beats: every host heard by node 0
                timed("status (no job)", argvs["status"])
    finally:
        if out.get("down", {}).get("rc") != 0:
            subprocess.run([*gt, "down", name, "--yes"], env=env, capture_output=True, check=False)
    return out


def _stop_pulses() -> int:
    """End every host's own beat (``python3 - pulse ...``) on this machine: the simulated nodes' memory is one
    box's, and 1,000 beats (~4.4 GB) beside 1,000 running jobs do not fit in 24 GiB. The job's `status` does not
    read them (it reads the job's own heartbeats)."""
    n = 0
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0") if d.name.isdigit() else []
        except OSError:
            continue
        if b"pulse" in argv and any(a.startswith(b"node:") for a in argv):
            try:
                os.kill(int(d.name), 15)
                n += 1
            except OSError:
                pass
    return n


def _running(tmp: Path, name: str, hosts: list[tuple[str, int, str]], identity: str, keys: dict[str, str],
             python: str, env: dict[str, str], timed: Any, sim: bool = False) -> None:
    """`status` while a job sleeps on every node: launched without --wait, measured once node 0 has heard every
    node's job heartbeat (read from node 0's JOB/nodes.json over one plain ssh), then cancelled. Simulated, the
    hosts' own beats are ended first (:func:`_stop_pulses`)."""
    gt = [sys.executable, "-m", "gtrain"]
    if sim:
        print(f"  N={len(hosts)}: ended {_stop_pulses()} host beat(s) to make room for the running job", flush=True)
    spec = _spec(tmp, name, hosts, identity, keys, python, run="sleeper.py")
    got = subprocess.run([*gt, "launch", str(spec)], env=env, capture_output=True, text=True, check=False)
    if got.returncode != 0:
        print(f"  sleeper launch failed: {got.stdout[-800:]} {got.stderr[-800:]}", flush=True)
        return
    addr, port, user = hosts[0]
    look = ("python3 -c 'import glob, json, os, sys\n"  # under $HOME: the simulated nodes' sessions start in /root
            "for p in glob.glob(os.path.join(os.environ[\"HOME\"], sys.argv[1])):\n  d = json.load(open(p))\n"
            "  print(sum(1 for v in d[\"nodes\"].values() if v.get(\"agent\") == \"alive\"))' "
            f"'gtrain/{name}/jobs/*/nodes.json'")
    deadline = time.monotonic() + 600
    heard = 0
    while time.monotonic() < deadline and heard < len(hosts):
        time.sleep(5)
        res = subprocess.run(["ssh", "-i", identity, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-p", str(port),
                              "-l", user, addr, look], capture_output=True, text=True, check=False)
        heard = max([int(x) for x in res.stdout.split()] or [0])
    print(f"  N={len(hosts)}: node 0 hears {heard} running node(s)", flush=True)
    timed("status (job running)", [*gt, "status", name])
    subprocess.run([*gt, "cancel", name], env=env, capture_output=True, check=False)


def netns_round(n: int, tmp: Path) -> dict[str, Any]:
    from tests.fixtures.sshd import SSHHosts

    hosts = SSHHosts(n)
    hosts.start()
    try:
        known = tmp / f"known-{n}"
        known.write_text("".join(f"[{h.address}]:{h.port} {h.host_key_line}\n" if h.port != 22
                                 else f"{h.address} {h.host_key_line}\n" for h in hosts))
        addrs = [(h.address, h.port, h.user) for h in hosts]
        keys = {f"{h.address}:{h.port}": h.host_key_line for h in hosts}
        fl = floor(addrs, hosts.identity_file, known)
        print(f"  N={n} floor: {fl}", flush=True)
        cmds = run_commands(tmp, f"scale{n}", addrs, hosts.identity_file, keys, "python3")
        fl2 = floor(addrs, hosts.identity_file, known)  # again after: the load may have moved
        print(f"  N={n} floor after: {fl2}", flush=True)
        return {"n": n, "mode": hosts.hosts[0].netns and "netns" or "loopback", "floor": fl, "floor_after": fl2,
                "commands": cmds}
    finally:
        hosts.close()


def sim_round(n: int, tmp: Path) -> dict[str, Any]:
    """N addresses on one sshd in one network namespace (see the module's docstring)."""
    ns, br_in, br_out = f"gtsim{os.getpid()}", f"gts{os.getpid()}a", f"gts{os.getpid()}b"
    d = tmp / "sim"
    d.mkdir()
    sshd_proc = None
    addrs = [f"10.79.{1 + i // 250}.{1 + i % 250}" for i in range(n)]
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", br_out, "type", "veth", "peer", "name", br_in], check=True)
        subprocess.run(["ip", "link", "set", br_in, "netns", ns], check=True)
        subprocess.run(["ip", "addr", "add", "10.79.0.254/16", "dev", br_out], check=True)
        subprocess.run(["ip", "link", "set", br_out, "up"], check=True)
        batch = "".join(f"addr add {a}/16 dev {br_in}\n" for a in addrs) + f"link set {br_in} up\nlink set lo up\n"
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input=batch.encode(), check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host")], check=True)
        shutil.copy(d / "id.pub", d / "authorized_keys")
        homes = d / "homes"
        homes.mkdir()
        cfg = (f"Port 22\nListenAddress 0.0.0.0\nHostKey {d / 'host'}\nPidFile none\n"
               f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
               "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
               "MaxSessions 1000\nMaxStartups 2000:30:4000\nAllowTcpForwarding yes\nAllowAgentForwarding yes\n"
               "Subsystem sftp internal-sftp\nLogLevel ERROR\n")
        for i, a in enumerate(addrs):
            (homes / f"n{i}").mkdir()
            cfg += f"Match LocalAddress {a}\n  SetEnv HOME={homes / f'n{i}'}\n"
        (d / "sshd_config").write_text(cfg)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        sshd_proc = subprocess.Popen(["ip", "netns", "exec", ns, sshd, "-D", "-f", str(d / "sshd_config"),
                                      "-E", str(d / "sshd.log")], stdin=subprocess.DEVNULL, start_new_session=True)
        time.sleep(1.0)
        user = os.environ.get("USER") or "root"
        hostkey = " ".join((d / "host.pub").read_text().split()[:2])
        known = d / "known"
        known.write_text("".join(f"{a} {hostkey}\n" for a in addrs))
        hosts = [(a, 22, user) for a in addrs]
        fl = floor(hosts, str(d / "id"), known)
        print(f"  sim N={n} floor: {fl}", flush=True)
        cmds = run_commands(tmp, f"sim{n}", hosts, str(d / "id"), {f"{a}:22": hostkey for a in addrs}, "python3",
                            sim=True)
        return {"n": n, "mode": "simulated: one sshd, N addresses in one netns, HOME per address", "floor": fl,
                "commands": cmds}
    finally:
        if sshd_proc is not None:
            os.killpg(sshd_proc.pid, 15)
            sshd_proc.wait()
        for p in Path("/proc").iterdir():  # what the "nodes" left running (detached jobs, beats): by their folder
            try:
                if p.name.isdigit() and os.readlink(p / "cwd").startswith(str(d)):
                    os.kill(int(p.name), 9)
            except OSError:
                pass
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", br_out], check=False, capture_output=True)


#: the table's columns, in the order the commands ran: COMMANDS, with `status` of the cluster with no job yet
#: (every host's own beat, gathered by node 0) and `status` while a job runs on every node (the job's heartbeats)
ORDER = ("up", "status (no job)", "launch --wait", "status", "logs", "status (job running)", "down")


def table(rounds: list[dict[str, Any]]) -> str:
    """Wall / this machine's CPU (the CLI and its children) / the whole box's CPU (laptop and every node) / peak
    RSS per command; then SSH connections, sessions and rsync's connections per node."""
    rows = ["| N | hosts | floor wall / CPU / box | " + " | ".join(f"`{c}`" for c in ORDER) + " |",
            "|---|---|---|" + "---|" * len(ORDER)]
    for r in rounds:
        cells = []
        for c in ORDER:
            m = r["commands"].get(c)
            cells.append("—" if m is None else
                         f"{m['wall_s']:.2f} s / {m['cpu_s']:.2f} s / {m.get('box_cpu_s', 0):.1f} s / "
                         f"{m['peak_rss_mib']:.0f} MiB" + ("" if m["rc"] == 0 else f" (exit {m['rc']})"))
        kind = "simulated" if "sim" in r["mode"] else r["mode"]
        f = r["floor"]
        rows.append(f"| {r['n']} | {kind} | {f['wall_s']:.2f} s / {f['cpu_s']:.2f} s / {f.get('box_cpu_s', 0):.1f} s | "
                    + " | ".join(cells) + " |")
    rows.append("")
    rows.append("| N | " + " | ".join(f"`{c}` connects / sessions / rsync per node" for c in ORDER) + " |")
    rows.append("|---|" + "---|" * len(ORDER))
    for r in rounds:
        cells = []
        for c in ORDER:
            pn = r["commands"].get(c, {}).get("per_node")
            cells.append("—" if pn is None else f"{pn['connects']} / {pn['sessions']} / {pn['rsync_ssh']}")
        rows.append(f"| {r['n']}{' (sim)' if 'sim' in r['mode'] else ''} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="2,8,48", help="netns host counts, comma-separated (up to 64)")
    ap.add_argument("--sim", type=int, default=0, help="simulated node count (e.g. 1000; 0: none)")
    ap.add_argument("--out", default=str(HERE / "results" / "scale.json"))
    args = ap.parse_args()
    if args.sim and (os.geteuid() != 0 or not shutil.which("ip")):
        print("bench_scale --sim needs root and iproute2 (network namespaces); skipping the simulated round",
              file=sys.stderr)
        args.sim = 0
    rounds: list[dict[str, Any]] = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gtrain-scale-") as t:
        tmp = Path(t)
        for n in [int(x) for x in args.nodes.split(",") if x.strip()]:
            rounds.append(netns_round(n, tmp))
        if args.sim:
            rounds.append(sim_round(args.sim, tmp))
    result = {"cpus": os.cpu_count(), "loadavg_before": load, "loadavg_after": os.getloadavg(),
              "tree_threshold": int(os.environ.get("GTRAIN_TREE_THRESHOLD", "64")), "rounds": rounds,
              "simulated": "rounds with mode 'simulated': one sshd serving N addresses in one network namespace, "
                           "HOME per address; the machines are not real, gtrain's client path is"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(rounds))
    print(f"load average before {load}, after {os.getloadavg()}; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
