"""provider ray: one step of gtrain's checkpoint tool (every node's command, given at once from a thread per
node as gtrain.checkpoints.ship does) is ONE Ray job; its entrypoint (the real nodeexec.py, run here as Ray
runs an entrypoint: in the unpacked working_dir, runtime_env env_vars in its environment) runs each node's
command with its files and its secrets on stdin, and each node gets its own result. The Jobs API calls are
recorded by a stand-in with the semantics of Ray's Jobs REST reference (submit, GET status, logs, DELETE);
the integration tests (test_ray.py) run the same steps on a real Ray cluster."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import RemoteCommandError
from gtrain.providers.ray.execjob import ExecBatch, RayExec
from gtrain.remote.fanout import parallel


class Jobs:
    """What gtrain asks of the Jobs API, with each job run at its submit (entrypoint in its working_dir)."""

    address = "http://head:8265"

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.packages: dict[str, bytes] = {}
        self.bodies: list[dict[str, Any]] = []
        self.out: dict[str, str] = {}
        self.lock = threading.Lock()

    def upload_package(self, name: str, data: bytes) -> str:
        self.packages[name] = data
        return f"gcs://{name}"

    def submit(self, body: dict[str, Any]) -> str:
        with self.lock:
            self.bodies.append(body)
        sid = body["submission_id"]
        wd = self.tmp / sid
        zipfile.ZipFile(io.BytesIO(self.packages[body["runtime_env"]["working_dir"][6:]])).extractall(wd)
        env = {**os.environ, **body["runtime_env"].get("env_vars", {})}
        res = subprocess.run([sys.executable, body["entrypoint"].split()[1]], cwd=wd, env=env, capture_output=True,
                             text=True, timeout=60)
        self.out[sid] = res.stdout + res.stderr
        return str(sid)

    def job(self, sid: str) -> dict[str, Any]:
        return {"status": "SUCCEEDED", "submission_id": sid}

    def logs(self, sid: str) -> str:
        return str(self.out[sid])

    def delete(self, sid: str) -> None:
        self.out.pop(sid, None)


def runners(api: Jobs, tmp: Path, n: int = 3) -> list[RayExec]:
    batch = ExecBatch(api, "c1", sys.executable, {"FROM_SPEC": "x"}, n)  # type: ignore[arg-type]
    return [RayExec(batch, k, str(tmp / f"node-{k}")) for k in range(n)]


def test_one_step_of_every_node_is_one_ray_job(tmp_path: Path) -> None:
    api = Jobs(tmp_path)
    rs = runners(api, tmp_path)
    tool = b"the same bundle for every node" * 1000

    def step(k: int) -> Any:
        r = rs[k]
        r.run(f"mkdir -p {r.root}/job")  # a folder for what follows: no job of its own
        r.write_file(f"{r.root}/tool.pyz", tool, 0o600)
        r.write_file(f"{r.root}/job/ckpt.sh", f"echo node {k} $(cat)\n".encode(), 0o700)
        return r.run(f"bash {r.root}/job/ckpt.sh", stdin=b"TOKEN=s3cr3t\0")

    got = parallel(step, [0, 1, 2])
    assert len(api.bodies) == 1 and api.bodies[0]["metadata"]["gtrain_exec"] == "0-1-2"
    assert [g.stdout.strip() for g in got] == [f"node {k} TOKEN=s3cr3t" for k in range(3)]
    assert all((tmp_path / f"node-{k}" / "tool.pyz").read_bytes() == tool for k in range(3))
    pkg = zipfile.ZipFile(io.BytesIO(next(iter(api.packages.values()))))
    assert sum(1 for n in pkg.namelist() if n.startswith("_gtrain_exec/files/")) == 4  # the tool once
    body = api.bodies[0]
    assert "s3cr3t" not in body["entrypoint"] and all(b"s3cr3t" not in d for d in api.packages.values())
    assert body["runtime_env"]["env_vars"] == {"FROM_SPEC": "x", "TOKEN": "s3cr3t"}


def test_a_lone_command_and_differing_secrets_and_a_failure(tmp_path: Path) -> None:
    api = Jobs(tmp_path)
    rs = runners(api, tmp_path)
    assert rs[0].run("echo alone").stdout == "alone\n" and len(api.bodies) == 1  # waits GATHER_S, then goes

    def step(k: int) -> Any:
        return rs[k].run("cat; exit 3" if k == 2 else "cat", stdin=f"TOKEN=v{k}\0".encode(), check=False)

    got = parallel(step, [0, 1, 2])
    assert len(api.bodies) == 4  # different secrets never share a Ray job
    assert [(g.rc, g.stdout) for g in got] == [(0, "TOKEN=v0\0"), (0, "TOKEN=v1\0"), (3, "TOKEN=v2\0")]
    with pytest.raises(RemoteCommandError):
        rs[1].run("exit 4")
