"""The Ray Jobs REST API and the dashboard's state API over the standard library's HTTP client (no ``ray``
package on the gtrain side), and their errors as gtrain's.

Endpoints used (Ray's "Ray Jobs REST API" reference, https://docs.ray.io/en/latest/cluster/running-applications/
job-submission/rest.html, and the state API behind ``ray list nodes/actors``,
https://docs.ray.io/en/latest/ray-observability/reference/api.html): ``GET /api/version``,
``GET /api/v0/nodes``, ``GET /api/v0/actors``, ``PUT /api/packages/gcs/<name>.zip`` (the upload
``JobSubmissionClient`` does for a local ``working_dir``), ``POST /api/jobs/``, ``GET /api/jobs/{id}``,
``GET /api/jobs/{id}/logs``, ``GET /api/jobs/{id}/logs/tail`` (a WebSocket: the log from its start, then each
new chunk, closed when the job ends; what ``ray job logs -f`` / ``JobSubmissionClient.tail_job_logs`` read,
https://docs.ray.io/en/latest/cluster/running-applications/job-submission/sdk.html), ``GET /api/jobs/``,
``POST /api/jobs/{id}/stop``, ``DELETE /api/jobs/{id}``."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from gtrain.errors import ConfigError, ProviderError

#: the oldest Ray whose Jobs REST API and state API gtrain uses as documented
MIN_VERSION = (2, 9)
TIMEOUT_S = 15.0
#: how long a call waits for the head's job agent (Ray: "No available agent to submit job, please try again later")
AGENT_WAIT_S = 90.0
#: how long a node's watchdog takes at most to end what its dead actor left (see driver.WATCH)
WATCHDOG_S = 5.0


class NotFound(ProviderError):
    pass


class RayAPI:
    """One Ray cluster's dashboard (``http://head:8265``)."""

    def __init__(self, address: str, timeout: float = TIMEOUT_S) -> None:
        self.address = address.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                doing: str = "") -> Any:
        """One call; while the head's job agent is not up yet (a head just started: Ray answers HTTP 500 "No
        available agent to submit job, please try again later"), tried again for up to AGENT_WAIT_S."""
        deadline = time.monotonic() + AGENT_WAIT_S
        while True:
            try:
                return self._request(method, path, body, raw=raw, doing=doing)
            except ProviderError as e:
                if "No available agent" not in e.message or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def _request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                 doing: str = "") -> Any:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.address + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
        doing = doing or f"{method} {path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (http(s) checked)
                text = resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[-2000:].strip()
            if e.code == 404:
                raise NotFound(f"ray: {doing}: not found ({detail or 404})") from None
            if e.code in (400, 422):
                raise ConfigError(f"ray: {doing}: the Ray cluster refused the request: {detail}",
                                  hint="check ray.runtime_env and the job section", field="ray.runtime_env") from None
            raise ProviderError(f"ray: {doing}: HTTP {e.code} from {self.address}: {detail[-500:]}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            why = getattr(e, "reason", None) or e
            raise ProviderError(f"ray: {doing}: the Ray dashboard at {self.address} does not answer ({why})",
                                hint="is the cluster up and ray.address (or RAY_ADDRESS) its dashboard "
                                     "(`ray start --head` serves it on port 8265)?") from None
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    # ---- cluster ---------------------------------------------------------------------------------

    def version(self) -> str:
        doc = self.request("GET", "/api/version", doing="ask the Ray version")
        if not isinstance(doc, dict) or "ray_version" not in doc:
            raise ProviderError(f"ray: {self.address} answers, but not as a Ray dashboard (no /api/version)",
                                hint="ray.address is the dashboard (port 8265 by default), not the GCS port")
        return str(doc["ray_version"])

    def nodes(self) -> list[dict[str, Any]]:
        doc = self.request("GET", "/api/v0/nodes?detail=1&limit=10000", doing="list the Ray nodes")
        return list(((doc or {}).get("data") or {}).get("result", {}).get("result") or [])

    def actors(self, job_hex: str | None = None) -> list[dict[str, Any]]:
        q = "/api/v0/actors?detail=1&limit=10000"
        if job_hex:
            q += "&filter_keys=job_id&filter_predicates=%3D&filter_values=" + urllib.parse.quote(job_hex)
        doc = self.request("GET", q, doing="list the Ray actors")
        return list(((doc or {}).get("data") or {}).get("result", {}).get("result") or [])

    # ---- jobs ------------------------------------------------------------------------------------

    def upload_package(self, name: str, data: bytes) -> str:
        """Upload a working_dir zip as ``gcs://name`` (what ``JobSubmissionClient`` does) unless it is there."""
        path = f"/api/packages/gcs/{urllib.parse.quote(name)}"
        try:
            self.request("GET", path, doing="look up the workdir package")
            return f"gcs://{name}"
        except NotFound:
            pass
        self.request("PUT", path, raw=data, doing=f"upload the workdir ({len(data) // 1024} KiB)")
        return f"gcs://{name}"

    def submit(self, body: dict[str, Any]) -> str:
        doc = self.request("POST", "/api/jobs/", body, doing=f"submit job {body.get('submission_id')}")
        return str((doc or {}).get("submission_id") or body.get("submission_id"))

    def job(self, submission_id: str) -> dict[str, Any] | None:
        try:
            return dict(self.request("GET", f"/api/jobs/{urllib.parse.quote(submission_id)}",
                                     doing=f"get job {submission_id}"))
        except NotFound:
            return None

    def jobs(self) -> list[dict[str, Any]]:
        doc = self.request("GET", "/api/jobs/", doing="list the Ray jobs")
        return list(doc or [])

    def logs(self, submission_id: str) -> str:
        try:
            doc = self.request("GET", f"/api/jobs/{urllib.parse.quote(submission_id)}/logs",
                               doing=f"read the logs of job {submission_id}")
        except NotFound:
            return ""
        return str((doc or {}).get("logs") or "")

    def delete(self, submission_id: str) -> None:
        """Forget an ended job (its record, runtime_env included, and its log)."""
        try:
            self.request("DELETE", f"/api/jobs/{urllib.parse.quote(submission_id)}",
                         doing=f"delete job {submission_id}")
        except (NotFound, ProviderError):
            pass

    def tail(self, submission_id: str, idle_s: float = 1.0) -> Iterator[str | None]:
        """The job's log over the Jobs API's WebSocket stream: each text chunk as it comes (the log from its
        start), None after ``idle_s`` without one (the caller looks at the job then); ends when Ray closes the
        stream (the job ended). ProviderError when the stream cannot be opened."""
        u = urllib.parse.urlsplit(self.address)
        path = f"{u.path.rstrip('/')}/api/jobs/{urllib.parse.quote(submission_id)}/logs/tail"
        try:
            sock = socket.create_connection((u.hostname or "", u.port or (443 if u.scheme == "https" else 80)),
                                            timeout=self.timeout)
            if u.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=u.hostname)
            key = base64.b64encode(os.urandom(16)).decode()
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
            f = sock.makefile("rb")
            status = f.readline().decode("latin-1")
            headers = {}
            while (line := f.readline().decode("latin-1").strip()):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        except OSError as e:
            raise ProviderError(f"ray: follow the log of job {submission_id}: {self.address} does not answer ({e})"
                                ) from None
        want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        if " 101 " not in status or headers.get("sec-websocket-accept") != want.decode():
            sock.close()
            raise ProviderError(f"ray: follow the log of job {submission_id}: no log stream ({status.strip()})")
        sock.settimeout(None)
        chunks: queue.Queue[str | None] = queue.Queue()

        def read() -> None:  # RFC 6455 frames from the server (unmasked); a ping is answered, close ends it
            try:
                while True:
                    b1, b2 = f.read(2)
                    n = b2 & 0x7F
                    if n >= 126:
                        n = int.from_bytes(f.read(2 if n == 126 else 8), "big")
                    data = f.read(n)
                    op = b1 & 0x0F
                    if op in (0, 1, 2):
                        chunks.put(data.decode("utf-8", "replace"))
                    elif op == 9:  # ping -> pong, masked as a client's frames must be
                        mask = os.urandom(4)
                        sock.sendall(bytes([0x8A, 0x80 | len(data)]) + mask
                                     + bytes(c ^ mask[i % 4] for i, c in enumerate(data)))
                    elif op == 8:
                        return
            except (OSError, ValueError):
                return
            finally:
                chunks.put(None)  # the stream is over

        threading.Thread(target=read, daemon=True, name=f"ray-tail-{submission_id}").start()
        return self._chunks(chunks, sock, idle_s)

    @staticmethod
    def _chunks(chunks: queue.Queue[str | None], sock: socket.socket, idle_s: float) -> Iterator[str | None]:
        try:
            while True:
                try:
                    chunk = chunks.get(timeout=idle_s)
                except queue.Empty:
                    yield None
                    continue
                if chunk is None:
                    return
                yield chunk
        finally:
            sock.close()

    def stop(self, submission_id: str) -> bool:
        try:
            doc = self.request("POST", f"/api/jobs/{urllib.parse.quote(submission_id)}/stop",
                               doing=f"stop job {submission_id}")
        except NotFound:
            return False
        return bool((doc or {}).get("stopped"))


