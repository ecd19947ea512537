"""Elastic runs on sshd hosts and moto (issue 37), shared by test_elastic_ssh.py, test_elastic_aws.py and
bench/elastic_recovery.py: a 3-node run of the FSDP2 + DCP trainer (jobs/elastic_dcp_train.py), its store on
moto's S3, node 2 lost once ``step-10`` is whole in the store, as a dead machine loses it (every process of its
part SIGKILLed; on aws its instance terminated first, its connections and disk gone with it).

``elastic=True`` is ``num_nodes: {min: 2, max: 3}`` (the survivors keep training, node 2 rejoins);
``elastic=False`` is a plain ``num_nodes: 3`` (the whole-job recovery: every node restarted as attempt 2). Once
node 2 was lost, the setup of what starts next takes a while, as a new VM takes a while to boot (the local
provider and the ssh hosts have nothing to boot; in the whole-job recovery the whole job waits for it): ``boot``
seconds, or with ``boot=None`` until the survivors have done a step at world size 2 (at most a minute), so that
a test sees the shrink however loaded this machine is."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gtrain
from gtrain.jobs.backend import LogLine
from tests.integration import durable_nodes as dn

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY, SLEEP = 40, 5, 0.4
KILL_AFTER = "step-10"
LINE = re.compile(r"rank (\d+) (step|start) (\d+) world (\d+) agent (-?\d+) t ([\d.]+)")
RELAY = Path(__file__).parent / "node_relay.py"


@dataclass
class Step:
    """One line of the trainer: a step done (``start`` False) or a worker's start (True)."""

    node: int
    rank: int
    start: bool
    step: int
    world: int
    agent: int
    t: float


def steps(lines: list[LogLine]) -> list[Step]:
    return [Step(x.node, int(m[1]), m[2] == "start", int(m[3]), int(m[4]), int(m[5]), float(m[6]))
            for x in lines if (m := LINE.search(x.text))]


def spec(tmp_path: Path, name: str, endpoint: str | None, *, elastic: bool, setup: str, steps: int = STEPS,
         **sections: Any) -> tuple[Path, str]:
    """The run's spec (``sections``: the provider's) and its store's URL, on a new bucket of the moto at
    ``endpoint`` (None: the nodes inherit this process's environment, as local nodes do)."""
    import boto3

    boto3.client("s3").create_bucket(Bucket=f"elastic-{name}")
    store = f"s3://elastic-{name}/runs"
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "elastic_dcp_train.py", work / "elastic_dcp_train.py")
    env = {**dn.NODE_ENV, "AWS_ENDPOINT_URL": endpoint} if endpoint else {"OMP_NUM_THREADS": "1"}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({
        "name": name, "num_nodes": {"min": 2, "max": 3} if elastic else 3, **sections,
        "job": {"workdir": str(work), "run": f"elastic_dcp_train.py {steps} {EVERY} {SLEEP}", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "checkpoint_store": store, "python": sys.executable,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3}, "env": env,
                "setup": setup},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0}}}))
    return path, store


