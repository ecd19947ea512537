"""One Ray node's command line for gtrain's checkpoint tool (``gtrain.checkpoints.ship``: the write probe at
launch, the collect and the archive of a recovery): each ``run`` is one short Ray job over the Jobs REST API
whose entrypoint (:mod:`gtrain.providers.ray.nodeexec`, stdlib only) writes the files ``write_file`` queued,
runs the command and prints its exit code and output; the Ray job is deleted once read. A bare ``mkdir -p DIR``
(a folder for the files that follow) is not a Ray job of its own: the next command's job makes it first.

A Ray cluster offers no shell on its nodes: the Jobs API runs an entrypoint on the head node, so that is where
these commands run (on a cluster whose nodes share nothing with the head, the probe checks the store from the
head, and a recovery's collect finds nothing there: the relaunch restores the store's newest checkpoint, which
each node's uploader keeps current). The job's own nodes run the tool from ``launch.sh`` (restore, uploader,
final flush), inside the Ray actors.

Secrets: ``run(stdin=...)`` takes the job's ``NAME=value\\0`` records (``secret_stdin``); the values go in the
Ray job's runtime_env ``env_vars`` under their own names, as the job's own do (never in argv, the package or
gtrain's output), and reach the command on its stdin only."""

from __future__ import annotations

import io
import json
import re
import shlex
import time
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ProviderError, RemoteCommandError
from gtrain.remote.base import CommandResult

if TYPE_CHECKING:
    from gtrain.providers.ray.api import RayAPI

_MARK = "[gtrain-exec] "
_STAMP = (2020, 1, 1, 0, 0, 0)


def _records(stdin: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for rec in stdin.split(b"\x00"):
        if not rec:
            continue
        name, sep, value = rec.decode("utf-8").partition("=")
        if not sep or not name.replace("_", "a").isalnum():
            raise ProviderError("ray: a command's stdin is not NAME=value records (only secrets travel so)")
        out[name] = value
    return out


class RayExec:
    """Node ``k``'s folder ``root`` (``<ray.root>/<cluster id>/node-K``), reached through short Ray jobs."""

    python = "python3"

    def __init__(self, api: RayAPI, cluster_id: str, k: int, root: str, python: str,
                 env_vars: dict[str, str]) -> None:
        self.api, self.cluster_id, self.k, self.root = api, cluster_id, k, root
        self.label = f"ray node {k} (a Ray job on the head of {api.address})"
        self.address = api.address
        self.driver_python = python
        self.env_vars = env_vars
        self.pending: dict[str, tuple[bytes, int]] = {}
        self.before: list[str] = []  # `mkdir -p DIR` commands, run first by the next command's Ray job

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        """Queued: written on the node by the next ``run``, before its command. A script rendered for the Ray
        nodes names their Python as a token the driver fills in: the entrypoint's here (a token left in would
        end the tool's ``set -e`` script at its first use)."""
        if remote_path.endswith(".sh"):  # and the nodes' addresses, known once placed: the tool talks to no peer
            data = re.sub(rb"__GTRAIN_RAY_IP_\d+__", b"127.0.0.1",
                          data.replace(b"__GTRAIN_RAY_PYTHON__", self.driver_python.encode()))
        self.pending[remote_path] = (data, mode)

    def run(self, cmd: str, *, stdin: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        parts = shlex.split(cmd) if cmd.startswith("mkdir -p ") else []
        if len(parts) == 3 and stdin is None:  # a folder for what follows: made by the next command's Ray job
            self.before.append(cmd)
            return CommandResult(0, "", "")
        secrets = _records(stdin) if stdin else {}
        files, self.pending = self.pending, {}
        cmd = " && ".join([*self.before, cmd]) if self.before else cmd
        self.before = []
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            def put(name: str, data: bytes) -> None:
                z.writestr(zipfile.ZipInfo(f"_gtrain_exec/{name}", date_time=_STAMP), data)

            put("nodeexec.py", (Path(__file__).resolve().parent / "nodeexec.py").read_bytes())
            listed = []
            for i, (path, (data, mode)) in enumerate(sorted(files.items())):
                put(f"files/{i}", data)
                listed.append([path, mode, str(i)])
            put("exec.json", json.dumps({"files": listed, "cmd": cmd, "timeout": timeout}).encode())
        import hashlib

        data = buf.getvalue()
        uri = self.api.upload_package(f"_ray_pkg_{hashlib.sha1(data).hexdigest()[:32]}.zip", data)
        sid = f"gtrain-exec-{self.cluster_id}-{self.k}-{uuid.uuid4().hex[:8]}"
        env = {**self.env_vars, **secrets}
        if secrets:
            env["GTRAIN_RAY_EXEC_STDIN"] = ",".join(secrets)
        runtime_env: dict[str, Any] = {"working_dir": uri}
        if env:
            runtime_env["env_vars"] = env
        self.api.submit({"entrypoint": f"{self.driver_python} _gtrain_exec/nodeexec.py", "submission_id": sid,
                         "runtime_env": runtime_env, "entrypoint_num_cpus": 0,
                         "metadata": {"gtrain_cluster": self.cluster_id, "gtrain_exec": str(self.k)}})
        try:
            res = self._wait(sid, timeout)
        finally:
            self.api.delete(sid)
        if check and res.rc != 0:
            raise RemoteCommandError(self.label, cmd[:200], res.rc, res.stderr[-2000:])
        return res

    def _wait(self, sid: str, timeout: float | None) -> CommandResult:
        deadline = time.monotonic() + (timeout or 3600) + 120  # the job's own start on top of the command's
        delay = 0.1
        while True:
            rj = self.api.job(sid) or {}
            if rj.get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            if time.monotonic() > deadline:
                self.api.stop(sid)
                raise ProviderError(f"ray: {self.label}: the command did not end in time (Ray job {sid} "
                                    f"{rj.get('status')})")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        for line in reversed(self.api.logs(sid).splitlines()):
            if line.startswith(_MARK):
                doc = json.loads(line[len(_MARK):])
                return CommandResult(int(doc["rc"]), str(doc["stdout"]), str(doc["stderr"]))
        raise ProviderError(f"ray: {self.label}: Ray job {sid} ended {rj.get('status')} without running the command: "
                            f"{str(rj.get('message') or '')[-500:]}")

    def close(self) -> None:
        pass
