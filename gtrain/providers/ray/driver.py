"""gtrain's driver of one Ray job: shipped in the job's working_dir as ``_gtrain/driver.py`` and run on the Ray
cluster as the job's entrypoint (``python _gtrain/driver.py``). It imports only the standard library, ``ray``
and gtrain's stdlib-only ``nodeside.py`` (shipped beside it), never gtrain itself.

1. reserves a placement group of one bundle per node (``STRICT_SPREAD``: each on a distinct Ray node), saying
   ``[gtrain] pending: ...`` with Ray's scheduling state while it waits, and failing after the pending timeout;
2. starts one actor per bundle; each copies the working_dir into ``<root>/node-K/workdir``, writes node K's
   rendered scripts (bundle 0's node IP as the master address) and starts ``launch.sh`` detached with the
   secrets on its stdin (read once from the one-off GCS package ``plan["secrets_uri"]`` gtrain uploaded, then
   deleted from the cluster: never in the job's runtime_env or entrypoint; every line the driver prints is masked
   by ``nodemask.py``, shipped beside it, as the nodes' log files are), and a watchdog that stops the node's part
   of the job if the actor dies;
3. polls the actors: every line of ``node.log`` and ``logs/rank-R.log`` printed as ``[gtrain-log K R] text``,
   each node's end as ``[gtrain] node-exit K STATE RC`` with ``[gtrain] rank-exit K R RC T`` per rank; a node
   whose part failed stops the others (fail-fast); an actor that died with its node ``[gtrain] node-lost K``;
4. on SIGTERM (``POST /api/jobs/{id}/stop``) stops every node's part and exits 130.

The exit code is the job's: the first rank (in time) that exited non-zero, 0, 75 for a lost node, 124 when the
placement group was not placed in time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
LOST_EXIT = 75
PENDING_EXIT = 124
TERMINAL = ("succeeded", "failed", "cancelled")
WATCH = ('while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; '
         'exec "$2" "$3" cancel "$4" 2 >/dev/null 2>&1')


MASK: list[Any] = []  # the pattern of the job's nodemask.Masker, once the secrets are read (no class of it:
#                        the actors get this module's functions by value)


def out(text: str) -> None:
    if MASK and MASK[0] is not None:
        text = MASK[0].sub(b"***", text.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")
    print(text, flush=True)


def say(msg: str) -> None:
    out(f"[gtrain] {msg}")


def take_secrets(uri: str | None) -> bytes:
    """The job's ``NAME=value\\0`` records from the one-off package gtrain uploaded, deleted once read."""
    if not uri:
        return b""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get

    data = _internal_kv_get(uri) or b""
    _internal_kv_del(uri)
    return bytes(data)