def ssh_section(hosts: list[Any]) -> dict[str, Any]:
    return {"provider": "ssh", "ssh": {
        "user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
        "hosts": [f"{h.address}:{h.port}" for h in hosts],
        "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts}}}


def aws_section(hosts: list[Any], relay_dir: Path) -> dict[str, Any]:
    return {"provider": "aws",
            "resources": {"accelerators": "T4:1", "region": "us-east-1", "disk_gb": 50, "use_spot": True},
            "aws": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
                    "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2}}


def instances(cid: str) -> dict[int, str]:
    """The running instances of cluster ``cid`` by rank."""
    from tests.integration.test_durable_aws import instances as all_of
    from tests.integration.test_durable_aws import rank_of

    return {rank_of(i): iid for iid, i in all_of(cid).items() if i["State"]["Name"] in ("pending", "running")}


@dataclass
class Outcome:
    job: Any  # the job record `gtrain.wait` returned
    lines: list[LogLine]
    notes: dn.Notes
    killed_at: float
    out: Path  # what `gtrain.pull` brought back
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> list[Step]:
        return steps(self.lines)

    def why(self) -> str:
        return dn.why(self.lines, self.notes, self.job)


def drive(tmp_path: Path, provider: str, *, elastic: bool, endpoint: str | None = None,
          hosts: list[Any] | None = None, name: str | None = None, boot: float | None = None,
          steps: int = STEPS) -> Outcome:
    """up, launch, lose node 2 once KILL_AFTER is in the store, wait for the end, pull, down."""
    name = name or f"e{provider[:3]}{'el' if elastic else 'fx'}"
    marker, shrunk = tmp_path / "node2-lost", tmp_path / "shrunk"
    booting = f"sleep {boot}" if boot is not None else \
        f"for _ in $(seq 600); do [ -e {shrunk} ] && break; sleep 0.1; done"
    relay_dir = tmp_path / "relay"
    if provider == "local":
        sections: dict[str, Any] = {"provider": "local"}
    elif provider == "ssh":
        assert hosts is not None
        sections = ssh_section(hosts)
    else:
        from tests.integration import node_relay

        assert hosts is not None
        node_relay.setup(relay_dir, hosts)
        sections = aws_section(hosts, relay_dir)
    path, store = spec(tmp_path, name, endpoint, elastic=elastic, setup=f"[ ! -e {marker} ] || {{ {booting}; }}",
                       steps=steps, **sections)
    notes = dn.Notes()
    res = gtrain.up(path, report=notes)
    assert res.created and res.cluster is not None, notes.lines
    extra: dict[str, Any] = {"cluster_id": res.cluster.id}
    lost: dict[str, float] = {}
    try:
        job = gtrain.launch(path, report=notes)

        def lose() -> None:
            if provider == "aws":
                extra["first"] = instances(res.cluster.id)
            lost["at"] = time.time()
            marker.write_text(repr(lost["at"]))
            if provider != "aws":
                lost["killed"] = dn.kill9(dn.pids_where(dn.of_node(job.job_id, 2)))
                return
            lose_instance(job.job_id, extra["first"][2], relay_dir, hosts or [], name)
            lost["killed"] = 1

        killer = dn.when_in_store(store, dn.run_key(path), KILL_AFTER, lose)
        lines: list[LogLine] = []

        def on_line(x: LogLine) -> None:
            lines.append(x)
            m = LINE.search(x.text)
            if m and m[2] == "step" and m[4] == "2" and "at" in lost and not shrunk.exists():
                shrunk.write_text(repr(time.time()))

        final = gtrain.wait(name, job_id=job.job_id, on_line=on_line, report=notes)
        killer.join(timeout=1)
        # what a failure is read from
        (tmp_path / "lines.txt").write_text("".join(f"{x.node} {x.rank} {x.text}\n" for x in lines))
        (tmp_path / "notes.txt").write_text("\n".join([*notes.lines, json.dumps(final.info, default=str)]))
        assert lost.get("killed"), ("node 2 was never lost", [x.text for x in lines][-30:], notes.lines)
        if provider == "aws":
            extra["now"] = instances(res.cluster.id)
        out = tmp_path / "out"
        if final.status == "succeeded":
            gtrain.pull(name, job_id=job.job_id, to=out)
    finally:
        gtrain.down(name, yes=True)
    return Outcome(final, lines, notes, lost["at"], out, extra)


def lose_instance(job_id: str, iid: str, relay_dir: Path, hosts: list[Any], cluster: str) -> None:
    """EC2 takes node 2's spot instance back: moto says so first, then its processes, its network (the relays
    to it) and its disk go."""
    from tests.integration import node_relay
    from tests.integration.test_durable_aws import spot_interrupt

    host = node_relay.host_of(relay_dir, iid, hosts)
    spot_interrupt(iid)
    node2 = dn.of_node(job_id, 2)
    dn.kill9(dn.pids_where(lambda env, cmd: node2(env, cmd)
                           or (b"node_relay.py" in cmd and iid.encode() + b"\0" in cmd)))
    if host.own_home:
        subprocess.run(host.in_host("sh", "-c", f"rm -rf ~/gtrain/{cluster}"), check=False)


def timings(o: Outcome) -> dict[str, Any]:
    """Node loss -> training again: the first step done after the first worker start after the loss (the
    survivors' at the smaller world size when elastic; attempt 2's otherwise), and -> training at world size 3
    again (elastic: the replacement's rejoin)."""
    seen = o.steps
    after = [s for s in seen if s.t > o.killed_at]
    first_start = min((s.t for s in after if s.start), default=None)
    again = [s for s in after if not s.start and first_start is not None and s.t > first_start]
    full = [s for s in again if s.world == 3]
    return {"again_s": round(again[0].t - o.killed_at, 2) if again else None,
            "again_world": again[0].world if again else None,
            "full_s": round(full[0].t - o.killed_at, 2) if full else None}