def version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def check_version(v: str, address: str) -> None:
    if version_tuple(v)[:2] < MIN_VERSION:
        raise ProviderError(f"ray: the cluster at {address} runs Ray {v}; gtrain needs Ray "
                            f"{'.'.join(map(str, MIN_VERSION))} or newer (its Jobs REST and state APIs)",
                            hint="upgrade the cluster's Ray, or use another provider")


def stop_job(api: RayAPI, sid: str, grace_s: float = 10) -> None:
    """Stop one Ray job and wait until it is over and none of its actors is alive (each actor's watchdog
    ends what the node's part left when the actor dies)."""
    rj = api.job(sid)
    if rj is None:
        return
    if rj.get("status") not in ("STOPPED", "SUCCEEDED", "FAILED"):
        api.stop(sid)
    deadline = time.monotonic() + grace_s + 60
    while time.monotonic() < deadline:
        rj = api.job(sid) or {}
        if rj.get("status") in ("STOPPED", "SUCCEEDED", "FAILED"):
            break
        time.sleep(0.3)
    hex_id = rj.get("job_id")
    while hex_id and time.monotonic() < deadline:
        live = [a for a in api.actors(str(hex_id)) if a.get("state") not in ("DEAD",)]
        if not live:
            break
        time.sleep(0.3)
    if rj.get("status") == "STOPPED" and "[gtrain] cancelled" not in api.logs(sid):
        # the driver was killed before it stopped the nodes' parts: each actor's watchdog does (poll 0.5 s,
        # SIGTERM, 2 s grace, SIGKILL)
        time.sleep(WATCHDOG_S)