class NodePart:
    """Node K's part of the job, on the Ray node its bundle was placed on (made a Ray actor in :func:`main`)."""

    def __init__(self, k: int, plan: dict) -> None:
        self.k = k
        self.plan = plan
        self.src = os.getcwd()  # the working_dir as Ray unpacked it on this node
        self.base = f"{plan['root']}/node-{k}"
        self.job_dir = f"{self.base}/jobs/{plan['job_id']}"
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.procs: list[subprocess.Popen] = []
        sys.path.insert(0, os.path.join(self.src, "_gtrain"))
        import nodeside  # type: ignore[import-not-found]

        self.nodeside = nodeside

    def where(self) -> dict:
        import ray

        return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid()}

    def start(self, ips: list[str], secrets: bytes = b"") -> str:
        os.makedirs(self.base, exist_ok=True)
        if os.path.exists(f"{self.job_dir}/pid"):  # an earlier attempt's folder: kept beside the new one
            os.replace(self.job_dir, f"{self.job_dir}.attempt-{int(time.time() * 1000)}")
        os.makedirs(f"{self.job_dir}/logs", exist_ok=True)
        with open(f"{self.job_dir}/attempt", "w") as f:  # launch.sh's GTRAIN_ATTEMPT (1, 2, ... across recoveries)
            f.write(f"{self.plan.get('attempt', 1)}\n")
        shutil.copytree(self.src, f"{self.base}/workdir", dirs_exist_ok=True, symlinks=True,
                        ignore=shutil.ignore_patterns("_gtrain"))
        os.makedirs(f"{self.base}/workdir/{self.plan['checkpoint_dir']}", exist_ok=True)
        pyz = os.path.join(self.src, "_gtrain", "gtrain-ckpt.pyz")
        if os.path.exists(pyz):
            shutil.copyfile(pyz, f"{self.base}/gtrain-ckpt.pyz")
        tokens = {"__GTRAIN_RAY_PYTHON__": sys.executable}
        tokens.update({f"__GTRAIN_RAY_IP_{i}__": ip for i, ip in enumerate(ips)})
        scripts = os.path.join(self.src, "_gtrain", f"node-{self.k}")
        for top, _dirs, names in os.walk(scripts):
            for name in names:
                rel = os.path.relpath(os.path.join(top, name), scripts)
                with open(os.path.join(top, name)) as f:
                    text = f.read()
                for tok in sorted(tokens, key=len, reverse=True):
                    text = text.replace(tok, tokens[tok])
                os.makedirs(os.path.dirname(f"{self.job_dir}/{rel}"), exist_ok=True)
                with open(f"{self.job_dir}/{rel}", "w") as f:
                    f.write(text)
                os.chmod(f"{self.job_dir}/{rel}", 0o700)
        launch = subprocess.Popen(["bash", "-c", 'exec bash "$1/launch.sh" >"$1/node.log" 2>&1', "_", self.job_dir],
                                  stdin=subprocess.PIPE, start_new_session=True, cwd=self.base)
        assert launch.stdin is not None
        launch.stdin.write(secrets)
        launch.stdin.close()
        watch = subprocess.Popen(["bash", "-c", WATCH, "_", str(os.getpid()), sys.executable,
                                  os.path.join(self.src, "_gtrain", "nodeside.py"), self.job_dir],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        self.procs += [launch, watch]
        return self.job_dir

    def _files(self) -> list[tuple[str, str]]:
        out = [("-", f"{self.job_dir}/node.log")]
        try:
            names = sorted(os.listdir(f"{self.job_dir}/logs"))
        except FileNotFoundError:
            names = []
        out += [(n[5:-4], f"{self.job_dir}/logs/{n}") for n in names if n.startswith("rank-") and n.endswith(".log")]
        return out

    def poll(self) -> tuple[list[tuple[str, str]], dict]:
        """(new complete lines as (tag, text), the node's job state); at the end, the unfinished lines too."""
        for p in self.procs:
            p.poll()  # reap
        st = self.nodeside.job_state(self.job_dir)
        final = st.get("state") in TERMINAL
        lines: list[tuple[str, str]] = []
        for tag, path in self._files():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = f.read(4 << 20)
            except FileNotFoundError:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            buf = self.partial.pop(path, b"") + data
            parts = buf.split(b"\n")
            rest = parts.pop()
            if rest and not final:
                self.partial[path] = rest
            elif rest:
                parts.append(rest)
            lines += [(tag, p.decode("utf-8", "replace").rstrip("\r")) for p in parts]
        return lines, st

    def stop(self, grace: float) -> dict:
        return dict(self.nodeside.cancel(self.job_dir, str(grace)))


def _reason(pg: object) -> str:
    from ray.util.placement_group import placement_group_table

    try:
        t = placement_group_table(pg)
    except Exception as e:  # noqa: BLE001
        return f"placement group state unknown ({e})"
    stats = t.get("stats") or {}
    sched = stats.get("scheduling_state") or t.get("state") or "PENDING"
    why = {"INFEASIBLE": "no set of Ray nodes can ever hold these bundles",
           "NO_RESOURCES": "the nodes that could hold them are busy",
           "QUEUED": "queued behind other placement groups"}.get(str(sched), "waiting to be placed")
    return f"placement group {t.get('strategy')} of {len(t.get('bundles') or {})} bundle(s) " \
           f"{list((t.get('bundles') or {}).values())[:1]} per node is {sched}: {why}"


def main() -> int:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    with open(os.path.join(HERE, "plan.json")) as f:
        plan = json.load(f)
    stopping = {"now": False}

    def on_term(signum: int, frame: object) -> None:
        stopping["now"] = True

    # read what this folder holds before ray.init: Ray's agent may unpack the job's working_dir again under it
    # (seen: nodemask.py gone from the driver's folder right after ray.init on a 2-node job)
    import importlib.util

    spec = importlib.util.spec_from_file_location("gtrain_nodemask", os.path.join(HERE, "nodemask.py"))
    assert spec is not None and spec.loader is not None
    nodemask = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nodemask)
    ray.init(log_to_driver=False)
    secrets = take_secrets(plan.get("secrets_uri"))
    MASK.append(nodemask.Masker([r.partition(b"=")[2] for r in secrets.split(b"\0") if r]).pattern)
    # after ray.init, which sets its own SIGTERM handler (sys.exit): a stop must end every node's part first
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    n, bundle = int(plan["num_nodes"]), dict(plan["bundle"])
    pg = placement_group([dict(bundle) for _ in range(n)], strategy=plan["strategy"],
                         name=f"gtrain-{plan['submission_id']}")
    t0, said = time.time(), ""
    while not pg.wait(timeout_seconds=1):
        if stopping["now"]:
            remove_placement_group(pg)
            say("cancelled while pending")
            return 130
        why = _reason(pg)
        if why != said:
            say(f"pending: {why}")
            said = why
        if time.time() - t0 > float(plan["pending_timeout_s"]):
            remove_placement_group(pg)
            say(f"pending-timeout: not placed in {plan['pending_timeout_s']:g} s (ray.pending_timeout_s): {why}")
            return PENDING_EXIT
    opts: dict = {"num_cpus": bundle.get("CPU", 0), "max_concurrency": 4}
    res = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    if "GPU" in bundle:
        opts["num_gpus"] = bundle["GPU"]
    if res:
        opts["resources"] = res
    cls = ray.remote(NodePart)
    actors: list[Any] = [cls.options(**opts, name=f"gtrain-{plan['submission_id']}-node-{k}",
                          scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k))
              .remote(k, plan) for k in range(n)]
    where = ray.get([a.where.remote() for a in actors])
    for k, w in enumerate(where):
        say(f"placed node {k} on {w['ip']} (Ray node {w['node_id']})")
    ips = [w["ip"] for w in where]
    ray.get([a.start.remote(ips, secrets) for a in actors])
    say(f"started on {n} node(s), master {ips[0]}")
    states: dict[int, dict] = {}
    lost: list[int] = []
    stopped = False

    def stop_all(grace: float) -> None:
        refs = {k: actors[k].stop.remote(grace) for k in range(n) if k not in states and k not in lost}
        for k, ref in refs.items():
            try:
                ray.get(ref, timeout=grace + 30)
            except Exception as e:  # noqa: BLE001
                say(f"node {k}: could not stop ({type(e).__name__})")

    while len(states) + len(lost) < n:
        if stopping["now"] and not stopped:
            stopped = True
            stop_all(1)
        refs = {k: actors[k].poll.remote() for k in range(n) if k not in states and k not in lost}
        for k, ref in refs.items():
            try:
                lines, st = ray.get(ref, timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                lost.append(k)
                cause = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                say(f"node-lost {k}: the Ray node of bundle {k} ({ips[k]}) or its actor died: {cause}")
                continue
            for tag, text in lines:
                out(f"[gtrain-log {k} {tag}] {text}")
            if st.get("state") in TERMINAL:
                states[k] = st
                for r, (rc, t) in sorted(st.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
                    say(f"rank-exit {k} {r} {rc} {t}")
                say(f"node-exit {k} {st['state']} {st.get('exit_code')}")
        if not stopped and (lost or any(s["state"] != "succeeded" for s in states.values())) \
                and len(states) + len(lost) < n:
            stopped = True  # fail-fast: the others would wait in a collective
            say("stopping the other nodes' parts (fail-fast)")
            stop_all(5)
        time.sleep(0.3)
    remove_placement_group(pg)
    if stopping["now"]:
        say("cancelled")
        return 130
    if lost:
        return LOST_EXIT
    failed = sorted((t, rc) for s in states.values() for rc, t in s.get("ranks", {}).values() if rc)
    if failed:
        return int(failed[0][1])
    bad = [int(s.get("exit_code") or 1) for s in states.values() if s["state"] != "succeeded"]
    return bad[0] if bad else 0


if __name__ == "__main__":
    sys.exit(main())
