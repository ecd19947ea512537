"""One Ray node's command line for gtrain's checkpoint tool (``gtrain.runs.ship``: the write probe at
launch, the collect and the archive of a recovery), reached through short Ray jobs over the Jobs REST API.

gtrain runs one such step on every node at once (a thread per node); the runners of one backend share an
:class:`ExecBatch`, which gathers the commands given at about the same time (every node's, or
``GATHER_S`` without a new one) into ONE Ray job: its entrypoint (:mod:`gtrain.providers.ray.nodeexec`, stdlib
only) writes each command's queued files, runs the commands side by side and prints each one's exit code and
output; the Ray job is deleted once read. A Ray job costs seconds to start (Ray starts its supervisor actor and
sets up its runtime_env), so a step costs one, whatever the number of nodes. A bare ``mkdir -p DIR`` (a
folder for the files that follow) is not a command of its own: the node's next command makes it first.

A Ray cluster offers no shell on its nodes: the Jobs API runs an entrypoint on the head node, so that is where
these commands run (on a cluster whose nodes share nothing with the head, the probe checks the store from the
head, and a recovery's collect finds nothing there: the relaunch restores the store's newest checkpoint, which
each node's uploader keeps current). The job's own nodes run the tool from ``launch.sh`` (restore, uploader,
final flush), inside the Ray actors.

Secrets: ``run(stdin=...)`` takes the job's ``NAME=value\\0`` records (``secret_stdin``). They travel as the job's
own do (:meth:`gtrain.providers.ray.backend.RayBackend._upload_secrets`): in a one-off package of the cluster's GCS
under a random name, which the entrypoint reads and deletes before it runs a command -- never in the Ray job's
runtime_env (the Jobs API shows it to anyone with the dashboard, during and after the job), its entrypoint, its
working_dir or gtrain's output. They reach the command on its stdin only, and the entrypoint masks them (every
form :mod:`gtrain.remote.nodemask` knows) in the commands' output before a byte of it is printed into the Ray
job's log. Commands whose secrets differ never share a job."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.errors import ProviderError, RemoteCommandError
from gtrain.remote.base import CommandResult

if TYPE_CHECKING:
    from gtrain.providers.ray.api import RayAPI

_MARK = "[gtrain-exec] "
_STAMP = (2020, 1, 1, 0, 0, 0)
#: how long a gathered step waits for the next node's command once the last one came (every node's: at once)
GATHER_S = 0.25


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


@dataclass
class _Command:
    k: int
    cmd: str
    files: dict[str, tuple[bytes, int]]
    secrets: dict[str, str]
    timeout: float | None
    done: threading.Event = field(default_factory=threading.Event)
    result: CommandResult | None = None
    error: BaseException | None = None


class ExecBatch:
    """The commands of one step, every node's, as one Ray job (shared by one backend's :class:`RayExec`)."""

    def __init__(self, api: RayAPI, cluster_id: str, python: str, env_vars: dict[str, str], nodes: int,
                 gather_s: float = GATHER_S) -> None:
        self.api, self.cluster_id, self.python, self.env_vars = api, cluster_id, python, env_vars
        self.nodes, self.gather_s = nodes, gather_s
        self.cv = threading.Condition()
        self.open: list[_Command] | None = None  # the step being gathered
        self.last = 0.0

    def run(self, c: _Command) -> CommandResult:
        with self.cv:
            batch = self.open
            if batch is not None and c.secrets == batch[0].secrets and all(o.k != c.k for o in batch):
                batch.append(c)
                self.last = time.monotonic()
                self.cv.notify_all()
                lead = False
            else:  # the first of a step (or one that cannot share the open one's job: it leads its own)
                batch = self.open = [c]
                self.last = time.monotonic()
                lead = True
            while lead and len(batch) < self.nodes and (left := self.last + self.gather_s - time.monotonic()) > 0:
                self.cv.wait(left)
            if lead and self.open is batch:
                self.open = None  # closed: a later command starts the next step
        if lead:
            try:
                self._submit(batch)
            except BaseException as e:  # noqa: BLE001 (every waiter hears it, then it is raised here)
                for o in batch:
                    if o.result is None and o.error is None:
                        o.error = e
            finally:
                for o in batch:
                    o.done.set()
        c.done.wait()
        if c.error is not None:
            raise c.error
        assert c.result is not None
        return c.result

    def _package(self, batch: list[_Command], secrets_uri: str | None = None) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            def put(name: str, data: bytes) -> None:
                z.writestr(zipfile.ZipInfo(f"_gtrain_exec/{name}", date_time=_STAMP), data)

            put("nodeexec.py", (Path(__file__).resolve().parent / "nodeexec.py").read_bytes())
            put("nodemask.py", (Path(__file__).resolve().parents[2] / "remote" / "nodemask.py").read_bytes())
            shipped: set[str] = set()
            commands = []
            for c in batch:
                listed = []
                for path, (data, mode) in sorted(c.files.items()):
                    name = hashlib.sha1(data).hexdigest()  # the same file for every node (the tool): shipped once
                    if name not in shipped:
                        put(f"files/{name}", data)
                        shipped.add(name)
                    listed.append([path, mode, name])
                commands.append({"node": c.k, "files": listed, "cmd": c.cmd, "timeout": c.timeout,
                                 "stdin": sorted(c.secrets)})
            put("exec.json", json.dumps({"commands": commands, "secrets_uri": secrets_uri}).encode())
        return buf.getvalue()

    def _submit(self, batch: list[_Command]) -> None:
        secrets = batch[0].secrets
        secrets_uri = None
        if secrets:  # read and deleted by the entrypoint; never the runtime_env, which the Jobs API shows
            records = b"".join(f"{n}={v}".encode() + b"\x00" for n, v in secrets.items())
            secrets_uri = self.api.upload_package(f"_ray_pkg_{uuid.uuid4().hex}.zip", records)
        data = self._package(batch, secrets_uri)
        uri = self.api.upload_package(f"_ray_pkg_{hashlib.sha1(data).hexdigest()[:32]}.zip", data)
        nodes = "-".join(str(c.k) for c in batch)
        sid = f"gtrain-exec-{self.cluster_id}-{nodes}-{uuid.uuid4().hex[:8]}"
        runtime_env: dict[str, Any] = {"working_dir": uri}
        if self.env_vars:
            runtime_env["env_vars"] = dict(self.env_vars)
        self.api.submit({"entrypoint": f"{self.python} _gtrain_exec/nodeexec.py", "submission_id": sid,
                         "runtime_env": runtime_env, "entrypoint_num_cpus": 0,
                         "metadata": {"gtrain_cluster": self.cluster_id, "gtrain_exec": nodes}})
        timeouts = [c.timeout or 3600 for c in batch]
        try:
            got = self._wait(sid, max(timeouts), f"ray node(s) {nodes}")
        finally:
            self.api.delete(sid)
        for i, c in enumerate(batch):
            if i not in got:
                raise ProviderError(f"ray: ray node {c.k}: Ray job {sid} ended without the command's result")
            c.result = got[i]

    def _wait(self, sid: str, timeout: float, label: str) -> dict[int, CommandResult]:
        deadline = time.monotonic() + timeout + 120  # the job's own start on top of the commands'
        delay = 0.1
        while True:
            rj = self.api.job(sid) or {}
            if rj.get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            if time.monotonic() > deadline:
                self.api.stop(sid)
                raise ProviderError(f"ray: {label}: the command did not end in time (Ray job {sid} "
                                    f"{rj.get('status')})")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        out: dict[int, CommandResult] = {}
        for line in self.api.logs(sid).splitlines():
            if line.startswith(_MARK):
                doc = json.loads(line[len(_MARK):])
                out[int(doc["i"])] = CommandResult(int(doc["rc"]), str(doc["stdout"]), str(doc["stderr"]))
        if not out:
            raise ProviderError(f"ray: {label}: Ray job {sid} ended {rj.get('status')} without running the command: "
                                f"{str(rj.get('message') or '')[-500:]}")
        return out


class RayExec:
    """Node ``k``'s folder ``root`` (``<ray.root>/<cluster id>/node-K``), reached through ``batch``'s Ray jobs."""

    python = "python3"

    def __init__(self, batch: ExecBatch, k: int, root: str) -> None:
        self.batch, self.k, self.root = batch, k, root
        self.api = batch.api
        self.label = f"ray node {k} (a Ray job on the head of {batch.api.address})"
        self.address = batch.api.address
        self.driver_python = batch.python
        self.pending: dict[str, tuple[bytes, int]] = {}
        self.before: list[str] = []  # `mkdir -p DIR` commands, run first by the node's next command

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
        if len(parts) == 3 and stdin is None:  # a folder for what follows: made by the node's next command
            self.before.append(cmd)
            return CommandResult(0, "", "")
        secrets = _records(stdin) if stdin else {}
        files, self.pending = self.pending, {}
        cmd = " && ".join([*self.before, cmd]) if self.before else cmd
        self.before = []
        res = self.batch.run(_Command(self.k, cmd, files, secrets, timeout))
        if check and res.rc != 0:
            raise RemoteCommandError(self.label, cmd[:200], res.rc, res.stderr[-2000:])
        return res

    def close(self) -> None:
        pass
