"""Helpers of the durable-run tests on sshd hosts (test_durable_aws.py, test_durable_ssh.py; their moto is
tests/fixtures/moto_bridge.py): the death of a node's processes as a killed or terminated machine would see it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gtrain.events import Reporter
from gtrain.jobs.backend import LogLine

JOBS = Path(__file__).parent / "jobs"
STEPS, EVERY = 12, 3
#: what the nodes need to reach the store (they inherit nothing of this process's environment)
NODE_ENV = {"OMP_NUM_THREADS": "1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}


def durable_spec(tmp_path: Path, name: str, endpoint: str, **sections: Any) -> tuple[Path, str]:
    """A 2-node spec of the deterministic durable job (a checkpoint every EVERY steps to a new bucket of
    moto at ``endpoint``) with the provider's ``sections``; the spec's path and the store's URL."""
    import boto3

    boto3.client("s3").create_bucket(Bucket=f"durable-{name}")
    store = f"s3://durable-{name}/runs"
    work = tmp_path / "work"
    work.mkdir()
    (work / "durable_train.py").write_text((JOBS / "durable_train.py").read_text())
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "num_nodes": 2, **sections,
        "job": {"workdir": str(work), "run": f"durable_train.py {STEPS} {EVERY} 0.6", "nproc_per_node": 1,
                "checkpoint_dir": "ckpt", "checkpoint_store": store, "python": sys.executable,
                "env": {**NODE_ENV, "AWS_ENDPOINT_URL": endpoint}},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0}},
    }))
    return spec, store


def pids_where(match: Callable[[bytes, bytes], bool]) -> list[int]:
    """Processes of this machine whose (NUL-framed environ, cmdline) match."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            env = b"\0" + Path(f"/proc/{d}/environ").read_bytes()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if match(env, cmd):
            out.append(int(d))
    return out


def of_node(job_id: str, rank: int) -> Callable[[bytes, bytes], bool]:
    """Every process of ``job_id`` on node ``rank`` (launcher, ranks, uploader)."""
    return lambda env, _cmd: (f"\0GTRAIN_JOB_ID={job_id}\0".encode() in env
                              and f"\0GTRAIN_NODE_RANK={rank}\0".encode() in env)


def kill9(pids: list[int]) -> int:
    """SIGKILL ``pids`` and their process groups (the node script's supervising shell exported the job's
    variables itself, so its own environ does not name the job): nothing of them is left to write an end."""
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    groups -= {0, 1, os.getpgid(0)}
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


class Notes(Reporter):
    """A Reporter that keeps what gtrain said, with the time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(f"{time.time():.1f} {msg}")

    def warn(self, msg: str) -> None:
        self.info(msg)


def run_key(spec: Path) -> str:
    """The run's folder in the checkpoint store (``<cluster>/<run_id>``), as gtrain derives it from the spec."""
    from gtrain.spec import load_spec
    from gtrain.spec.checkpoints import run_key as key

    s = load_spec(spec)
    assert s.job is not None
    return key(s.name, s.job.run_id, s.job.run, s.job.checkpoint_dir)


def when_in_store(store: str, job_id: str, name: str, action: Callable[[], None]) -> threading.Thread:
    """Run ``action`` (in a thread) once checkpoint ``name`` is complete in the store under ``job_id`` (the
    run's key: :func:`run_key`)."""
    from gtrain.checkpoints.store import Store

    def run() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            st = Store(store, job_id)
            try:
                if name in [c.name for c in st.checkpoints() if c.complete]:
                    action()
                    return
            finally:
                st.close()
            time.sleep(0.2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def check_resumed_same_weights(lines: list[LogLine], final_pt: Path) -> None:
    """Both nodes resumed attempt 2 from the same checkpoint, at most one checkpoint interval was computed
    twice, and the final weights (pulled from the store) equal an uninterrupted run's."""
    import torch

    from tests.integration.jobs.durable_train import reference

    starts = [x.text for x in lines if x.text.startswith("attempt 2 start")]
    assert len(starts) == 2 and len({s.split(" resume ")[0] for s in starts}) == 1, starts
    assert int(starts[0].split()[3]) >= EVERY, starts
    computed = [x.text for x in lines if x.text.startswith("computed step") and x.rank == 0]
    assert len(computed) - STEPS <= EVERY, computed
    got = torch.load(final_pt)
    assert got["step"] == STEPS and got["w"].tolist() == reference(STEPS, 2)


def node_files(homes: list[Path], cluster: str, job_id: str) -> str:
    """What each node's job folder says (state, the end of node.log, every attempt's), for a failure."""
    out = []
    for i, home in enumerate(homes):
        jd = home / "gtrain" / cluster / "jobs" / job_id
        for f in sorted([*jd.glob("state.json"), *jd.glob("attempt-*/state.json"), *jd.glob("node.log"),
                         *jd.glob("attempt-*/node.log"), *jd.glob("logs/rank-*.exit")]):
            try:
                text = f.read_text(errors="replace").splitlines()[-25:]
            except OSError as e:
                text = [str(e)]
            out += [f"--- host {i}: {f.relative_to(jd)}", *text]
    return "\n".join(out)


def why(lines: list[LogLine], notes: Notes, job: Any) -> str:
    """What a failed assertion shows: the job's last lines, what gtrain said, why it stopped recovering."""
    return "\n".join([*[x.text for x in lines][-30:], *notes.lines, str(job.info.get("recovery_stopped"))])
