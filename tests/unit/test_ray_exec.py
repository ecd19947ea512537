"""provider ray: one step of gtrain's checkpoint tool (every node's command, given at once from a thread per
node as gtrain.runs.ship does) is ONE Ray job; its entrypoint (the real nodeexec.py, run here as Ray
runs an entrypoint: in the unpacked working_dir, runtime_env env_vars in its environment) runs each node's
command with its files and its secrets on stdin, and each node gets its own result. The Jobs API is faked
at the wire (HTTP, from Ray's Jobs REST reference: package upload, submit, GET status, logs, DELETE), spoken to
by gtrain's own client; the entrypoint's one use of Ray's own API (reading and deleting the one-off secrets
package from the GCS's internal KV, ``ray.experimental.internal_kv``) meets a stub of those two calls that reads
the packages the fake stored;
the integration tests (test_ray.py) run the same steps on a real Ray cluster."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gtrain.errors import RemoteCommandError
from gtrain.providers.ray.api import RayAPI
from gtrain.providers.ray.execjob import ExecBatch, RayExec
from gtrain.remote.fanout import parallel


class Jobs:
    """Ray's Jobs REST API at the wire (a local HTTP server): ``GET``/``PUT /api/packages/gcs/<name>``, ``POST
    /api/jobs/`` (the job runs at its submit: entrypoint in its unpacked working_dir, env_vars in its
    environment), ``GET /api/jobs/{id}``, ``GET /api/jobs/{id}/logs``, ``DELETE /api/jobs/{id}``, shaped from
    https://docs.ray.io/en/latest/cluster/running-applications/job-submission/rest.html. gtrain's own client
    (``RayAPI``) talks to it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.packages: dict[str, bytes] = {}
        self.gcs = tmp / "gcs"
        self.gcs.mkdir()
        self.stub = tmp / "raystub"  # `ray` as the entrypoint imports it: init/shutdown, internal_kv get/del
        (self.stub / "ray" / "experimental").mkdir(parents=True)
        (self.stub / "ray" / "__init__.py").write_text("def init(**kw):\n    pass\n\n\ndef shutdown():\n    pass\n")
        (self.stub / "ray" / "experimental" / "__init__.py").write_text("")
        (self.stub / "ray" / "experimental" / "internal_kv.py").write_text(
            "import os, pathlib\nD = pathlib.Path(os.environ['FAKE_GCS'])\n\n\n"
            "def _internal_kv_get(k):\n    p = D / k[len('gcs://'):]\n"
            "    return p.read_bytes() if p.exists() else None\n"
            "\n\ndef _internal_kv_del(k):\n    (D / k[len('gcs://'):]).unlink(missing_ok=True)\n")
        self.bodies: list[dict[str, Any]] = []
        self.out: dict[str, str] = {}
        self.lock = threading.Lock()
        jobs = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: Any) -> None:
                pass

            def _send(self, code: int, doc: Any = None) -> None:
                data = json.dumps(doc).encode() if doc is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = urllib.parse.unquote(self.path)
                if path.startswith("/api/packages/gcs/"):
                    found = path.rsplit("/", 1)[1] in jobs.packages
                    return self._send(200 if found else 404, {"msg": "found" if found else "not found"})
                sid = path.removeprefix("/api/jobs/").removesuffix("/logs")
                if sid not in jobs.out:
                    return self._send(404, {"msg": f"job {sid} does not exist"})
                if path.endswith("/logs"):
                    return self._send(200, {"logs": jobs.out[sid]})
                return self._send(200, {"status": "SUCCEEDED", "submission_id": sid})

            def do_PUT(self) -> None:  # noqa: N802
                name = urllib.parse.unquote(self.path).rsplit("/", 1)[1]
                jobs.packages[name] = self._body()
                (jobs.gcs / name).write_bytes(jobs.packages[name])  # what the stub's internal KV reads
                self._send(200)

            def do_POST(self) -> None:  # noqa: N802
                self._send(200, {"submission_id": jobs.run(json.loads(self._body()))})

            def do_DELETE(self) -> None:  # noqa: N802
                sid = urllib.parse.unquote(self.path).removeprefix("/api/jobs/")
                self._send(200 if jobs.out.pop(sid, None) is not None else 404, {"deleted": True})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.api = RayAPI(f"http://127.0.0.1:{self.server.server_address[1]}")

    def run(self, body: dict[str, Any]) -> str:
        with self.lock:
            self.bodies.append(body)
        sid = body["submission_id"]
        wd = self.tmp / sid
        zipfile.ZipFile(io.BytesIO(self.packages[body["runtime_env"]["working_dir"][6:]])).extractall(wd)
        env = {**os.environ, **body["runtime_env"].get("env_vars", {}), "PYTHONPATH": str(self.stub),
               "FAKE_GCS": str(self.gcs)}
        res = subprocess.run([sys.executable, body["entrypoint"].split()[1]], cwd=wd, env=env, capture_output=True,
                             text=True, timeout=60)
        self.out[sid] = res.stdout + res.stderr
        return str(sid)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Jobs]:
    jobs = Jobs(tmp_path)
    yield jobs
    jobs.server.shutdown()
    jobs.server.server_close()


def runners(api: Jobs, tmp: Path, n: int = 3) -> list[RayExec]:
    batch = ExecBatch(api.api, "c1", sys.executable, {"FROM_SPEC": "x"}, n)
    return [RayExec(batch, k, str(tmp / f"node-{k}")) for k in range(n)]


def test_one_step_of_every_node_is_one_ray_job(api: Jobs, tmp_path: Path) -> None:
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
    # the command read the secret on its stdin; its output, which Ray keeps in the job's log, has it masked
    assert [g.stdout.strip() for g in got] == [f"node {k} TOKEN=***" for k in range(3)]
    assert all("s3cr3t" not in out for out in api.out.values())
    assert all((tmp_path / f"node-{k}" / "tool.pyz").read_bytes() == tool for k in range(3))
    body = api.bodies[0]
    pkg = zipfile.ZipFile(io.BytesIO(api.packages[body["runtime_env"]["working_dir"][len("gcs://"):]]))
    assert sum(1 for n in pkg.namelist() if n.startswith("_gtrain_exec/files/")) == 4  # the tool once
    # the secret is not in the Ray job's runtime_env (the Jobs API shows it), its entrypoint or working_dir: it
    # came in a one-off package that the entrypoint deleted once read
    assert "s3cr3t" not in json.dumps(body)
    assert body["runtime_env"]["env_vars"] == {"FROM_SPEC": "x"}
    secret_pkgs = [n for n, d in api.packages.items() if b"s3cr3t" in d]
    assert len(secret_pkgs) == 1 and not (api.gcs / secret_pkgs[0]).exists()


def test_a_lone_command_and_differing_secrets_and_a_failure(api: Jobs, tmp_path: Path) -> None:
    rs = runners(api, tmp_path)
    assert rs[0].run("echo alone").stdout == "alone\n" and len(api.bodies) == 1  # waits GATHER_S, then goes

    def step(k: int) -> Any:
        return rs[k].run("cat; exit 3" if k == 2 else "cat", stdin=f"TOKEN=v{k}\0".encode(), check=False)

    got = parallel(step, [0, 1, 2])
    assert len(api.bodies) == 4  # different secrets never share a Ray job
    assert [(g.rc, g.stdout) for g in got] == [(0, "TOKEN=v0\0"), (0, "TOKEN=v1\0"), (3, "TOKEN=v2\0")]
    with pytest.raises(RemoteCommandError):
        rs[1].run("exit 4")
