"""The node's interruption-notice watcher on Azure: a ``Preempt`` scheduled event for this VM (a real HTTP server
playing IMDS's /metadata/scheduledevents, shaped from
https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events) sends SIGUSR1 to the job's rank
processes; a Preempt for another VM, or a Freeze, sends nothing."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from gtrain.checkpoints.node import azure_notice, watch_notices

RANK = """
import signal, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGUSR1, lambda *a: out.write_text("checkpointed"))
print("ready", flush=True)
time.sleep(30)
"""


class AzureIMDS(http.server.BaseHTTPRequestHandler):
    events: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get("Metadata") != "true":  # IMDS refuses requests without the header
            self.send_response(400)
            self.end_headers()
            return
        if self.path.startswith("/metadata/scheduledevents?api-version="):
            body = json.dumps({"DocumentIncarnation": len(AzureIMDS.events), "Events": AzureIMDS.events}).encode()
        elif self.path.startswith("/metadata/instance/compute/name?"):
            body = b"c1-abc-0"
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def event(kind: str, resources: list[str]) -> dict[str, Any]:
    return {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventStatus": "Scheduled", "EventType": kind,
            "ResourceType": "VirtualMachine", "Resources": resources, "NotBefore": "Mon, 19 Sep 2026 18:29:47 GMT",
            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}


def test_azure_preempt_event_sends_sigusr1_to_ranks(tmp_path: Path) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AzureIMDS)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_port}"
    AzureIMDS.events = [event("Freeze", ["c1-abc-0"]), event("Preempt", ["c1-abc-1"])]
    assert azure_notice(base) is None  # a freeze, and another VM's eviction: not ours
    env = {**os.environ, "GTRAIN_JOB_ID": "job-az", "LOCAL_RANK": "0"}
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path / "r")], env=env, stdout=subprocess.PIPE)
    saved = {k: os.environ.get(k) for k in ("GTRAIN_IMDS_ENDPOINT", "GTRAIN_GCE_METADATA_ENDPOINT",
                                             "GTRAIN_AZURE_IMDS_ENDPOINT", "GTRAIN_NOTICE_POLL_S")}
    try:
        assert rank.stdout and rank.stdout.readline()
        os.environ.update({"GTRAIN_IMDS_ENDPOINT": "", "GTRAIN_GCE_METADATA_ENDPOINT": "",
                           "GTRAIN_AZURE_IMDS_ENDPOINT": base, "GTRAIN_NOTICE_POLL_S": "0.1"})
        stop = threading.Event()
        t = threading.Thread(target=watch_notices, args=("job-az", stop), daemon=True)
        t.start()
        time.sleep(0.5)
        assert not (tmp_path / "r").exists()
        AzureIMDS.events = [event("Preempt", ["c1-abc-0"])]
        t.join(timeout=10)
        deadline = time.time() + 5
        while not (tmp_path / "r").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "r").read_text() == "checkpointed"
        assert "Azure Spot eviction" in (azure_notice(base) or "")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        rank.kill()
        rank.communicate()
        srv.shutdown()
        srv.server_close()
